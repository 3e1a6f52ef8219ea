"""The classifier's composition root in small steps (as cosmicpython's bootstrap): Layer 2
keeping each message's vector, and the answer cache that matches on those vectors
(issue 33). `app.py` calls them."""

from __future__ import annotations

from contextlib import AsyncExitStack

import asyncpg

from services.classifier.adapters import build_layer2
from services.classifier.answer_cache import ClassifierCache
from services.classifier.cache_vectors import RememberingLayer2
from services.classifier.settings import ClassifierSettings
from shared.policy.ports import Policies
from shared.store import asyncpg_dsn


def build_remembering_layer2(settings: ClassifierSettings,
                             exits: AsyncExitStack) -> RememberingLayer2 | None:
    """Layer 2 as configured, keeping each message's vector for the answer cache (computed
    once); None when Layer 2 is off (CLASSIFIER_HEADS_DIR="")."""
    built = build_layer2(settings)
    if built is None:
        return None
    layer2 = RememberingLayer2(built)
    exits.push_async_callback(layer2.close)
    return layer2


async def open_answer_cache(settings: ClassifierSettings, pool: asyncpg.Pool,
                            policies: Policies, layer2: RememberingLayer2 | None,
                            exits: AsyncExitStack) -> ClassifierCache | None:
    """This replica's index of the stored answers, loading and listening; None without
    Layer 2 (the cache matches on its vectors: nothing is looked up)."""
    if layer2 is None:
        return None
    cache = await ClassifierCache(pool, asyncpg_dsn(settings.common.database_url),
                                  settings.common, policies, layer2).start()
    exits.push_async_callback(cache.close)
    return cache
