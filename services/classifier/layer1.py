"""Layer 1 as rule families: which hand-written rule decided a message, and how sure it is.

Each family is a group of rules in rules.py / deixis.py, named so that its precision
can be measured on its own (`intentroute eval rules`, tests/data/rule_paraphrases.jsonl):

    platform_prefix  RC-01 prefix (trusted agents only)      rules.has_platform_prefix
    platform_data    RC-02 account / usage / billing data     rules.has_platform_data
    code_request     asks for code to be written or changed   rules.is_code_request
    social           thanks, greetings, sign-offs             deixis.is_social
    reshape          reshape / continue the previous answer   deixis.is_reshape_request
    deictic          "this" / "eso" resolved through the      deixis.is_deictic +
                     editor context or the intent history     deixis.resolve_reference

A family is *final* when its decision is taken at confidence 1.0 and skips Layer 2,
the clarity gate and Layer 3. RC-01 and RC-02 are final by contract. Any other family
is final only while its measured precision on the paraphrase sets is >= 99%; below
that its decision carries its measured precision (`PRIOR_CONFIDENCE`) so the clarity
gate and Layer 3 can still act (see `cascade.Cascade`): a family that reads the
message alone is a prior multiplied into Layer 2's distribution; a deictic resolution,
which Layer 2 cannot see (it reads the message, not what "this" points at), meets
the gate with its own calibrated confidence.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from services.classifier.deixis import (
    is_deictic,
    is_reshape_request,
    is_social,
    resolve_reference,
)
from services.classifier.rules import (
    has_account_context,
    has_platform_data,
    has_platform_prefix,
    is_code_request,
    strip_platform_prefix,
)
from shared.contracts.routing import HistoryEntry, QueryType


class Family(enum.StrEnum):
    PLATFORM_PREFIX = "platform_prefix"
    PLATFORM_DATA = "platform_data"
    CODE_REQUEST = "code_request"
    SOCIAL = "social"
    RESHAPE = "reshape"
    DEICTIC = "deictic"


# Families whose decision is final (confidence 1.0): RC-01 and RC-02 by contract;
# `social` because its measured precision is >= 99%.
FINAL: frozenset[Family] = frozenset(
    {Family.PLATFORM_PREFIX, Family.PLATFORM_DATA, Family.SOCIAL})

# A non-final family's decision as a calibrated confidence: its precision measured by
# `intentroute eval rules` on tests/data/rule_paraphrases.jsonl and
# rule_paraphrases_fresh.jsonl together (rounded down), see docs/explanation/routing.md,
# "Rules decide only what they are certain of":
#   code_request  55/56 = 0.982  (an account action read as code: "Create a new API key")
#   reshape       69/70 = 0.986  ("list my invoices in a table" read as a reshape)
#   deictic       58/63 = 0.921  (a named subject read as a pointer: "what does this
#                                  keyword mean: endLoop?"; terse reshapes "bullet it")
PRIOR_CONFIDENCE: dict[Family, float] = {
    Family.CODE_REQUEST: 0.98,
    Family.RESHAPE: 0.98,
    Family.DEICTIC: 0.92,
}


class RuleHit(NamedTuple):
    family: Family
    type: QueryType
    resolved_reference: bool = False

    @property
    def final(self) -> bool:
        return self.family in FINAL

    @property
    def confidence(self) -> float:
        return 1.0 if self.final else PRIOR_CONFIDENCE[self.family]


def match_contract(query: str, extra_context: str, *, trusted: bool) -> RuleHit | None:
    """RC-01 (trusted agents only) and RC-02: the contract's hard rules."""
    if trusted and has_platform_prefix(query):
        return RuleHit(Family.PLATFORM_PREFIX, QueryType.PLATFORM)
    if has_platform_data(query, extra_context):
        return RuleHit(Family.PLATFORM_DATA, QueryType.PLATFORM)
    return None


def match_message(query: str) -> RuleHit | None:
    """The families that read the message alone, after the contract's (RC-03: none of
    them looks at the history)."""
    if is_code_request(query):
        return RuleHit(Family.CODE_REQUEST, QueryType.CODE_GENERATION)
    if is_social(query):
        return RuleHit(Family.SOCIAL, QueryType.CONVERSATIONAL)
    if is_reshape_request(query):
        # The taxonomy: reshaping or continuing the previous answer is CONVERSATIONAL
        # whatever the previous turn was, so the history is not read.
        return RuleHit(Family.RESHAPE, QueryType.CONVERSATIONAL, resolved_reference=True)
    return None


def points_elsewhere(query: str) -> bool:
    """The message needs a referent: only then may the history be read (RC-03)."""
    return is_deictic(query)


def match_reference(
    query: str, history: list[HistoryEntry], editor_context: str
) -> RuleHit | None:
    """A deictic message resolved through the editor context or the intent history."""
    referent = resolve_reference(query, history, editor_context)
    if referent is None:
        return None
    return RuleHit(Family.DEICTIC, referent, resolved_reference=True)


def with_account_figures(hit: RuleHit, extra_context: str) -> RuleHit:
    """RC-02 for figures the platform injected: a follow-up that is not about AVAP docs
    or code ("¿y ahora qué hago?" next to usage figures) is a PLATFORM request."""
    if has_account_context(extra_context) and hit.type not in (
        QueryType.RETRIEVAL, QueryType.CODE_GENERATION
    ):
        return RuleHit(Family.PLATFORM_DATA, QueryType.PLATFORM, hit.resolved_reference)
    return hit


def first_rule(
    query: str, history: list[HistoryEntry], *, editor_context: str = "",
    extra_context: str = "", trusted: bool = True,
) -> RuleHit | None:
    """The rule family that decides a message, in the cascade's order (no model). From
    an untrusted agent the RC-01 prefix is ordinary text, and is dropped as the cascade
    drops it."""
    if not trusted and has_platform_prefix(query):
        query = strip_platform_prefix(query)
    hit = match_contract(query, extra_context, trusted=trusted) or match_message(query)
    if hit is None and points_elsewhere(query):
        hit = match_reference(query, history, editor_context)
        if hit is not None:
            hit = with_account_figures(hit, extra_context)
    return hit
