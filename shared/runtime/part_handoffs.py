"""A split message's part is handed on once (issue 34).

The stage that ends part k (its generator, or its validator) hands part k+1 to its
first stage. If it dies after that hand-off and before its own message is acknowledged,
the message is delivered again while part k+1 is already streaming: answering part k
again would put a reset and a second copy of part k's text inside part k+1. So the
hand-off is claimed first: the next part's subject, msg id and stamped envelope are
stored on `intentroute.claim.<agent>.<request_id>.<run>.p<k>` (ANSWER_CLAIMS, sealed
like every claim, only if nothing is stored there), then published. A redelivery of
any of part k's stages that finds the claim publishes it again (under its msg id: a
no-op when the first publish was stored) and answers nothing. Two deliveries ending
part k at once both publish the claim that came first.
"""

from __future__ import annotations

import logging
import uuid

import msgspec

from shared.contracts.pipeline import Admitted, Routed
from shared.contracts.response import CLAIM_STREAM, part_handoff_subject
from shared.runtime.bus import publish_stage
from shared.runtime.ports import Publisher

log = logging.getLogger("intentroute.parts")


class PartHandoff(msgspec.Struct, frozen=True):
    """The next part's hand-off, as published."""

    subject: str
    msg_id: str
    envelope: bytes


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(PartHandoff).decode


def ends_part(env: Admitted | Routed, handed: object) -> bool:
    """Does this hand-off take a split message to its next part?"""
    return (isinstance(env, Routed) and bool(env.parts) and isinstance(handed, Routed)
            and handed.part > env.part)


def _subject(env: Routed) -> str:
    req = env.request
    return part_handoff_subject(req.agent_id, req.request_id, env.run, env.part)


async def claim(bus: Publisher, env: Routed, handoff: PartHandoff) -> PartHandoff:
    """Store `handoff` as part `env.part`'s one hand-off; returns the one to publish:
    `handoff`, or the one another delivery of the part stored first."""
    stored = await bus.publish_first(_subject(env), _encode(handoff), stream=CLAIM_STREAM,
                                     msg_id=uuid.uuid4().hex)
    if stored is None:  # not sealed by a worker: an agent's publish, never trusted
        log.error("[%s] %s holds a forged hand-off; handing on without one",
                  env.request.request_id, _subject(env))
        return handoff
    return _decode(stored)


async def hand_on_again(bus: Publisher, env: Admitted | Routed) -> bool:
    """For a redelivery: True when its part was handed on already, which is published
    again (and nothing else is to be done)."""
    if not isinstance(env, Routed) or not env.parts:
        return False
    stored = await bus.claimed(_subject(env), stream=CLAIM_STREAM)
    if stored is None:
        return False
    handoff = _decode(stored)
    await publish_stage(bus, handoff.subject, handoff.envelope, msg_id=handoff.msg_id)
    return True
