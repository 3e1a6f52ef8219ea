"""The model whose answers a slot gives (the model half of the cache's key): what the
generator's first step is, `answered_by` when that step answered — the model the
request named when its agent's policy lists it (`models=`), else the slot's, a fleet
ref `backend/model` (shared.policy.chain.chosen_model), or `extractive` when the fleet
has no model for the slot (no model server: `make run`).

An answer is stored only when it came from there (anything else fell back: another
model of the agent's chain, the extractive answerer behind a model, a degraded
request); a stored answer serves only a request whose first step is that model. The
fleet is the one the common settings declare (shared.llm.select.open_fleet), read once
by each worker that stores or looks up: the classifier, the generator and the validator
key alike. A generator told to use another fleet than the common settings declare
(GENERATOR_BACKEND=echo, or extractive beside a model server) never matches: nothing of
it is cached. A fleet that cannot be read leaves `slot_answerer` "" (nothing matches).
"""

from __future__ import annotations

import logging

from shared.common.settings import CommonSettings
from shared.contracts.routing import ModelSlot
from shared.llm.fleet import Fleet, FleetError
from shared.llm.select import open_fleet
from shared.policy.agent import AgentPolicy
from shared.policy.chain import EXTRACTIVE, chosen_model

log = logging.getLogger("intentroute.cache")

NO_POLICY = AgentPolicy()


def answering_fleet(common: CommonSettings) -> Fleet | None:
    """The fleet the settings declare, or None when it cannot be read (a FleetError,
    logged once: the cache then stores and serves nothing)."""
    try:
        return open_fleet(common)
    except FleetError as exc:
        log.warning("[cache] no answer is cached: the model fleet cannot be read (%s)", exc)
        return None


def slot_answerer(fleet: Fleet | None, slot: ModelSlot | str, *, asked: str = "",
                  policy: AgentPolicy | None = None) -> str:
    """`answered_by` of an answer the slot's first step gave to a request that named
    `asked` ("" when it named none), for an agent with `policy` (None: one that lists
    no model, so the slot's own model); "" when `fleet` is None."""
    if fleet is None:
        return ""
    slot_model = fleet.slot_model(ModelSlot(slot).value)
    return chosen_model(asked, policy or NO_POLICY, slot_model) or EXTRACTIVE
