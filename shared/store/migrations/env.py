"""Alembic environment: async engine (asyncpg), URL handed in by `shared.store.migrate`."""

from __future__ import annotations

import asyncio
from typing import Any

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from shared.store.models import metadata
from shared.store.partitions import is_partition

config = context.config


def _include(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Autogenerate leaves the request log's day partitions alone: they are made at run
    time (shared/store/partitions.py), not by migrations."""
    table = obj.table.name if type_ in ("index", "unique_constraint") else name
    return not (reflected and table is not None and is_partition(table))


def _applied(*, step: Any, **_: Any) -> None:
    """Each revision applied, for `shared.store.migrate`'s one line."""
    applied = config.attributes.get("applied")
    if isinstance(applied, list) and step.up_revision_id:
        applied.append(step.up_revision_id)


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata,
                      include_object=_include, on_version_apply=_applied)
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    engine = create_async_engine(config.get_main_option("sqlalchemy.url") or "")
    async with engine.connect() as conn:
        await conn.run_sync(_run)
        await conn.commit()
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata,
                      include_object=_include)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_async())
