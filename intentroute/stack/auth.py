"""The embedded nats-server's users: files in the state directory, reload on change.

<state>/creds/ (0700) holds one credential per user (0600, `shared.auth.natsconn` format):
`admin.json`, `intentroute-<worker>.json`, the monitoring reader's `intentroute-ops.json`
(`intentroute status`), and the demo agent's `demo.json`.
<state>/nats/users.json (0600) keeps the bcrypt hashes of the admin and service
passwords, so re-rendering the auth part never re-hashes them (a changed hash is a
changed user to nats-server: on reload it re-checks that user's live connections).

Agents live in Postgres (`shared.store.agents`); `sync_agents` renders the auth part
from the active ones and reloads the server when it changed. nats-server closes the
connections of a user a reload removed (measured: 5 ms after the signal) and refuses
its reconnects; other users' connections are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec

from intentroute.stack.natsconf import AUTH_FILE, auth_config, stack_users
from shared.auth.identity import hash_secret
from shared.auth.natsconn import read_credential, user_credential, write_credential
from shared.auth.permissions import ADMIN_USER, OPS_USER, STACK_USERS, service_user
from shared.store.agents import AgentStore

log = logging.getLogger("intentroute.stack")

# The agent `intentroute up` creates for its demo and for `intentroute ask`.
DEMO_AGENT = "demo"
CONFIG_FILE = "nats-server.conf"
PID_FILE = "nats-server.pid"


class AuthFiles(NamedTuple):
    nats_dir: Path
    creds_dir: Path

    @property
    def config(self) -> Path:
        return self.nats_dir / CONFIG_FILE

    @property
    def auth(self) -> Path:
        return self.nats_dir / AUTH_FILE

    @property
    def hashes(self) -> Path:
        return self.nats_dir / "users.json"

    @property
    def pid_file(self) -> Path:
        return self.nats_dir / PID_FILE

    def pid_files(self) -> list[Path]:
        """The single server's pid file, then each cluster node's (`node-<n>/`)."""
        return [self.pid_file, *sorted(self.nats_dir.glob(f"node-*/{PID_FILE}"))]

    def credential(self, user: str) -> Path:
        return self.creds_dir / f"{user}.json"

    @property
    def admission_key(self) -> Path:
        return self.creds_dir / "admission.key"


def auth_files(state_dir: Path) -> AuthFiles:
    return AuthFiles(state_dir / "nats", state_dir / "creds")


def write_private(path: Path, text: str) -> bool:
    """Write `text` readable by the owner only, atomically; False when it was already so.
    A temporary file of its own (mkstemp: 0600) lets two writers race safely."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def ensure_service_users(files: AuthFiles) -> dict[str, str]:
    """The admin's and service users' password hashes, creating their credentials the
    first time (or when one is missing); kept across restarts."""
    users = list(STACK_USERS)
    hashes: dict[str, str] = {}
    if files.hashes.exists():
        hashes = msgspec.json.decode(files.hashes.read_bytes(), type=dict[str, str])
    files.creds_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
    files.creds_dir.chmod(0o700)
    if not files.admission_key.exists():  # the workers' shared admission key
        write_private(files.admission_key, secrets.token_urlsafe(32))
    if set(hashes) == set(users) and all(files.credential(u).exists() for u in users):
        return hashes
    hashes = {}
    for user in users:
        secret = secrets.token_urlsafe(32)
        write_credential(files.credential(user), user_credential(user, secret))
        hashes[user] = hash_secret(secret)
    write_private(files.hashes, msgspec.json.encode(hashes).decode())
    return hashes


def admin_kwargs(state_dir: Path) -> dict[str, str]:
    """`nats.connect` kwargs of the admin (the `up` process, operator commands)."""
    return dict(read_credential(auth_files(state_dir).credential(ADMIN_USER)).nats)


def ops_kwargs(state_dir: Path) -> dict[str, str]:
    """`nats.connect` kwargs of the monitoring reader (`intentroute status`)."""
    return dict(read_credential(auth_files(state_dir).credential(OPS_USER)).nats)


def service_env(state_dir: Path, worker: str) -> dict[str, str]:
    """The environment a worker process connects with: its service user and the
    deployment's admission key (shared.auth.admission)."""
    files = auth_files(state_dir)
    nats = read_credential(files.credential(service_user(worker))).nats
    return {"NATS_USER": nats["user"], "NATS_PASSWORD": nats["password"],
            "NATS_INBOX_PREFIX": nats["inbox_prefix"],
            "INTENTROUTE_ADMISSION_KEY": files.admission_key.read_text(encoding="utf-8")}


def write_auth(files: AuthFiles, agents: Iterable[tuple[str, str]]) -> bool:
    """Render the auth part for the service users and these agents; True if it changed."""
    hashes = msgspec.json.decode(files.hashes.read_bytes(), type=dict[str, str])
    return write_private(files.auth, auth_config(stack_users(hashes, agents)))


def reload_server(pid: int) -> None:
    """Ask nats-server to re-read its config (SIGHUP). Refuses to signal a pid that is
    not a nats-server: a stale pid could name any process, and SIGHUP ends most."""
    if pid <= 0:  # kill(0) would signal our whole process group
        raise ProcessLookupError("no nats-server pid to signal")
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists() and b"nats-server" not in cmdline.read_bytes():
        raise ProcessLookupError(f"pid {pid} is not a nats-server")
    os.kill(pid, signal.SIGHUP)


def server_pid(files: AuthFiles) -> int:
    """The running server's pid from its pid file (0 when none)."""
    return _read_pid(files.pid_file)


def server_pids(files: AuthFiles) -> list[int]:
    """The pids of every live server sharing these users: the single one or the
    cluster's nodes (a stopped server's pid file is removed when it stops; one killed
    leaves it, and its pid is left out here)."""
    return [pid for pid in map(_read_pid, files.pid_files()) if pid and _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's: reload_server refuses it
        return True
    return True


def _read_pid(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


async def ensure_agent_file(store: AgentStore, state_dir: Path, agent_id: str) -> bool:
    """Make sure `agent_id` exists (untrusted) and `<state>/creds/<agent_id>.json` opens
    it: add it, or give it a new secret when the file is missing or stale. A revoked
    agent stays revoked (False)."""
    path = auth_files(state_dir).credential(agent_id)
    record = await store.get(agent_id)
    if record is None:
        write_credential(path, await store.add(agent_id))
        return True
    if not record.active:
        log.warning("agent %r is revoked: no credential written for it", agent_id)
        return False
    if path.exists() and await store.verify_token(read_credential(path).token):
        return True
    write_credential(path, await store.rotate(agent_id))
    return True


async def apply_agents(
    store: AgentStore, state_dir: Path, *, pid: int = 0, pids: Sequence[int] = ()
) -> bool:
    """Bring the servers' agents in line with the `agents` table; True if they reloaded.
    Every server sharing the users is reloaded: `pids`, or `pid`, or those the pid
    files name (all the nodes of a cluster)."""
    agents = await store.active_hashes()
    files = auth_files(state_dir)
    if not write_auth(files, agents):
        return False
    targets = list(pids) or ([pid] if pid else server_pids(files))
    if not targets:
        raise ProcessLookupError("no nats-server pid to signal")
    for target in targets:
        reload_server(target)
    log.info("NATS auth reloaded on %d server(s): %d active agents", len(targets), len(agents))
    return True


async def sync_agents(
    state_dir: Path, database_url: str, *, pid: int = 0, pids: Sequence[int] = ()
) -> bool:
    store = await AgentStore.connect(database_url)
    try:
        return await apply_agents(store, state_dir, pid=pid, pids=pids)
    finally:
        await store.close()


class AuthSync:
    """Polls the agents table (a digest of ids, hashes and revocations) every
    `interval` seconds in a thread of its own, and syncs the server when it changed:
    an agent revoked by SQL directly is refused within about one interval."""

    def __init__(self, state_dir: Path, database_url: str, *, pid: int = 0,
                 pids: Sequence[int] = (), interval: float = 2.0) -> None:
        self.state_dir = state_dir
        self.database_url = database_url
        self.pid = pid
        self.pids = tuple(pids)
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="auth-sync", daemon=True)

    def start(self) -> AuthSync:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)

    def _run(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        last = ""
        store: AgentStore | None = None
        while not self._stop.is_set():
            try:
                store = store or await AgentStore.connect(self.database_url)
                digest = await store.digest()
                if digest != last:
                    await apply_agents(store, self.state_dir, pid=self.pid, pids=self.pids)
                    last = digest
            except Exception as exc:  # the database restarting must not end the loop
                log.warning("auth sync failed, retrying: %r", exc)
                if store is not None:
                    with contextlib.suppress(Exception):
                        await store.close()
                store = None
            await asyncio.to_thread(self._stop.wait, self.interval)
        if store is not None:
            await store.close()
