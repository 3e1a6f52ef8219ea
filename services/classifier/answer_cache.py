"""The answer cache on the classifier (issue 33): right after the routing decision, a
request the cache may answer is looked up in this replica's index of stored answers;
a hit is answered here, like any answer, and goes no further.

Looked up: RETRIEVAL and CODE_GENERATION only, routed clearly (no clarification, no
reference resolved from the session or the editor, no message pointing elsewhere), no
editor or extra context, not degraded, of an agent whose policy has `cache=on`. The
candidates: the agent's own entries, and those of the agents that joined the same
`cache_group` (both with the cache on); of the same type, language, model slot and the
model the request's first step is now (the slot's, or the one it names when its
agent's policy lists it: `shared.cache.answerer`); within both agents' TTL; matched on Layer 2's own
vector of the message (`cache_vectors`) by `shared.cache.match`. A miss costs the
lookup (`cache.lookup` in the request's stage times); the request goes on as before.

A hit: the turn is stored like any answer's (history, the session's messages: the next
CONVERSATIONAL turn refers to it; the request log with `answered_by` "cache", model
"cache", no tokens, `tokens_note` saying what it saved), then the answer streams on the
agent's response subject as one final chunk (`answered_by` "cache", `cached_from`: the
original request and its age). The hit is counted in the background
(`answer_cache_hit`: the entry's use, the request it served, the agent's totals).

The index follows the table: loaded at start, told of each new and deleted entry by
NOTIFY (`shared.cache.listen`), reloaded after the listening connection was lost and
when a promoted head brings another encoder (the stored questions are encoded with the
encoder the messages' vectors come from). While it may be behind (the listening
connection down, a reload pending), nothing is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import asyncpg

from services.classifier.cache_vectors import RememberingLayer2, Vector
from services.classifier.layer1 import points_elsewhere
from shared.cache.answer_index import AnswerIndex, Hit
from shared.cache.answerer import answering_fleet, slot_answerer
from shared.cache.entries import SQL_HIT, CacheEntry, entries_by_id, live_entries
from shared.cache.facts import facts, language
from shared.cache.listen import CacheChanges
from shared.cache.match import thresholds_for
from shared.cache.offer import CACHED_TYPES
from shared.common.settings import CommonSettings
from shared.common.tasks import cancel_and_wait
from shared.contracts.pipeline import Routed, Usage
from shared.contracts.response import CachedFrom
from shared.contracts.routing import Clarity
from shared.policy.agent import AgentPolicy
from shared.policy.ports import Policies
from shared.runtime.answer_stream import AnswerStream
from shared.runtime.endings import answer_usage, finish_turn

if TYPE_CHECKING:
    from shared.runtime.stage import Call, StageDeps

log = logging.getLogger("intentroute.cache")

# `answered_by` and the request log's model of an answer the cache gave.
HIT_BY = "cache"
RETRY_MIN, RETRY_MAX = 0.5, 10.0
HIT_QUEUE = 1024


class ClassifierCache:
    """This replica's index of the stored answers and the lookup (module doc)."""

    def __init__(self, pool: asyncpg.Pool, dsn: str, common: CommonSettings,
                 policies: Policies, vectors: RememberingLayer2) -> None:
        self._pool = pool
        self._common = common
        # The fleet the settings declare, read once: which model answers a slot now.
        self._fleet = answering_fleet(common)
        self._policies = policies
        self._vectors = vectors
        self._encoder = vectors.encoder
        self.index = AnswerIndex(thresholds_for(vectors.layers))
        self._changes = CacheChanges(dsn, on_added=self._added, on_removed=self._removed,
                                     on_resync=self._resync)
        # Entries announced and not fetched yet; ids deleted while a reload ran.
        self._wanted: set[int] = set()
        self._gone_meanwhile: set[int] | None = None
        self._reload = True
        self._kick = asyncio.Event()
        self._hits: asyncio.Queue[tuple[str, str, int]] = asyncio.Queue(maxsize=HIT_QUEUE)
        self._tasks: list[asyncio.Task[None]] = []
        # Set once the index has been loaded from the table; pulsed on every change.
        self.loaded = asyncio.Event()
        self._changed = asyncio.Event()
        self.lookups = 0
        self.hits = 0
        self.reloads = 0

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> ClassifierCache:
        self._changes.start()
        self._kick.set()
        self._tasks = [asyncio.create_task(self._sync(), name="answer-cache-sync"),
                       asyncio.create_task(self._count_hits(), name="answer-cache-hits")]
        return self

    async def close(self) -> None:
        await self._changes.stop()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                await self._hits.join()
        for task in self._tasks:
            await cancel_and_wait(task)
        self._tasks = []

    @property
    def listening(self) -> asyncio.Event:
        return self._changes.listening

    # -- the index follows the table -----------------------------------------------

    def _added(self, entry_id: int) -> None:
        self._wanted.add(entry_id)
        self._kick.set()

    def _removed(self, entry_id: int) -> None:
        self._wanted.discard(entry_id)
        self.index.remove(entry_id)
        self._changed.set()
        if self._gone_meanwhile is not None:
            self._gone_meanwhile.add(entry_id)

    def _resync(self) -> None:
        self._reload = True
        self._kick.set()

    async def _sync(self) -> None:
        wait = RETRY_MIN
        while True:
            await self._kick.wait()
            self._kick.clear()
            try:
                if self._reload:
                    await self._load_all()
                elif self._wanted:
                    await self._load_wanted()
                wait = RETRY_MIN
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store away: try again, the index as it is
                log.warning("[cache] index not synced (%r); retry in %.2gs", exc, wait)
                await asyncio.sleep(wait)
                wait = min(wait * 2, RETRY_MAX)
                self._kick.set()

    async def _vectors_of(self, entries: list[CacheEntry]) -> list[tuple[CacheEntry, Vector]]:
        if not entries:
            return []
        vectors = await self._vectors.encode([e.query for e in entries])
        return list(zip(entries, vectors, strict=True))

    async def _load_all(self) -> None:
        gone: set[int] = set()
        self._gone_meanwhile = gone  # deletions announced while the table is read
        try:
            encoder = self._vectors.encoder
            entries = await live_entries(self._pool)
            fresh = AnswerIndex(thresholds_for(self._vectors.layers))
            for entry, vector in await self._vectors_of(entries):
                if entry.id not in gone:
                    fresh.add(entry, vector)
        finally:
            self._gone_meanwhile = None
        self.index, self._encoder, self._reload = fresh, encoder, False
        self.reloads += 1
        self.loaded.set()
        self._changed.set()
        log.info("[cache] %d answers indexed", len(fresh))
        if self._wanted:
            self._kick.set()

    async def _load_wanted(self) -> None:
        ids = sorted(self._wanted)
        entries = await entries_by_id(self._pool, ids)
        for entry, vector in await self._vectors_of(entries):
            if entry.id in self._wanted:  # not deleted meanwhile
                self.index.add(entry, vector)
        self._wanted.difference_update(ids)
        self._changed.set()

    async def settled(self, done: Callable[[AnswerIndex], bool], timeout: float = 10.0) -> None:
        """Until `done(index)` holds (tests, benchmarks: an entry stored or deleted has
        reached this replica); TimeoutError after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while not done(self.index):
                self._changed.clear()
                await self._changed.wait()

    # -- the request path ------------------------------------------------------------

    def _ttl(self, policy: AgentPolicy) -> float:
        return policy.cache_ttl or self._common.answer_cache_ttl

    def _scope(self, agent: str, policy: AgentPolicy) -> list[str]:
        """Whose entries the agent may be given: its own, and with a cache group those
        of every agent that joined the same group and has the cache on."""
        scope = [agent] if self.index.holds(agent) else []
        if policy.cache_group:
            for owner in self.index.owners():
                other = self._policies.policy_for(owner)
                if owner != agent and other.cache and other.cache_group == policy.cache_group:
                    scope.append(owner)
        return scope

    def _in_sync(self) -> bool:
        """Is the index known to follow the table? Not while the listening connection
        is down (deletions would go unheard) nor until the reload after it is back:
        meanwhile nothing is served (fail closed)."""
        return self._changes.listening.is_set() and not self._reload

    def _eligible(self, env: Routed, policy: AgentPolicy) -> bool:
        req, dec = env.request, env.decision
        return (bool(policy.cache) and self._in_sync() and dec.type in CACHED_TYPES
                and dec.clarity is Clarity.CLEAR and not dec.resolved_reference
                and not (req.editor_context or req.extra_context or env.degraded)
                and len(self.index) > 0)

    async def lookup(self, env: Routed) -> Hit | None:
        """The stored answer that may serve this request, or None (module doc). The
        time it took is the request's `cache.lookup` stage time."""
        started = time.perf_counter()
        req = env.request
        policy = self._policies.policy_for(req.agent_id)
        if not self._eligible(env, policy):
            return None
        hit = None
        scope = self._scope(req.agent_id, policy)
        if scope:
            hit = await self._match(env, policy, scope)
            # A message pointing elsewhere ("explain that") is about the session.
            if hit is not None and points_elsewhere(req.query):
                hit = None
        self.lookups += 1
        env.timings["cache.lookup"] = round((time.perf_counter() - started) * 1000, 3)
        return hit

    async def _match(self, env: Routed, policy: AgentPolicy, scope: list[str]) -> Hit | None:
        if self._vectors.encoder is not self._encoder:
            self._resync()  # a promoted head's encoder: the stored vectors are another's
            return None
        req, dec = env.request, env.decision
        # The model the generator would ask first (the request's, when its A/B arm's
        # policy lists it): only its answers serve.
        model = slot_answerer(self._fleet, dec.model_slot, asked=req.model,
                              policy=self._policies.policy_for(req.agent_id, req.request_id))
        if not model:
            return None
        query = req.query
        vector = await self._vectors.vector(query)
        own_ttl = self._ttl(policy)
        return self.index.lookup(
            scope, query_type=dec.type, lang=language(query), model_slot=dec.model_slot.value,
            model=model, vector=vector,
            question=lambda: facts(query), now=time.time(),
            max_age_s=lambda owner: min(own_ttl, self._ttl(self._policies.policy_for(owner))))

    async def serve(self, env: Routed, call: Call, deps: StageDeps) -> bool:
        """Answer the request from the cache if it may be (True: answered)."""
        hit = await self.lookup(env)
        if hit is None:
            return False
        entry, req = hit.entry, env.request
        env.answered_by = HIT_BY
        if self._common.accounting:
            env.usage = Usage(model=HIT_BY, tokens_note=f"cache: {entry.tokens} tokens saved")
        call.mark(env)
        await finish_turn(deps.store, env, answer=entry.answer, answered_by=HIT_BY,
                          validation_status=entry.validation_status)
        out = AnswerStream(deps.bus, req.agent_id, req.request_id, start_seq=env.seq)
        await out.text(entry.answer)
        await out.final(decision=env.decision, validation_status=entry.validation_status,
                        avap_code=entry.avap_code, answered_by=HIT_BY,
                        usage=answer_usage(env),
                        cached_from=CachedFrom(entry.request_id,
                                               round(max(0.0, time.time() - entry.created_at),
                                                     3)))
        self.hits += 1
        with contextlib.suppress(asyncio.QueueFull):
            self._hits.put_nowait((req.agent_id, req.request_id, entry.id))
        return True

    async def _count_hits(self) -> None:
        while True:
            agent, request, entry = await self._hits.get()
            try:
                async with asyncio.timeout(5.0):
                    await self._pool.fetchval(SQL_HIT, agent, request, entry)
            except Exception as exc:  # a count lost: the answer went out all the same
                log.warning("[cache] hit of %s not counted: %r", request, exc)
            finally:
                self._hits.task_done()
