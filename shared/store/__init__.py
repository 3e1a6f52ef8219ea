"""PostgreSQL stores: schema + migrations (SQLAlchemy/Alembic), hot path on asyncpg."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shared.store.owner_settings import OwnerSettings

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def asyncpg_dsn(url: str) -> str:
    """`postgresql+asyncpg://...` or `postgres://...` -> what asyncpg accepts."""
    for prefix in ("postgresql+asyncpg://", "postgres+asyncpg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


def sqlalchemy_url(url: str) -> str:
    return "postgresql+asyncpg://" + asyncpg_dsn(url)[len("postgresql://") :]


def migrate(database_url: str, settings: OwnerSettings | None = None) -> list[str]:
    """Bring the schema to the latest Alembic revision (idempotent): the revisions applied,
    said in one log line when there are any (Alembic's own lines are quieted,
    `shared.runtime.logs`). With `settings`, then store them in `owner_settings`: the
    limits of the owner's SECURITY DEFINER functions (`shared.store.owner_settings`);
    without, the stored ones stay (10,000 sessions, 30 days when never written)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(database_url))
    applied: list[str] = []
    cfg.attributes["applied"] = applied  # migrations/env.py appends each revision
    command.upgrade(cfg, "head")
    if applied:
        logging.getLogger("intentroute.store").info(
            "database migrated to revision %s (%d applied)", applied[-1], len(applied))
    if settings is not None:
        asyncio.run(_write_owner_settings(database_url, settings))
    return applied


async def _write_owner_settings(database_url: str, settings: OwnerSettings) -> None:
    import asyncpg

    from shared.store.owner_settings import write_owner_settings

    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await write_owner_settings(conn, settings)
    finally:
        await conn.close()
