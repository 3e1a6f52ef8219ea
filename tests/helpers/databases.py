"""A database of its own on the test Postgres, for tests that reshape the request log
(drop partitions) or must see every row of it (report sums)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from shared.store import MIGRATIONS_DIR, asyncpg_dsn, sqlalchemy_url


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


async def _admin(url: str, sql: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url))
    return cfg


@contextmanager
def fresh_database(url: str, *, revision: str = "head") -> Iterator[str]:
    """A new database on `url`'s server, migrated to `revision`; dropped afterwards."""
    from alembic import command

    name = f"t_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(url, f"CREATE DATABASE {name}"))
    db_url = with_database(url, name)
    try:
        command.upgrade(alembic_config(db_url), revision)
        yield db_url
    finally:
        asyncio.run(_admin(url, f"DROP DATABASE {name} WITH (FORCE)"))
