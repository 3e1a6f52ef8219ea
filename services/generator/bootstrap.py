"""The generator's composition root in small steps (as cosmicpython's bootstrap): the
answer cache's writer (issue 33); the fleet's walker, its probes and circuits are
backends.py's. `app.py` calls them."""

from __future__ import annotations

from contextlib import AsyncExitStack

import asyncpg

from services.generator.settings import GeneratorSettings
from shared.cache.offer import CacheWriter
from shared.contracts.routing import ModelSlot
from shared.policy.ports import Policies


def open_answer_cache(settings: GeneratorSettings, pool: asyncpg.Pool, policies: Policies,
                      exits: AsyncExitStack) -> CacheWriter | None:
    """The writer that stores the answers the cache may keep, on the main slot (the
    cached types' slot, RC-05: RETRIEVAL and CODE_GENERATION); None on the other."""
    if settings.slot is not ModelSlot.MAIN:
        return None
    writer = CacheWriter(pool, settings.common, policies=policies)
    exits.push_async_callback(writer.close)
    return writer
