"""The secrets `intentroute deploy init` writes for compose and Kubernetes, on a real
nats-server: every node config parses (nats-server -t, the auth part included), the
admin declares the streams with `intentroute deploy streams`, each worker connects as
its own user from its credential file and finds them, and an agent added in Postgres
reaches NATS through `intentroute deploy nats-auth` and the two reloads it asks for.
The dashboard's token is a file of its own (GATEWAY_DASHBOARD_TOKEN_FILE) holding
gateway.env's value."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.errors import NoServersError
from typer.testing import CliRunner

from intentroute.cli import app
from intentroute.deploy.probe import probe
from intentroute.deploy.secrets import init_secrets
from intentroute.stack.nats_users import RunningServer, reload_confirmed, service_env
from intentroute.stack.natsserver import NatsServer, nats_server_binary
from intentroute.stack.postgres import PostgresServer
from intentroute.stack.procs import free_port
from intentroute.workers import WORKERS
from services.doors.dashboard.settings import DashboardSettings
from shared.contracts.request import request_subject
from shared.runtime.streams import require_streams
from shared.store.agents import AgentStore
from tests.helpers.databases import fresh_database

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_secrets(tmp_path_factory.mktemp("deploy") / "secrets").root


@pytest.fixture(scope="module")
def server(secrets_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    # A server on loopback with the deployment's users (its auth part and hashes).
    files = secrets_dir / "nats"
    node = NatsServer(tmp_path_factory.mktemp("nats"), creds_dir=secrets_dir / "creds",
                      auth_dir=files).start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def streams(secrets_dir: Path, server: NatsServer) -> None:
    """The streams, declared by the admin with `intentroute deploy streams`."""
    done = CliRunner().invoke(
        app, ["deploy", "streams", "--creds", str(secrets_dir / "creds" / "admin.json")],
        env={"NATS_URL": server.url, "NATS_STREAM_REPLICAS": "1"})
    assert done.exit_code == 0, done.output


def test_every_node_config_is_valid_for_nats_server(secrets_dir: Path) -> None:
    for n in (1, 2, 3):
        config = secrets_dir / "nats" / f"nats-{n}.conf"
        done = subprocess.run([nats_server_binary(), "-t", "-c", str(config)],
                              capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_token_is_a_file_of_its_own_kept_across_reruns(tmp_path: Path) -> None:
    made = init_secrets(tmp_path / "secrets", nodes=1)
    token = made.dashboard_token.read_text()
    assert len(token.strip()) >= 32
    assert made.dashboard_token.stat().st_mode & 0o777 == 0o600
    assert made.gateway_env.read_text() == f"GATEWAY_DASHBOARD_TOKEN={token}"
    read = DashboardSettings.from_env({"GATEWAY_DASHBOARD_TOKEN_FILE": str(made.dashboard_token)})
    assert read.token == token.strip()
    init_secrets(made.root, nodes=1)
    assert made.dashboard_token.read_text() == token
    # A directory from before the file: it gets the token gateway.env already holds.
    made.dashboard_token.unlink()
    init_secrets(made.root, nodes=1)
    assert made.dashboard_token.read_text() == token
    assert made.dashboard_token.stat().st_mode & 0o777 == 0o600


def test_the_admin_declares_the_streams_and_each_worker_finds_them(
        secrets_dir: Path, server: NatsServer, streams: None) -> None:
    async def as_worker(worker: str) -> None:
        env = service_env(secrets_dir, worker)  # the files compose mounts for it
        nc = await nats.connect(server.url, user=env["NATS_USER"],
                                password=env["NATS_PASSWORD"],
                                inbox_prefix=env["NATS_INBOX_PREFIX"])
        try:
            await require_streams(nc.jetstream(), 3600.0, timeout=5)
        finally:
            await nc.close()

    async def all_workers() -> None:
        for worker in WORKERS:
            await as_worker(worker)

    asyncio.run(all_workers())


def test_a_wrong_password_is_refused(server: NatsServer) -> None:
    async def guess() -> None:
        await nats.connect(server.url, user="intentroute-classifier", password="guess",
                           allow_reconnect=False, connect_timeout=2)

    with pytest.raises((NoServersError, nats.errors.Error)):
        asyncio.run(guess())


async def connect(kwargs: dict[str, str], url: str) -> bool:
    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=2, **kwargs)
    try:
        return bool(nc.is_connected)
    finally:
        await nc.close()


async def request_stored(kwargs: dict[str, str], url: str, agent_id: str) -> int:
    """Publish on the agent's request subject and wait for AGENT_REQUESTS' ack (through
    its account's service import); the stored message's sequence."""
    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=2, **kwargs)
    try:
        ack = await nc.jetstream().publish(request_subject(agent_id), b"{}", timeout=5)
        return ack.seq
    finally:
        await nc.close()


def test_an_agent_reaches_nats_after_nats_auth_and_two_reloads(
        secrets_dir: Path, server: NatsServer, streams: None, database_url: str) -> None:
    with fresh_database(database_url) as db_url:
        async def add() -> dict[str, str]:
            store = await AgentStore.connect(db_url)
            try:
                return dict((await store.add("deploy-agent")).nats)
            finally:
                await store.close()

        nats_kwargs = asyncio.run(add())
        with pytest.raises((NoServersError, nats.errors.Error)):  # not a NATS user yet
            asyncio.run(connect(nats_kwargs, server.url))
        done = CliRunner().invoke(app, ["deploy", "nats-auth", "--dir", str(secrets_dir)],
                                  env={"DATABASE_URL": db_url})
        assert done.exit_code == 0, done.output
        assert "reload the NATS servers twice" in done.output  # a new agent's account
        again = CliRunner().invoke(app, ["deploy", "nats-auth", "--dir", str(secrets_dir)],
                                   env={"DATABASE_URL": db_url})
        assert again.exit_code == 0, again.output
        assert "unchanged" in again.output
    assert "deploy-agent" in (secrets_dir / "nats" / "auth.conf").read_text()
    # As it says; compose: `docker compose kill -s HUP nats-1 nats-2 nats-3`, twice.
    running = RunningServer(server.pid, server.data_dir / "nats-server.log")
    reload_confirmed(running)
    reload_confirmed(running)

    assert asyncio.run(connect(nats_kwargs, server.url))
    assert asyncio.run(request_stored(nats_kwargs, server.url, "deploy-agent")) > 0


def test_a_worker_runs_as_compose_runs_it(secrets_dir: Path, server: NatsServer,
                                          tmp_path: Path) -> None:
    """db-init and migrate with the secrets' passwords on a Postgres of its own, then
    `intentroute worker validator` with compose's environment: its credential and the
    admission key mounted in INTENTROUTE_HOME/creds, its role's password file. Its
    health check (the metrics endpoint, through the probe) passes once it runs."""
    roles = secrets_dir / "postgres" / "roles"
    pg = PostgresServer(tmp_path / "pg").start()
    try:
        address = f"127.0.0.1:{pg.port}/intentroute"
        steps = [
            (["db-init", "--passwords", str(roles)],
             {"DATABASE_URL": f"postgresql://postgres@{address}",
              "DATABASE_PASSWORD_FILE": str(pg.password_file)}),
            (["migrate"], {"DATABASE_URL": f"postgresql://intentroute_owner@{address}",
                           "DATABASE_PASSWORD_FILE": str(roles / "intentroute_owner")}),
            (["deploy", "streams", "--creds", str(secrets_dir / "creds" / "admin.json")],
             {"NATS_URL": server.url, "NATS_STREAM_REPLICAS": "1"}),
        ]
        for args, env in steps:
            done = CliRunner().invoke(app, args, env=env)
            assert done.exit_code == 0, done.output
        home = tmp_path / "home"  # what compose mounts for the validator
        (home / "creds").mkdir(parents=True)
        for name in ("intentroute-validator.json", "admission.key"):
            shutil.copyfile(secrets_dir / "creds" / name, home / "creds" / name)
        port = free_port()
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("NATS_", "DATABASE_", "INTENTROUTE_", "METRICS_"))}
        env.update(NATS_URL=server.url, INTENTROUTE_HOME=str(home), HF_HUB_OFFLINE="1",
                   DATABASE_URL=f"postgresql://intentroute_validator@{address}",
                   DATABASE_PASSWORD_FILE=str(roles / "intentroute_validator"),
                   AVAP_PARSER_URL="127.0.0.1:1", METRICS_PORT=str(port))
        log = (tmp_path / "worker.log").open("wb")
        worker = subprocess.Popen([sys.executable, "-m", "intentroute.cli", "worker",
                                   "validator"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            deadline = time.monotonic() + 90
            while (problem := probe(url)) and worker.poll() is None:
                assert time.monotonic() < deadline, problem
                time.sleep(0.5)
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()
            up = subprocess.run([sys.executable, "-m", "intentroute.deploy.probe", url],
                                capture_output=True, text=True, timeout=30, check=False)
            assert up.returncode == 0, up.stderr
        finally:
            worker.terminate()
            worker.wait(30)
            log.close()
    finally:
        pg.stop()
    down = subprocess.run([sys.executable, "-m", "intentroute.deploy.probe", url],
                          capture_output=True, text=True, timeout=30, check=False)
    assert down.returncode == 1
    assert down.stderr.startswith("unhealthy: ")
