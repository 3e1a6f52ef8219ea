"""A stage's logic run on wire bytes, as its consumer runs it, and what it is fed.

`run_on_wire(stage, message, deps)` hands `message` to the stage (or to the gateway's
feedback consumer) as one `FakeDelivery`: an envelope is stamped with the workers' key
(`ADMISSION`, as the gateway admits it) and encoded first; bytes go as they are. It
returns how the handling ended and the delivery, with its nacks and dead letters.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, TypeVar

from shared.auth.admission import Admission
from shared.common.settings import CommonSettings
from shared.contracts.codec import encode
from shared.contracts.pipeline import Admitted, Routed
from shared.contracts.request import AgentRequest
from shared.contracts.routing import Layer, QueryType, RoutingDecision, slot_for
from shared.runtime.consumer import Handler
from shared.runtime.signals import Outcome
from testkit.fakes import FakeDelivery

# The settings the stages under test are built with (no server is reached).
COMMON = CommonSettings(nats_url="nats://unused:4222")
# The workers' shared key: envelopes handed to a stage carry the gateway's stamp.
ADMISSION = Admission(b"contract-tests")

D_contra = TypeVar("D_contra", contravariant=True)


class Bindable(Protocol[D_contra]):
    """A stage, or the gateway's feedback consumer: bound to its deps, a handler."""

    def bind(self, deps: D_contra) -> Handler: ...


class Handled(NamedTuple):
    """One delivery handled: how it ended (a stage's Outcome; None from a consumer that
    reports none) and the delivery, with what the handler did to it."""

    outcome: Outcome | None
    delivery: FakeDelivery


def stamped(env: Admitted | Routed) -> bytes:
    """`env` on the wire as the previous stage hands it over: admitted, encoded."""
    ADMISSION.stamp(env)
    return encode(env)


async def run_on_wire(stage: Bindable[D_contra], message: bytes | Admitted | Routed,
                      deps: D_contra, *, subject: str = "", deliveries: int = 1,
                      stream_seq: int = 1) -> Handled:
    """`message` through `stage` with `deps` as one delivery (its `deliveries`-th) on
    `subject`, stored at `stream_seq` of its stream: an envelope `stamped`, bytes as
    they are."""
    data = message if isinstance(message, bytes) else stamped(message)
    delivery = FakeDelivery(data, subject=subject, deliveries=deliveries,
                            stream_seq=stream_seq)
    outcome = await stage.bind(deps)(delivery)
    return Handled(outcome, delivery)


def request(rid: str, query: str, **fields: Any) -> AgentRequest:
    """A request of agent "a", session "s" unless `fields` (AgentRequest's) say otherwise."""
    return AgentRequest(request_id=rid, session_id=fields.pop("session_id", "s"),
                        agent_id=fields.pop("agent_id", "a"), query=query, **fields)


def routed_decision(qt: QueryType, layer: Layer = Layer.RULES) -> RoutingDecision:
    """A sure routing decision for `qt`, to the slot that serves it."""
    return RoutingDecision(type=qt, layer=layer, confidence=1.0, model_slot=slot_for(qt))
