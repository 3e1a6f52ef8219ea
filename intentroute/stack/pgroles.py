"""The deployment's Postgres roles: their passwords and the superuser's one-time init.

`init_database` (run by `intentroute up` on its embedded Postgres, and by compose's
`db-init` job as `intentroute db-init`) is the only thing the superuser does: it creates
(or updates) the login roles of `shared.store.roles` with their passwords, the database
owned by the owner role, hands the owner any table an older stack's superuser made, and
lets only the deployment's roles connect. Idempotent, so a state dir from before the
roles existed gets them on its next `up`. The migrations then run as the owner, and
each worker connects as its own role.

The embedded stack keeps one password per role in `<state>/postgres/roles/<role>`
(0600, in a 0700 directory), generated the first time, like the superuser's.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg

from intentroute.stack.nats_users import write_private
from shared.store import asyncpg_dsn
from shared.store.roles import LEARNER_ROLE, OWNER_ROLE, ROLES, worker_role

ROLES_DIR = "roles"


def role_passwords(postgres_dir: Path) -> dict[str, str]:
    """Every role's password, generating the missing ones (0600 files)."""
    folder = postgres_dir / ROLES_DIR
    folder.mkdir(parents=True, mode=0o700, exist_ok=True)
    folder.chmod(0o700)
    passwords = {}
    for role in ROLES:
        path = folder / role
        if not path.exists():
            write_private(path, secrets.token_urlsafe(24) + "\n")
        passwords[role] = path.read_text(encoding="utf-8").strip()
    return passwords


def read_passwords(folder: Path) -> dict[str, str]:
    """The roles' passwords from files named after them (compose's secrets); a role
    without a file is left out, an empty file is an error."""
    passwords = {}
    for role in ROLES:
        path = folder / role
        if path.is_file():
            password = path.read_text(encoding="utf-8").strip()
            if not password:
                raise ValueError(f"{path} is empty")
            passwords[role] = password
    return passwords


def stack_worker_url(postgres_dir: Path, worker: str, owner_url: str) -> str:
    """A worker's URL on a running embedded stack (`intentroute worker NAME`): its role's,
    from the owner's URL in stack.json and the role's password file."""
    role = _role_of(worker)
    path = postgres_dir / ROLES_DIR / role
    if not role or not path.is_file():
        return owner_url
    return role_url(owner_url, role, path.read_text(encoding="utf-8").strip())


def role_url(url: str, role: str, password: str) -> str:
    """`url` (the superuser's) with the role's name and password instead."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{quote(role, safe='')}:{quote(password, safe='')}@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def with_password(url: str, password: str) -> str:
    """`url` with this password (compose: a worker's DATABASE_URL names its role, the
    password comes from a secret file)."""
    parts = urlsplit(url)
    return role_url(url, parts.username or "", password)


class DatabaseUrls(NamedTuple):
    """The owner's URL (migrations, operator commands) and each role's."""

    owner: str
    roles: Mapping[str, str]

    def worker(self, name: str) -> str:
        """A worker's URL (the learner's too): its role's, or the one URL when there are
        no roles."""
        return self.roles.get(_role_of(name), self.owner)

    @property
    def learner(self) -> str:
        return self.roles.get(LEARNER_ROLE, self.owner)


def _role_of(worker: str) -> str:
    try:
        return worker_role(worker)
    except KeyError:
        return ""


class StageSecrets(NamedTuple):
    """What `up` hands each worker beyond the common environment: its own database URL
    (the learner's role to the learner), and to the doors alone the dashboard's token."""

    db: DatabaseUrls
    dashboard_token: str = ""

    def env_for(self, worker: str, env: Mapping[str, str]) -> dict[str, str]:
        out = {"DATABASE_URL": self.db.worker(worker)}
        if worker == "doors" and self.dashboard_token:
            out["GATEWAY_DASHBOARD_TOKEN"] = self.dashboard_token
        return out


def learns(interval: str) -> bool:
    """LEARN_INTERVAL turns the learner on (a value the learner will refuse counts as
    on: it says why itself)."""
    try:
        return float(interval or 0) > 0
    except ValueError:
        return True


def database_urls(superuser_url: str, passwords: Mapping[str, str]) -> DatabaseUrls:
    roles = {role: role_url(superuser_url, role, pw) for role, pw in passwords.items()}
    return DatabaseUrls(roles[OWNER_ROLE], roles)


def _literal(text: str) -> str:
    """A SQL string literal (CREATE ROLE takes no bind parameters)."""
    if any(ord(ch) < 32 for ch in text):
        raise ValueError("a role password may not hold control characters")
    return "'" + text.replace("'", "''") + "'"


# Tables, views and sequences an older stack's superuser created (every relation of the
# schema but indexes, which follow their table, and identity sequences, which follow
# theirs), and its functions, go to the owner role.
_TO_OWNER = f"""
DO $$
DECLARE obj record;
BEGIN
    FOR obj IN
        SELECT c.oid::regclass AS name, c.relkind FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
          AND c.relowner <> '{OWNER_ROLE}'::regrole
          AND NOT (c.relkind = 'S' AND EXISTS (
              SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
              AND d.objid = c.oid AND d.deptype IN ('a', 'i')))
    LOOP
        EXECUTE format('ALTER %s %s OWNER TO {OWNER_ROLE}',
                       CASE WHEN obj.relkind = 'S' THEN 'SEQUENCE' ELSE 'TABLE' END,
                       obj.name);
    END LOOP;
    FOR obj IN
        SELECT p.oid::regprocedure AS name FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public' AND p.proowner <> '{OWNER_ROLE}'::regrole
    LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO {OWNER_ROLE}', obj.name);
    END LOOP;
END
$$"""


async def init_database(superuser_url: str, database: str,
                        passwords: Mapping[str, str]) -> None:
    """Create or update the roles and the database (as the superuser; idempotent)."""
    conn = await asyncpg.connect(asyncpg_dsn(on_database(superuser_url, "postgres")))
    try:
        for role in ROLES:
            verb = ("ALTER" if await conn.fetchval(
                "SELECT 1 FROM pg_roles WHERE rolname = $1", role) else "CREATE")
            await conn.execute(
                f'{verb} ROLE "{role}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE '
                f"NOREPLICATION NOBYPASSRLS PASSWORD {_literal(passwords[role])}")
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database):
            await conn.execute(f'CREATE DATABASE "{database}" OWNER "{OWNER_ROLE}"')
        await conn.execute(f'ALTER DATABASE "{database}" OWNER TO "{OWNER_ROLE}"')
        # Only the deployment's roles connect; nobody makes temporary tables.
        await conn.execute(f'REVOKE ALL ON DATABASE "{database}" FROM PUBLIC')
        workers = ", ".join(f'"{role}"' for role in ROLES)
        await conn.execute(f'GRANT CONNECT ON DATABASE "{database}" TO {workers}')
    finally:
        await conn.close()
    conn = await asyncpg.connect(asyncpg_dsn(on_database(superuser_url, database)))
    try:
        await conn.execute(_TO_OWNER)
        await conn.execute(f'ALTER SCHEMA public OWNER TO "{OWNER_ROLE}"')
        await conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    finally:
        await conn.close()


def on_database(url: str, database: str) -> str:
    """`url` naming another database of the same server."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))
