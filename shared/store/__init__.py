"""PostgreSQL stores: schema + migrations (SQLAlchemy/Alembic), hot path on asyncpg."""

from __future__ import annotations

import logging
from pathlib import Path

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def asyncpg_dsn(url: str) -> str:
    """`postgresql+asyncpg://...` or `postgres://...` -> what asyncpg accepts."""
    for prefix in ("postgresql+asyncpg://", "postgres+asyncpg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


def sqlalchemy_url(url: str) -> str:
    return "postgresql+asyncpg://" + asyncpg_dsn(url)[len("postgresql://") :]


def migrate(database_url: str) -> list[str]:
    """Bring the schema to the latest Alembic revision (idempotent): the revisions applied,
    said in one log line when there are any (Alembic's own lines are quieted,
    `shared.runtime.logs`)."""
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
    return applied
