"""When a delivery is surely the only one of its message (its final chunk unclaimed):
decided from what the server says of the delivery (its count, when the stream stored
the message), never from when the handler started."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from shared.runtime.answer_stream import CLOCK_SKEW, Lease


def lease(*, first: bool = True, age: float = 0.0, ack_wait: float = 2.0,
          reconnected: list[int]) -> Lease:
    return Lease.start(1 if first else 2, ack_wait, lambda: reconnected[0],
                       stored_at=time.time() - age)


def test_a_first_delivery_of_a_fresh_message_is_the_only_one() -> None:
    assert lease(reconnected=[0]).sole()


def test_a_redelivery_an_old_message_or_a_lost_connection_may_have_company() -> None:
    assert not lease(first=False, reconnected=[0]).sole()
    # Stored longer ago than half the ack wait (less the skew): another delivery may exist.
    assert not lease(age=1.0 - CLOCK_SKEW + 0.01, reconnected=[0]).sole()
    count = [0]
    held = lease(reconnected=count)
    count[0] = 1  # the connection came back meanwhile: the server may have redelivered
    assert not held.sole()


def test_a_message_stored_at_an_unknown_time_has_no_lease() -> None:
    assert not Lease.start(1, 2.0, lambda: 0, stored_at=0.0).sole()


def test_a_delivery_that_waited_in_a_stopped_process_is_not_fresh() -> None:
    # The message was stored and handed to this process at t=100; the process was
    # stopped before its handler ran, and resumed at t=160. The handler starting now
    # changes nothing: what counts is when the server stored the message.
    held = Lease.start(1, 2.0, lambda: 0, stored_at=100.0)
    assert held.sole(now=100.1)
    assert not held.sole(now=160.0)


@given(
    ack_wait=st.floats(min_value=0.05, max_value=120.0),
    stored_at=st.floats(min_value=1.0, max_value=2e9),
    # Arbitrary pauses: before the server first delivered it (a backlog), in the
    # process's buffer (stopped, slow), and in the handler before the final.
    backlog=st.floats(min_value=0.0, max_value=600.0),
    buffered=st.floats(min_value=0.0, max_value=600.0),
    handling=st.floats(min_value=0.0, max_value=600.0),
    skew=st.floats(min_value=-CLOCK_SKEW, max_value=CLOCK_SKEW),
)
def test_a_lease_never_holds_once_a_redelivery_is_possible(
    ack_wait: float, stored_at: float, backlog: float, buffered: float, handling: float,
    skew: float,
) -> None:
    delivered = stored_at + backlog  # the first delivery: never before it was stored
    # The server redelivers no sooner than one ack wait after delivering it.
    earliest_redelivery = delivered + ack_wait
    final_at = delivered + buffered + handling  # by the server's clock
    held = Lease.start(1, ack_wait, lambda: 0, stored_at=stored_at)
    # The worker's clock may differ from the server's by up to CLOCK_SKEW.
    if held.sole(now=final_at + skew):
        assert final_at < earliest_redelivery
