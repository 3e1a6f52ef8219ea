"""The embedded Postgres asks every connection for its password (scram-sha-256), and a
data directory from the trust era is converted on start."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from intentroute.stack import PostgresServer
from intentroute.stack.postgres import hba_uses_trust

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path_factory.mktemp("pg")).start()
    yield server
    server.stop()


def without_password(url: str) -> str:
    parts = urlsplit(url)
    return url.replace(f":{parts.password}@", "@", 1)


@pytest.fixture(autouse=True)
def _no_ambient_password(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # libpq-style fallbacks must not hand the password over behind the test's back.
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))


async def test_the_password_opens_the_database(pg: PostgresServer) -> None:
    conn = await asyncpg.connect(pg.url)
    try:
        method = await conn.fetchval("SELECT current_setting('password_encryption')")
        stored = await conn.fetchval(
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'")
    finally:
        await conn.close()
    assert method == "scram-sha-256"
    assert stored.startswith("SCRAM-SHA-256$")
    assert pg.password_file.stat().st_mode & 0o777 == 0o600
    assert not hba_uses_trust((pg.pgdata / "pg_hba.conf").read_text())


async def test_a_connection_without_the_password_is_refused(pg: PostgresServer) -> None:
    with pytest.raises(asyncpg.InvalidPasswordError, match="password authentication failed"):
        await asyncpg.connect(without_password(pg.url))


async def test_a_wrong_password_is_refused(pg: PostgresServer) -> None:
    wrong = pg.url.replace(f":{pg.password}@", ":not-the-password@", 1)
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(wrong)


def test_the_local_socket_asks_for_the_password_too(pg: PostgresServer) -> None:
    psql = pg._bin("psql")
    env = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    res = subprocess.run([psql, "-h", str(pg.data_dir / "sock"), "-p", str(pg.port), "-U",
                          "postgres", "-d", "postgres", "-w", "-tAc", "SELECT 1"],
                         capture_output=True, text=True, env=env)
    assert res.returncode != 0
    assert "password" in res.stderr.lower(), res.stderr
    env["PGPASSWORD"] = pg.password
    res = subprocess.run([psql, "-h", str(pg.data_dir / "sock"), "-p", str(pg.port), "-U",
                          "postgres", "-d", "postgres", "-w", "-tAc", "SELECT 1"],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1"


async def test_a_trust_data_dir_is_converted_on_start(tmp_path: Path) -> None:
    """A data directory initialised the old way (trust) keeps its data, loses trust."""
    old = PostgresServer(tmp_path / "pg")
    old.data_dir.mkdir(parents=True)
    old._prepare_user()
    await asyncio.to_thread(
        subprocess.run, [old._bin("initdb"), "-D", str(old.pgdata), "--auth=trust",
                         "--encoding=utf8", "-U", "postgres"],
        check=True, capture_output=True, user=old._user)
    assert hba_uses_trust((old.pgdata / "pg_hba.conf").read_text())

    server = await asyncio.to_thread(PostgresServer(tmp_path / "pg").start)
    try:
        conn = await asyncpg.connect(server.url)
        await conn.close()
        with pytest.raises(asyncpg.InvalidPasswordError, match="password authentication"):
            await asyncpg.connect(without_password(server.url))
        assert not hba_uses_trust((server.pgdata / "pg_hba.conf").read_text())
    finally:
        server.stop()
    # Restarted, it keeps the same password (the state file), no conversion needed.
    again = await asyncio.to_thread(PostgresServer(tmp_path / "pg").start)
    try:
        conn = await asyncpg.connect(again.url)
        await conn.close()
        assert again.password == server.password
    finally:
        again.stop()
