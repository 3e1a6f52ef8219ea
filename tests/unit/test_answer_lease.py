"""When a delivery is surely the only one of its message (its final chunk unclaimed)."""

from __future__ import annotations

import time

from shared.runtime.answer_stream import Lease


def lease(*, first: bool = True, left: float = 10.0, reconnected: list[int]) -> Lease:
    return Lease(first=first, until=time.monotonic() + left,
                 reconnects=lambda: reconnected[0], at_start=0)


def test_the_first_delivery_within_half_its_ack_wait_is_the_only_one() -> None:
    assert lease(reconnected=[0]).sole()


def test_a_redelivery_a_late_delivery_or_a_lost_connection_may_have_company() -> None:
    assert not lease(first=False, reconnected=[0]).sole()
    assert not lease(left=-0.1, reconnected=[0]).sole()
    count = [0]
    held = lease(reconnected=count)
    count[0] = 1  # the connection came back meanwhile: the server may have redelivered
    assert not held.sole()


def test_a_lease_starts_from_the_reconnect_count_and_half_the_ack_wait() -> None:
    count = [3]
    before = time.monotonic()
    held = Lease.start(1, 2.0, lambda: count[0])
    assert held.at_start == 3
    assert before + 1.0 <= held.until <= time.monotonic() + 1.0
    assert held.sole()
    count[0] = 4
    assert not held.sole()
    assert not Lease.start(2, 2.0, lambda: count[0]).sole()
