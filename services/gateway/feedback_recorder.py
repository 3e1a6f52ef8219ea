"""Feedback (ADR-0006): an agent's verdict on one of its own answers.

One entry point: NATS `agent.feedback.<agent_id>` (this module's consumer). The doors'
gRPC `Feedback` and HTTP `POST /agents/{agent_id}/feedback` (services/doors) publish
there on the agent's behalf, once its bearer token is checked, and wait for the ack. The
agent is the subject's (only its credential, or the doors, may publish there), never the
payload's; the decoded verdict goes to `FeedbackRecorder.record`, which answers with a
`FeedbackAck`:

* bad input (a body that does not decode, a bad request id, a grade outside 0..10) is
  refused with the input error codes of requests (MALFORMED_JSON, MISSING_FIELD,
  INVALID_FIELD);
* a request id the agent never sent, its own unknown or another agent's, is refused with
  UNKNOWN_REQUEST (the two are not told apart);
* a verdict on a part (`part`, from 0) of one of its requests that has no such part
  (answered whole, or with fewer parts) is refused with INVALID_FIELD;
* otherwise the verdict is stored, replacing the request's (or the part's) implicit
  outcome or an earlier explicit verdict (a repeat updates, never counts twice), and
  the agent's scores are refreshed shortly after (scoring.py). A verdict on a part is
  that part's alone; how it counts for its request is shared.store.scores'.

Every ack of a verdict on a part names the part, so an agent that sends verdicts on
several parts of one request at once tells their acks apart.

Over NATS the ack goes to `agent.response.<agent_id>._feedback.<request_id>`, which the
agent can read like its answers (`_feedback._invalid` when the body's request id cannot
be read); a subject whose agent part is not a valid id is reported on
`intentroute.invalid`, never answered on a subject built from it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from services.gateway.handlers import GatewayDeps
from services.gateway.ports import FeedbackStore
from shared.auth.permissions import FEEDBACK_DURABLE
from shared.common.settings import CommonSettings
from shared.contracts import feedback as feedback_contract
from shared.contracts.checks import check_feedback, decode_feedback, refused
from shared.contracts.codec import encode
from shared.contracts.feedback import Feedback, FeedbackAck
from shared.contracts.ids import id_problem
from shared.contracts.response import ErrorCode
from shared.runtime.consumer import Handler, StageSpec
from shared.runtime.endings import report_invalid
from shared.runtime.ports import Delivery
from shared.store.ports import StoreUnavailableError

log = logging.getLogger("intentroute.gateway.feedback")

# An unknown request id is looked up again after these delays: an error answer's
# request-log row is written just after its final chunk goes out, so an agent that
# answers at once may be a few milliseconds ahead of it.
UNKNOWN_RETRIES = (0.2, 0.5)


class FeedbackRecorder:
    """Checks and stores one agent's verdict; `on_recorded(agent_id)` is told of each one
    stored (the score refresher marks the agent)."""

    def __init__(
        self,
        store: FeedbackStore,
        *,
        on_recorded: Callable[[str], None] | None = None,
        unknown_retries: Sequence[float] = UNKNOWN_RETRIES,
    ) -> None:
        self._store = store
        self._on_recorded = on_recorded
        self._retries = tuple(unknown_retries)

    async def record(self, agent_id: str, fb: Feedback) -> FeedbackAck:
        """The ack of `agent_id`'s verdict; StoreUnavailableError if the database cannot
        be reached (each entry point answers that its own way)."""
        bad = check_feedback(fb)
        if bad is not None:
            return of_part(bad, fb)
        for delay in (*self._retries, None):
            recorded = await self._store.record_explicit(agent_id, fb)
            if recorded.stored:
                if self._on_recorded is not None:
                    self._on_recorded(agent_id)
                return FeedbackAck(request_id=fb.request_id, accepted=True,
                                   repeat=recorded.repeat, part=fb.part)
            if recorded.no_such_part:
                # Its rows are written in one statement with the request's: no retry.
                return of_part(refused(
                    fb.request_id, ErrorCode.INVALID_FIELD,
                    f"request '{fb.request_id}' has no part {fb.part} (parts are numbered "
                    "from 0 as its answer's part markers are; a request answered whole "
                    "has none)"), fb)
            if delay is not None:
                await asyncio.sleep(delay)
        return of_part(refused(
            fb.request_id, ErrorCode.UNKNOWN_REQUEST,
            f"request '{fb.request_id}' is not one of agent '{agent_id}'s requests"), fb)


def of_part(ack: FeedbackAck, fb: Feedback | FeedbackAck) -> FeedbackAck:
    """`ack` naming the part `fb` is a verdict on (unchanged for a whole request, or a
    body that did not decode)."""
    if isinstance(fb, FeedbackAck) or fb.part is None:
        return ack
    return msgspec.structs.replace(ack, part=fb.part)


# ---- NATS: agent.feedback.<agent_id> -------------------------------------------------


@dataclass(frozen=True)
class FeedbackConsumer:
    """The gateway's second durable consumer: every agent's feedback (AGENT_FEEDBACK)."""

    spec: StageSpec

    def bind(self, deps: GatewayDeps) -> Handler:
        async def handler(msg: Delivery) -> None:
            await on_feedback(msg, deps, max_deliver=self.spec.max_deliver)

        return handler


def build_feedback_consumer(common: CommonSettings, *, max_inflight: int) -> FeedbackConsumer:
    return FeedbackConsumer(StageSpec(
        stream=feedback_contract.STREAM,
        subject=feedback_contract.SUBJECTS,
        durable=FEEDBACK_DURABLE,
        max_inflight=max_inflight,
        ack_wait=common.ack_wait,
        max_deliver=common.max_deliver,
    ))


async def on_feedback(msg: Delivery, deps: GatewayDeps, *, max_deliver: int) -> None:
    """Decode, record, acknowledge to the agent. The store unreachable is retried
    (nack with backoff); on the last allowed delivery the agent is told
    STORE_UNAVAILABLE and the message is dead-lettered."""
    agent = feedback_contract.agent_of(msg.subject)
    problem = id_problem("agent_id", agent)
    if problem:
        await report_invalid(deps.bus, msg.subject, ErrorCode.INVALID_FIELD,
                             f"feedback subject without a valid agent: {problem}")
        return
    decoded = decode_feedback(msg.data)
    info = await deps.agents.get(agent)
    if info is None or info.revoked:
        # Addressed to the verdict's request id wherever the body names it (salvaging
        # reads only the first 4 KiB of a body that does not decode).
        rid = decoded.request_id if not id_problem("request_id", decoded.request_id) else ""
        ack = of_part(refused(rid, ErrorCode.UNKNOWN_AGENT,
                              f"agent '{agent}' is unknown or revoked"), decoded)
    else:
        if isinstance(decoded, FeedbackAck):
            ack = decoded
        else:
            try:
                ack = await deps.feedback.record(agent, decoded)
            except StoreUnavailableError as exc:
                if msg.deliveries < max_deliver:
                    log.warning("[feedback] store unreachable on delivery %d: %s",
                                msg.deliveries, exc)
                    await msg.nack(delay=min(0.2 * 2 ** (msg.deliveries - 1), 2.0))
                    return
                ack = of_part(refused(decoded.request_id, ErrorCode.STORE_UNAVAILABLE,
                                      str(exc)), decoded)
                await publish_ack(deps, agent, ack)
                await msg.dead_letter(FEEDBACK_DURABLE, f"store unreachable: {exc}")
                return
    if not ack.accepted:
        log.info("[feedback] %s of agent %r refused: %s %s", ack.request_id or "?", agent,
                 ack.error_code, ack.message)
    await publish_ack(deps, agent, ack)


async def publish_ack(deps: GatewayDeps, agent: str, ack: FeedbackAck) -> None:
    """On the agent's `_feedback.<request_id>`, or `_feedback._invalid` when the verdict's
    request id cannot be part of a subject."""
    rid = ack.request_id if not id_problem("request_id", ack.request_id) else (
        feedback_contract.INVALID_ACK_ID)
    # Core publish: stored by AGENT_RESPONSES all the same, and a repeat's ack is not
    # dropped as a duplicate of the first.
    await deps.bus.publish(feedback_contract.ack_subject(agent, rid), encode(ack))
