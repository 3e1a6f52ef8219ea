"""`stack.json`: how other commands find a running `intentroute up`."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import msgspec


class ReadyInfo(msgspec.Struct, kw_only=True):
    """What `up`'s ready screen shows (intentroute.cli.ready), once every worker
    answers: the commands to ask, add an agent and stop, the OpenAI-compatible door's
    base URL with the demo agent's key, the gRPC address, and a one-time dashboard login
    link (good once, until `dashboard_login_expires`, epoch seconds)."""

    ask: str
    add_agent: str
    stop: str
    openai_base_url: str = ""
    openai_api_key: str = ""
    grpc_address: str = ""
    dashboard_login_url: str = ""
    dashboard_login_expires: float = 0.0


class StackInfo(msgspec.Struct):
    # One URL, or every node's, comma-separated.
    nats_url: str
    database_url: str
    parser_url: str = ""
    pid: int = 0
    # With auth on: the nats-server's config (its auth part is regenerated when agents
    # change) and its pid (signalled to reload it).
    nats_config: str = ""
    nats_pid: int = 0
    # The doors' HTTP listener (`POST {gateway_http_url}/agents/{agent_id}/feedback`).
    gateway_http_url: str = ""
    # The operator dashboard and the file holding its token (owner-readable only).
    dashboard_url: str = ""
    dashboard_token_file: str = ""
    # Every node's pid when the embedded NATS is a cluster (all are reloaded).
    nats_pids: list[int] = msgspec.field(default_factory=list)
    # The embedded Postgres's postmaster. `up` rewrites this file when it restarts a
    # server that died, so the pids here are the running ones.
    postgres_pid: int = 0
    # The doors' gRPC listener (`up --grpc`, or GATEWAY_GRPC_LISTEN), `host:port` as
    # gRPC channels and grpcurl take it: AskAgent, Feedback, health and reflection.
    gateway_grpc_address: str = ""
    # The workers' Prometheus endpoints (on by default under `up`): the first process's
    # port, each next process on the next one, all listed with their worker's name in
    # the `file_sd_configs` file `metrics_targets` (0 / "": metrics off).
    metrics_port: int = 0
    metrics_targets: str = ""
    # The ready screen's contents, once `up` is ready (None until then).
    ready: ReadyInfo | None = None


STATE_FILE = "stack.json"


def write_state(state_dir: Path, info: StackInfo) -> None:
    """stack.json carries the database password: readable by its owner only. Written
    whole and renamed into place, so a reader never sees half of it (`up` rewrites it
    when a server restarts and when it is ready)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / STATE_FILE
    tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}.{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(msgspec.json.encode(info))
    tmp.chmod(0o600)
    os.replace(tmp, path)


def read_state(state_dir: Path) -> StackInfo | None:
    path = state_dir / STATE_FILE
    if not path.exists():
        return None
    info = msgspec.json.decode(path.read_bytes(), type=StackInfo)
    if info.pid and not pid_alive(info.pid):
        return None
    return info


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


# `up` serves the doors' HTTP face on loopback unless GATEWAY_HTTP_LISTEN says where.
DEFAULT_GATEWAY_HTTP_LISTEN = "127.0.0.1:0"


def gateway_http_listen(listen: str, pick_port: Callable[[], int]) -> tuple[str, str]:
    """(the GATEWAY_HTTP_LISTEN the gateway replicas get, the URL clients use). Port 0
    becomes a free port picked here, so every replica binds the same one (they share it
    with SO_REUSEPORT) and stack.json can name it before they start; "" or "off" turns
    the listener off."""
    listen, address = _pinned(listen, pick_port, "GATEWAY_HTTP_LISTEN")
    return listen, f"http://{address}" if address else ""


# `up --grpc` serves the doors' gRPC face on loopback unless GATEWAY_GRPC_LISTEN says
# where.
DEFAULT_GATEWAY_GRPC_LISTEN = "127.0.0.1:0"


def gateway_grpc_listen(listen: str, pick_port: Callable[[], int]) -> tuple[str, str]:
    """(the GATEWAY_GRPC_LISTEN the gateway replicas get, the `host:port` clients dial),
    port 0 pinned as `gateway_http_listen` does (grpc binds with SO_REUSEPORT too)."""
    return _pinned(listen, pick_port, "GATEWAY_GRPC_LISTEN")


def _pinned(listen: str, pick_port: Callable[[], int], variable: str) -> tuple[str, str]:
    """(`listen` with port 0 replaced by `pick_port()`'s, the `host:port` to dial: a
    wildcard host dialled on loopback); ("", "") for "" or "off"."""
    listen = listen.strip()
    if listen.lower() in ("", "off"):
        return "", ""
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{variable}={listen!r}: expected host:port")
    number = int(port) or pick_port()
    dial_host = "127.0.0.1" if host in ("0.0.0.0", "[::]", "::") else host
    return f"{host}:{number}", f"{dial_host}:{number}"


def dashboard_token(creds_dir: Path) -> Path:
    """The embedded stack's dashboard token, generated once (owner-readable only)."""
    import secrets

    from intentroute.stack.nats_users import write_private

    path = creds_dir / "dashboard.token"
    if not path.exists():
        write_private(path, secrets.token_urlsafe(32))
    return path
