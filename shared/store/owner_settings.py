"""The limits the owner's SECURITY DEFINER functions obey, in `owner_settings` (migration
0014): one row only the owner role writes, so no worker can widen what those functions
touch. `shared.store.migrate` writes them after the migrations (`intentroute migrate`,
`up`) from the deployment's settings (`of_common`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg

if TYPE_CHECKING:
    from shared.common.settings import CommonSettings

TABLE = "owner_settings"


@dataclass(frozen=True)
class OwnerSettings:
    # Sessions an agent keeps before the `sessions_cap` trigger expires its least
    # recently used ones (MAX_SESSIONS_PER_AGENT; 0: no cap).
    max_sessions_per_agent: int = 10_000
    # Days of request log no role but the owner may drop a partition of
    # (REQUEST_LOG_HOT_DAYS; `request_log_drop_partition`).
    request_log_hot_days: int = 30
    # Answers the cache keeps per agent (ANSWER_CACHE_MAX_PER_AGENT; 0: none) and the
    # TTL of an agent that sets no `cache_ttl` (ANSWER_CACHE_TTL): `answer_cache_put`.
    answer_cache_per_agent: int = 1000
    answer_cache_ttl_s: float = 86400.0

    @classmethod
    def of_common(cls, common: CommonSettings) -> OwnerSettings:
        return cls(max_sessions_per_agent=common.max_sessions_per_agent,
                   request_log_hot_days=common.log_hot_days,
                   answer_cache_per_agent=common.answer_cache_max_per_agent,
                   answer_cache_ttl_s=common.answer_cache_ttl)


_SQL_WRITE = f"""
INSERT INTO {TABLE} (id, max_sessions_per_agent, request_log_hot_days, answer_cache_per_agent,
                     answer_cache_ttl_s) VALUES (true, $1, $2, $3, $4)
ON CONFLICT (id) DO UPDATE SET max_sessions_per_agent = EXCLUDED.max_sessions_per_agent,
                               request_log_hot_days = EXCLUDED.request_log_hot_days,
                               answer_cache_per_agent = EXCLUDED.answer_cache_per_agent,
                               answer_cache_ttl_s = EXCLUDED.answer_cache_ttl_s
"""


async def write_owner_settings(conn: asyncpg.Connection, settings: OwnerSettings) -> None:
    """Store `settings` (as the owner: no other role may). A negative cap is no cap, a
    hot window under a day is one day (the least retention keeps)."""
    await conn.execute(_SQL_WRITE, max(0, settings.max_sessions_per_agent),
                       max(1, settings.request_log_hot_days),
                       max(0, settings.answer_cache_per_agent),
                       max(0.0, settings.answer_cache_ttl_s))


async def read_owner_settings(conn: asyncpg.Connection) -> OwnerSettings:
    row = await conn.fetchrow(
        f"SELECT max_sessions_per_agent, request_log_hot_days, answer_cache_per_agent, "
        f"answer_cache_ttl_s FROM {TABLE}")
    if row is None:
        return OwnerSettings()
    return OwnerSettings(row["max_sessions_per_agent"], row["request_log_hot_days"],
                         row["answer_cache_per_agent"], row["answer_cache_ttl_s"])
