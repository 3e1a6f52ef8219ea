"""Which finished answers the cache stores, and the writer that stores them.

Only an agent's own answer, complete and clean (issue 33): a RETRIEVAL answer the
generator finished or a CODE_GENERATION answer the validator passed as VALID, by the
request's first model (`shared.cache.answerer`: the model it named when its agent's
policy lists it, else the slot's; not a fallback, not a degraded request's extractive
answer), to a request without editor or extra context, routed clearly (no
clarification, no reference resolved from the session), whose retrieval searched the
question itself (no follow-up rewritten from the session, no retried reformulation) and
found passages, with something to match on. Everything else is never offered.

The store is best effort and never on the answer's path: the stage offers the answer
after its final chunk went out; a bounded queue feeds one background writer calling
`answer_cache_put`, which checks again what the database knows (the agent's policy,
the sources' versions, a verdict already given). A full queue or an unreachable
database drops the offer: the next asking generates again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from typing import Any

import asyncpg
import msgspec

from shared.cache.answerer import answering_fleet, slot_answerer
from shared.cache.entries import SQL_PUT
from shared.cache.facts import facts
from shared.cache.match import matchable
from shared.common.settings import CommonSettings
from shared.common.tasks import cancel_and_wait
from shared.contracts.pipeline import Passage, Routed
from shared.contracts.response import ValidationStatus
from shared.contracts.routing import Clarity, QueryType
from shared.llm.fleet import Fleet
from shared.policy.agent import AgentPolicy
from shared.policy.ports import Policies

log = logging.getLogger("intentroute.cache")

CACHED_TYPES = frozenset({QueryType.RETRIEVAL, QueryType.CODE_GENERATION})
# Characters per token, to estimate what an answer took when no model counted it (the
# extractive answerer): the prompt a model would have read, and the answer.
CHARS_PER_TOKEN = 4
PUT_TIMEOUT = 5.0


class Offer(msgspec.Struct, frozen=True, kw_only=True):
    """An answer the cache may store (the arguments of `answer_cache_put`)."""

    agent_id: str
    request_id: str
    query: str
    query_type: str
    lang: str
    model_slot: str
    model: str
    answer: str
    avap_code: str
    validation_status: str
    sources: list[str]
    versions: list[str]
    tokens: int
    tokens_estimated: bool
    accepted_at: float

    def args(self) -> tuple[Any, ...]:
        return (self.agent_id, self.request_id, self.query, self.query_type, self.lang,
                self.model_slot, self.model, self.answer, self.avap_code,
                self.validation_status, self.sources, self.versions, self.tokens,
                self.tokens_estimated, self.accepted_at)


def source_of(passage: Passage) -> str:
    """The document a passage came from, as an ingest names it (its file; a BEIR row's
    `file#id` is its file: services.retriever.indexing.documents.source_file)."""
    return passage.source.partition("#")[0] or passage.doc_id


def _sources(passages: list[Passage]) -> tuple[list[str], list[str]]:
    """The documents used and, for each, a hash of the passages of it the answer used."""
    texts: dict[str, list[str]] = {}
    for p in passages:
        texts.setdefault(source_of(p), []).append(p.text)
    names = sorted(texts)
    versions = [hashlib.sha1("\x1f".join(texts[n]).encode()).hexdigest()[:16] for n in names]
    return names, versions


def refusal(env: Routed, fleet: Fleet | None, *, answered_by: str,
            policy: AgentPolicy | None = None, validation_status: str = "",
            answer: str = "") -> str:
    """Why a finished answer may not be stored ("" when it may: module doc). `fleet` and
    `policy` (the agent's; None where the stage does not read it: the slot's own model
    only) say which model the request's first step was (`shared.cache.answerer`)."""
    req, dec = env.request, env.decision
    if dec.type not in CACHED_TYPES:
        return f"type {dec.type.value}"
    if env.degraded:
        return "degraded"
    if env.parts:  # a part of a message of several requests: its request id is the message's
        return "a part of a split message"
    if req.editor_context or req.extra_context:
        return "context"
    if dec.clarity is not Clarity.CLEAR or dec.resolved_reference:
        return "routing unclear or a reference resolved"
    first = slot_answerer(fleet, dec.model_slot, asked=req.model, policy=policy)
    if not first or answered_by != first or (env.usage is not None and env.usage.fallback):
        return f"answered by {answered_by or 'nobody'}, not the slot's model"
    if dec.type is QueryType.CODE_GENERATION and validation_status != ValidationStatus.VALID:
        return f"validation {validation_status}"
    if not env.passages:
        return "no passages"
    if env.retrieval_retried or env.retrieval_query not in ("", req.query):
        return "retrieval rewrote the question"
    if not answer.strip():
        return "empty answer"
    if not matchable(facts(req.query)):
        return "nothing to match on"
    return ""


def offer_of(env: Routed, fleet: Fleet | None, *, answer: str, answered_by: str,
             policy: AgentPolicy | None = None, validation_status: str = "",
             avap_code: str = "") -> Offer | None:
    """The offer of a finished answer, or None when it may not be stored (module doc)."""
    why = refusal(env, fleet, answered_by=answered_by, policy=policy,
                  validation_status=validation_status, answer=answer)
    if why:
        log.debug("[cache] %s not offered: %s", env.request.request_id, why)
        return None
    req, dec = env.request, env.decision
    question = facts(req.query)
    sources, versions = _sources(env.passages)
    tokens = (env.usage.tokens_in + env.usage.tokens_out) if env.usage is not None else 0
    estimated = tokens <= 0
    if estimated:
        read = len(req.query) + sum(len(p.title) + len(p.text) for p in env.passages)
        tokens = (read + len(answer)) // CHARS_PER_TOKEN
    return Offer(agent_id=req.agent_id, request_id=req.request_id, query=req.query,
                 query_type=dec.type.value, lang=question.lang,
                 model_slot=dec.model_slot.value, model=answered_by,
                 answer=answer.replace("\x00", ""), avap_code=avap_code.replace("\x00", ""),
                 validation_status=validation_status, sources=sources, versions=versions,
                 tokens=tokens, tokens_estimated=estimated, accepted_at=env.accepted_at)


class CacheWriter:
    """Stores offered answers in the background (`offer` never waits). `policies`: the
    agents' policies where the stage reads them (the generator; the validator does not,
    so it stores only the slot's own model's answers, and `answer_cache_put` checks the
    agent has the cache on). The fleet is the settings', read once (`fleet` in tests)."""

    def __init__(self, pool: asyncpg.Pool, common: CommonSettings, *,
                 policies: Policies | None = None, fleet: Fleet | None = None,
                 queue_size: int = 256) -> None:
        self._pool = pool
        self._fleet = answering_fleet(common) if fleet is None else fleet
        self._policies = policies
        self._queue: asyncio.Queue[Offer] = asyncio.Queue(maxsize=queue_size)
        self._task: asyncio.Task[None] | None = None
        self.stored = 0
        self.dropped = 0

    def offer(self, env: Routed, *, answer: str, answered_by: str,
              validation_status: str = "", avap_code: str = "") -> Offer | None:
        """Queue the answer for the store if it may be stored (and the agent's policy,
        where this stage reads it, has the cache on); returns what was queued."""
        policy = None
        if self._policies is not None:
            req = env.request
            if not self._policies.policy_for(req.agent_id).cache:
                return None
            # The request's own (its A/B arm's): the one the generator chose its model by.
            policy = self._policies.policy_for(req.agent_id, req.request_id)
        offered = offer_of(env, self._fleet, answer=answer, answered_by=answered_by,
                           policy=policy, validation_status=validation_status,
                           avap_code=avap_code)
        if offered is None:
            return None
        try:
            self._queue.put_nowait(offered)
        except asyncio.QueueFull:
            self.dropped += 1
            return None
        self.start()
        return offered

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="answer-cache-writer")

    async def _run(self) -> None:
        while True:
            offered = await self._queue.get()
            try:
                async with asyncio.timeout(PUT_TIMEOUT):
                    entry = await self._pool.fetchval(SQL_PUT, *offered.args())
                if entry is not None:
                    self.stored += 1
            except Exception as exc:  # best effort: a lost entry costs one generation
                self.dropped += 1
                log.warning("[cache] %s not stored: %r", offered.request_id, exc)
            finally:
                self._queue.task_done()

    async def flush(self) -> None:
        """Until every queued offer was tried (tests, shutdown)."""
        if self._task is not None:
            await self._queue.join()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(PUT_TIMEOUT):
                await self.flush()
        await cancel_and_wait(self._task)
        self._task = None
