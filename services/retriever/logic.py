"""Retrieval for one request: follow-up rewrite, search, relevance check, one retry.

RC-08: at most one reformulation retry; after it, whatever came back is used.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Awaitable, Callable

import msgspec

from services.retriever.ports import RelevanceJudge, Retrieval
from services.retriever.reformulate import is_followup, reformulate_with_hint, rewrite_followup
from services.retriever.relevance import check_relevance
from shared.contracts.pipeline import Passage
from shared.contracts.routing import QueryType

log = logging.getLogger("intentroute.retriever")


# A line of AVAP code that calls a command, optionally assigned (`r = RequestGet(...)`).
_CALL = re.compile(r"^[ \t]*(?:[A-Za-z_]\w*[ \t]*=[ \t]*)?([A-Za-z_]\w*)[ \t]*\(", re.MULTILINE)


def with_editor_commands(query: str, editor_context: str, limit: int = 16) -> str:
    """ "explain this" about the editor's program, searched with the commands it calls
    ("explain this addParam encodeSHA256 ..."): the index's named-section ranking then
    brings each command's own section (on the demo KB, 6 of handler.avap's 11 commands in
    the top 8, against none for "explain this" alone)."""
    names = list(dict.fromkeys(_CALL.findall(editor_context)))[:limit]
    return f"{query} {' '.join(names)}" if names else query


class RelevancePolicy(msgspec.Struct, frozen=True):
    # "embedding" (calibrated signal, default) | "llm" (YES/NO judge) | "off"
    mode: str = "embedding"
    signal: str = "combined"
    threshold: float = math.nan  # NaN = the calibrated default of `signal`
    strategy: str = "broaden"


class Retrieved(msgspec.Struct):
    passages: list[Passage]
    query: str
    retried: bool = False
    signal: float | None = None


async def retrieve(
    query: str,
    query_type: QueryType,
    retrieval: Retrieval,
    *,
    k: int,
    policy: RelevancePolicy,
    last_turns: Callable[[], Awaitable[list[str]]],
    judge: RelevanceJudge | None = None,
) -> Retrieved:
    if is_followup(query):
        query = rewrite_followup(query, await last_turns())
    result = await retrieval.search(query, k)
    # ADR-0009 Decision 2: the relevance check is for RETRIEVAL only; CODE_GENERATION
    # has the parser as its stronger, post-generation signal.
    if query_type != QueryType.RETRIEVAL or policy.mode == "off" or not result.passages:
        return Retrieved(result.passages, query)
    signal: float | None = None
    if policy.mode == "llm" and judge is not None:
        verdict = await judge.relevant(query, result.passages)
        relevant = True if verdict is None else verdict
    else:
        threshold = None if math.isnan(policy.threshold) else policy.threshold
        relevant, signal = check_relevance(result, policy.signal, threshold)
    if relevant:
        return Retrieved(result.passages, query, signal=signal)
    retry_query = reformulate_with_hint(query, result.passages, strategy=policy.strategy)
    log.debug("[retrieve] context insufficient (signal=%s): retrying once with %r",
             signal, retry_query)
    second = await retrieval.search(retry_query, k)
    return Retrieved(second.passages or result.passages, retry_query, retried=True,
                     signal=signal)
