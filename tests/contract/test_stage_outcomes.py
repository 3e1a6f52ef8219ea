"""Each way a stage's handling ends is reported as its outcome (the signals the services
API and the metrics count), through one real stage with fakes."""

from __future__ import annotations

import time

from shared.contracts.codec import decode_chunk, encode
from shared.runtime.signals import Outcome
from tests.contract.fakes import FakeDelivery, RecordingBus, stamped
from tests.contract.test_stage_template import STAGE, envelope, setup


async def test_outcomes_of_the_stage_template() -> None:
    _, _, _, deps = setup()
    assert await STAGE.handle(FakeDelivery(stamped(envelope("o-1"))), deps) == Outcome.OK
    expired = FakeDelivery(stamped(envelope("o-2", deadline=time.time() - 1)))
    assert await STAGE.handle(expired, deps) == Outcome.ERROR
    assert await STAGE.handle(FakeDelivery(b"not json"), deps) == Outcome.ERROR

    _, _, _, failing = setup(fail=True)
    retry = FakeDelivery(stamped(envelope("o-3", deadline=time.time() + 60)))
    assert await STAGE.handle(retry, failing) == Outcome.RETRY
    last = FakeDelivery(stamped(envelope("o-4", deadline=time.time() + 60)),
                        deliveries=STAGE.spec.max_deliver)
    assert await STAGE.handle(last, failing) == Outcome.DEAD_LETTER

    bus = RecordingBus()
    bus.sent.append(("agent.response.a.o-5", "AGENT_RESPONSES", "a:o-5:final:",
                     encode(decode_chunk(b'{"request_id":"o-5","seq":1,"is_final":true}'))))
    _, _, _, answered = setup(bus=bus)
    again = FakeDelivery(stamped(envelope("o-5")), deliveries=2)
    assert await STAGE.handle(again, answered) == Outcome.DUPLICATE
