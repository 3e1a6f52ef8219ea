"""PostgreSQL stores: schema + migrations (SQLAlchemy/Alembic), hot path on asyncpg."""

from __future__ import annotations

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


def migrate(database_url: str) -> None:
    """Bring the schema to the latest Alembic revision (idempotent)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(database_url))
    command.upgrade(cfg, "head")
