"""The embedded nats-server's users: files in the state directory, reload on change.

<state>/creds/ (0700) holds one credential per user (0600, `shared.auth.natsconn` format):
`admin.json`, `intentroute-<worker>.json`, the monitoring reader's `intentroute-ops.json`
(`intentroute status`), and the demo agent's `demo.json` (with the server's URL, as
`intentroute agent add` writes an agent's).
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
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import bcrypt
import msgspec

from intentroute.stack.natsconf import AUTH_FILE, account_names, auth_config, stack_users
from shared.auth.natsconn import (
    Credential,
    read_credential,
    user_credential,
    with_server,
    write_credential,
)
from shared.auth.permissions import (
    ADMIN_USER,
    CLIENT_GRANTS,
    OPS_USER,
    STACK_USERS,
    service_user,
)
from shared.store import asyncpg_dsn
from shared.store.agent_changes import AgentChanges
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


# The stack's own users (admin, ops reader, one per worker type) hold generated secrets
# of 256 random bits (token_urlsafe(32)), not passwords. A slow hash protects what can be
# guessed; 2^256 cannot be at any hash speed, so their bcrypt hashes take bcrypt's
# lowest cost, 4 (16 rounds), instead of 10 (1024). nats-server checks the hash on every
# CONNECT, and after a restart every worker reconnects at once: at cost 10 each check
# took ~60 ms of CPU, and on a loaded 2-core machine the server's read loops took
# 2-4 s per connection, longer than nats-py's 2 s connect timeout, so clients gave up
# and tried again (answers resumed 1.4-14 s after the server listened; docs/guides/
# security.md and operations/reliability.md for the figures after). The hashes stay
# bcrypt: nats-server has no other password check than bcrypt or plain text, and plain
# text would put the secrets in its config. Agents' hashes (shared.auth.identity) are
# not changed here.
SERVICE_BCRYPT_COST = 4


def service_hash(secret: str) -> str:
    return bcrypt.hashpw(secret.encode(), bcrypt.gensalt(SERVICE_BCRYPT_COST)).decode()


def bcrypt_cost(secret_hash: str) -> int:
    """A bcrypt hash's cost (`$2b$<cost>$...`); 0 when it is not one."""
    parts = secret_hash.split("$")
    return int(parts[2]) if len(parts) > 3 and parts[2].isdigit() else 0


def ensure_service_users(files: AuthFiles) -> dict[str, str]:
    """The admin's and service users' password hashes, creating their credentials the
    first time (or when one is missing); kept across restarts. Hashes made at another
    cost by an older version are remade from the same secrets (no credential changes)."""
    users = list(STACK_USERS)
    hashes: dict[str, str] = {}
    if files.hashes.exists():
        hashes = msgspec.json.decode(files.hashes.read_bytes(), type=dict[str, str])
    files.creds_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
    files.creds_dir.chmod(0o700)
    if not files.admission_key.exists():  # the workers' shared admission key
        write_private(files.admission_key, secrets.token_urlsafe(32))
    if set(hashes) == set(users) and all(files.credential(u).exists() for u in users):
        if all(bcrypt_cost(h) == SERVICE_BCRYPT_COST for h in hashes.values()):
            return hashes
        hashes = {user: service_hash(read_credential(files.credential(user)).nats["password"])
                  for user in users}
    else:
        hashes = {}
        for user in users:
            secret = secrets.token_urlsafe(32)
            write_credential(files.credential(user), user_credential(user, secret))
            hashes[user] = service_hash(secret)
    write_private(files.hashes, msgspec.json.encode(hashes).decode())
    return hashes


def admin_kwargs(state_dir: Path) -> dict[str, str]:
    """`nats.connect` kwargs of the admin (the `up` process, operator commands)."""
    return dict(read_credential(auth_files(state_dir).credential(ADMIN_USER)).nats)


def ops_kwargs(state_dir: Path) -> dict[str, str]:
    """`nats.connect` kwargs of the monitoring reader (`intentroute status`)."""
    return dict(read_credential(auth_files(state_dir).credential(OPS_USER)).nats)


def service_env(state_dir: Path, worker: str) -> dict[str, str]:
    """The environment a worker process connects with: its service user and, for a
    stage, the deployment's admission key (shared.auth.admission; a worker that reads no
    stage, the doors or the learner, stamps no envelope and gets none)."""
    files = auth_files(state_dir)
    nats = read_credential(files.credential(service_user(worker))).nats
    env = {"NATS_USER": nats["user"], "NATS_PASSWORD": nats["password"],
           "NATS_INBOX_PREFIX": nats["inbox_prefix"]}
    if worker not in CLIENT_GRANTS:
        env["INTENTROUTE_ADMISSION_KEY"] = files.admission_key.read_text(encoding="utf-8")
    return env


def write_auth(files: AuthFiles, agents: Iterable[tuple[str, str]]) -> bool:
    """Render the auth part for the service users and these agents; True if it changed."""
    hashes = msgspec.json.decode(files.hashes.read_bytes(), type=dict[str, str])
    return write_private(files.auth, auth_config(stack_users(hashes, agents)))


class ReloadRefusedError(RuntimeError):
    """nats-server did not apply a reload: its reason, as it logged it."""


class RunningServer(NamedTuple):
    """A nats-server running now from a state directory's files, and its log."""

    pid: int
    log: Path


def running_servers(files: AuthFiles) -> list[RunningServer]:
    """The nats-servers running from these files now (the single one or the cluster's
    nodes): each pid file's pid when that process is alive and is a nats-server started
    with the config next to the pid file. A server restarted by `up` wrote its new pid
    there, so this finds the current process, never a pid remembered from an earlier
    one (which could be any process by now).

    The config is compared as a real absolute path on both sides: the state directory
    may be named relatively (the default `.intentroute`) or through a symlink, while the
    server was started with whatever path `up` had (its config's real path)."""
    found = []
    for pid_file in files.pid_files():
        pid = _read_pid(pid_file)
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if pid else []
        except OSError:  # gone
            continue
        if not any(a.endswith(b"nats-server") for a in argv):
            continue
        directory = pid_file.parent.resolve()
        if directory / CONFIG_FILE in _config_paths(pid, argv):
            found.append(RunningServer(pid, directory / "nats-server.log"))
    return found


def _config_paths(pid: int, argv: Sequence[bytes]) -> set[Path]:
    """The real absolute paths of the config files on process `pid`'s command line
    (`argv`): a relative one is taken from that process's working directory."""
    paths = {Path(os.fsdecode(a)) for a in argv if a.endswith(CONFIG_FILE.encode())}
    if any(not p.is_absolute() for p in paths):
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:  # gone, or someone else's
            paths = {p for p in paths if p.is_absolute()}
        else:
            paths = {cwd / p for p in paths}
    return {p.resolve() for p in paths}


# nats-server logs the outcome of a reload (SIGHUP) on one line: measured, 2-3 ms after
# the signal with a few hundred users.
_RELOADED = "Reloaded server configuration"
_RELOAD_FAILED = "Failed to reload server configuration: "
RELOAD_CONFIRM_TIMEOUT = 10.0


def reload_confirmed(server: RunningServer, timeout: float = RELOAD_CONFIRM_TIMEOUT) -> None:
    """SIGHUP `server` and wait for the outcome in its log: return once it says it
    reloaded, raise ReloadRefusedError with its reason when it refused (a config it
    cannot apply, such as a changed port, or one it cannot parse) or said nothing."""

    try:
        offset = server.log.stat().st_size
    except FileNotFoundError:
        offset = 0
    reload_server(server.pid)
    mine = f"[{server.pid}] "
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError), server.log.open("rb") as log:
            log.seek(offset)
            for raw in log.read().decode(errors="replace").splitlines():
                if not raw.startswith(mine):
                    continue
                if _RELOAD_FAILED in raw:
                    reason = raw.split(_RELOAD_FAILED, 1)[1].strip()
                    raise ReloadRefusedError(
                        f"nats-server (pid {server.pid}) refused the reload: {reason}")
                if _RELOADED in raw:
                    return
        time.sleep(0.02)
    raise ReloadRefusedError(f"nats-server (pid {server.pid}) did not confirm the reload "
                             f"within {timeout:g}s (its log: {server.log})")


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


async def ensure_agent_file(store: AgentStore, state_dir: Path, agent_id: str, *,
                            url: str = "", ca: str = "") -> bool:
    """Make sure `agent_id` exists (untrusted) and `<state>/creds/<agent_id>.json` opens
    it: add it, or give it a new secret when the file is missing or stale. The file
    names the server(s) at `url` (and with TLS the CA file `ca`), rewritten with the same
    secret when they moved. A revoked agent stays revoked (False)."""
    path = auth_files(state_dir).credential(agent_id)

    def located(cred: Credential) -> Credential:
        return with_server(cred, url, ca) if url else cred

    record = await store.get(agent_id)
    if record is None:
        write_credential(path, located(await store.add(agent_id)))
        return True
    if not record.active:
        log.warning("agent %r is revoked: no credential written for it", agent_id)
        return False
    cred = read_credential(path) if path.exists() else None
    if cred is not None and await store.verify_token(cred.token):
        if located(cred) != cred:
            write_credential(path, located(cred))
        return True
    write_credential(path, located(await store.rotate(agent_id)))
    return True


async def apply_agents(
    store: AgentStore, state_dir: Path, *, pid: int = 0, pids: Sequence[int] = (),
    force: bool = False,
) -> bool:
    """Bring the servers' agents in line with the `agents` table; True if they reloaded.
    Every server sharing the users is reloaded (all the nodes of a cluster): those
    running from the state dir's files now (`running_servers`), each reload confirmed
    in its log (ReloadRefusedError otherwise); only when none is found there, `pids` or
    `pid` (unconfirmed). With `force` the servers reload even when the auth part did not
    change (an earlier reload may have been refused, or made by someone else)."""
    agents = await store.active_hashes()
    files = auth_files(state_dir)
    before = (account_names(files.auth.read_text(encoding="utf-8"))
              if files.auth.exists() else set())
    if not write_auth(files, agents) and not force:
        return False
    # nats-server wires a new account's service imports only on the reload after the one
    # that created it (server.configureAccounts swaps the service imports of accounts
    # that existed before; measured on 2.15: an agent added by one reload got "no
    # responders" on its requests until a second): a new agent's account takes two.
    added = account_names(files.auth.read_text(encoding="utf-8")) - before
    rounds = 2 if added or force else 1
    servers = running_servers(files)
    targets = [s.pid for s in servers] or list(pids) or ([pid] if pid else [])
    if not targets:
        raise ProcessLookupError("no nats-server of this state directory is running")
    for round_ in range(rounds):
        if servers:
            for server in servers:
                reload_confirmed(server)
        else:
            if round_:  # unconfirmed: two signals at once could be taken as one
                await asyncio.sleep(0.2)
            for target in targets:
                reload_server(target)
    log.info("NATS auth reloaded on %d server(s): %d active agents", len(targets), len(agents))
    return True


async def sync_agents(
    state_dir: Path, database_url: str, *, pid: int = 0, pids: Sequence[int] = (),
    force: bool = False,
) -> bool:
    store = await AgentStore.connect(database_url)
    try:
        return await apply_agents(store, state_dir, pid=pid, pids=pids, force=force)
    finally:
        await store.close()


class AuthSync:
    """Syncs the server with the agents table, in a thread of its own, whenever a row
    changes (pushed by Postgres: shared.store.agent_changes) and at least every
    `interval` seconds (a digest of ids, hashes and revocations): an agent revoked by
    SQL directly is refused at once, within one interval if the push was missed."""

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
        # A change to an agents row is pushed (NOTIFY): it is applied at once, not at
        # the next poll (the poll stays, for a listener that lost its connection).
        changed = asyncio.Event()
        changes = AgentChanges(asyncpg_dsn(self.database_url), lambda _id: changed.set(),
                               changed.set).start()
        try:
            await self._poll(changed)
        finally:
            await changes.stop()

    async def _poll(self, changed: asyncio.Event) -> None:
        last = ""
        store: AgentStore | None = None
        # After a failure the auth part may already be written: reload it regardless.
        retry = False
        while not self._stop.is_set():
            changed.clear()
            try:
                store = store or await AgentStore.connect(self.database_url)
                digest = await store.digest()
                if digest != last or retry:
                    await apply_agents(store, self.state_dir, pid=self.pid, pids=self.pids,
                                       force=retry)
                    last, retry = digest, False
            except Exception as exc:  # the database restarting must not end the loop
                retry = True
                log.warning("auth sync failed, retrying: %r", exc)
                if store is not None:
                    with contextlib.suppress(Exception):
                        await store.close()
                store = None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), self.interval)
        if store is not None:
            await store.close()
