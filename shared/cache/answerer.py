"""The model whose answers a slot gives (part of the cache's key): `answered_by` as the
generator writes it when the slot's first step answered, `<backend>:<model>` on the
configured model server, or `extractive` when there is none (`make run`).

An answer is stored only when it came from there (anything else fell back: another
model of the agent's chain, the extractive answerer behind a model, a degraded
request); a stored answer serves only while the slot still names that model. A
generator told to use another backend than the common settings name (GENERATOR_BACKEND=
echo, or extractive beside a model server) never matches: nothing of it is cached.
"""

from __future__ import annotations

from shared.common.settings import CommonSettings
from shared.contracts.routing import ModelSlot

EXTRACTIVE = "extractive"


def slot_answerer(common: CommonSettings, slot: ModelSlot | str) -> str:
    backend = common.llm_backend
    model = common.slot_model(backend, conversational=ModelSlot(slot) is ModelSlot.CONVERSATIONAL)
    if not backend or not model:
        return EXTRACTIVE
    return f"{backend}:{model}"
