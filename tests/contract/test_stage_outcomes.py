"""Each way a stage's handling ends is reported as its outcome (the signals the services
API and the metrics count), through one real stage with fakes."""

from __future__ import annotations

import time

from shared.contracts.codec import decode_chunk, encode
from shared.runtime.signals import Outcome
from testkit.fakes import RecordingBus, Sent
from testkit.wire import run_on_wire
from tests.contract.test_stage_template import STAGE, envelope, setup


async def test_outcomes_of_the_stage_template() -> None:
    _, _, _, deps = setup()
    assert (await run_on_wire(STAGE, envelope("o-1"), deps)).outcome == Outcome.OK
    expired = envelope("o-2", deadline=time.time() - 1)
    assert (await run_on_wire(STAGE, expired, deps)).outcome == Outcome.ERROR
    assert (await run_on_wire(STAGE, b"not json", deps)).outcome == Outcome.ERROR

    _, _, _, failing = setup(fail=True)
    retry = envelope("o-3", deadline=time.time() + 60)
    assert (await run_on_wire(STAGE, retry, failing)).outcome == Outcome.RETRY
    last = envelope("o-4", deadline=time.time() + 60)
    assert (await run_on_wire(STAGE, last, failing, deliveries=STAGE.spec.max_deliver)
            ).outcome == Outcome.DEAD_LETTER

    bus = RecordingBus()
    bus.sent.append(Sent("agent.response.a.o-5", "AGENT_RESPONSES", "a:o-5:final:",
                         encode(decode_chunk(b'{"request_id":"o-5","seq":1,"is_final":true}'))))
    _, _, _, answered = setup(bus=bus)
    again = envelope("o-5")
    assert (await run_on_wire(STAGE, again, answered, deliveries=2)).outcome == Outcome.DUPLICATE
