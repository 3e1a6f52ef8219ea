"""The stage consumer asks again when the server ends its pull with a 409 or a 503 (a
consumer leader elected elsewhere, nobody leading the consumer yet during a cluster
failover): the first refusal at once, repeated ones after a short, bounded backoff, never
left to the watchdog. A hand-written fake client plays the server."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from shared.runtime.consumer import Delivery, StageConsumer, StageSpec

NEXT = "$JS.API.CONSUMER.MSG.NEXT.S.work"


@dataclass
class StatusMsg:
    """A status message as nats-py hands it over: headers, no reply subject."""

    headers: dict[str, str]
    reply: str = ""
    data: bytes = b""
    subject: str = "_INBOX.x"


class FakeJetStream:
    async def add_consumer(self, stream: str, config: Any) -> None:
        return None


@dataclass
class FakeClient:
    """Records the pull requests; `cb` is the consumer's inbox callback."""

    pulls: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    cb: Callable[[Any], Awaitable[None]] | None = None
    is_connected: bool = True
    stats: dict[str, int] = field(default_factory=lambda: {"reconnects": 0})

    def jetstream(self) -> FakeJetStream:
        return FakeJetStream()

    def new_inbox(self) -> str:
        return "_INBOX.x"

    async def subscribe(self, subject: str, cb: Callable[[Any], Awaitable[None]]) -> object:
        self.cb = cb
        return object()

    pulled_event: asyncio.Event = field(default_factory=asyncio.Event)

    async def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        assert subject == NEXT
        self.pulls.append((asyncio.get_running_loop().time(), json.loads(payload)))
        self.pulled_event.set()

    async def pulled(self, count: int, timeout: float) -> None:
        """Until `count` pulls were asked (or `timeout`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self.pulls) < count and loop.time() < deadline:
            self.pulled_event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.pulled_event.wait(), deadline - loop.time())

    async def server_says(self, status: str, description: str = "", **headers: str) -> None:
        assert self.cb is not None
        await self.cb(StatusMsg({"Status": status, "Description": description, **headers}))


async def _nothing(msg: Delivery) -> None:
    return None


async def started(nc: FakeClient) -> StageConsumer:
    spec = StageSpec(stream="S", subject="s", durable="work", max_inflight=8, ack_wait=2.0,
                     max_deliver=3)
    consumer = StageConsumer(nc, spec, _nothing)  # type: ignore[arg-type]
    await consumer.start()
    assert len(nc.pulls) == 1
    return consumer


async def test_a_pull_ended_by_a_leadership_change_is_asked_again_at_once() -> None:
    nc = FakeClient()
    consumer = await started(nc)
    try:
        await nc.server_says("409", "Leadership Change", **{"Nats-Pending-Messages": "8"})
        # No timer in between: the new pull went out while the 409 was handled.
        assert len(nc.pulls) == 2
        assert nc.pulls[1][1]["batch"] == 8
    finally:
        await consumer.stop()


async def test_repeated_no_responders_are_asked_again_quickly_without_a_storm() -> None:
    nc = FakeClient()
    consumer = await started(nc)
    loop = asyncio.get_running_loop()
    try:
        # The server refuses every pull for a second (no consumer leader yet).
        until = loop.time() + 1.0
        answered = 0
        while loop.time() < until:
            if len(nc.pulls) > answered:
                answered = len(nc.pulls)
                await nc.server_says("503")
            await asyncio.sleep(0.005)
        refused = len(nc.pulls)
        gaps = [b[0] - a[0] for a, b in zip(nc.pulls[1:], nc.pulls[2:], strict=False)]
        # Then a leader is there: the next pull goes out within the backoff's cap.
        start = loop.time()
        await nc.pulled(refused + 1, timeout=1.0)
        waited = loop.time() - start
    finally:
        await consumer.stop()
    # Pull 1 at start, 2 at once after the first 503, then 50, 100, 200, 250, 250 ms...
    assert nc.pulls[1][0] - nc.pulls[0][0] < 0.02
    assert 6 <= refused <= 10, refused
    assert max(gaps) <= 0.3, gaps
    assert len(nc.pulls) == refused + 1
    assert waited <= 0.3


async def test_a_heartbeat_after_refusals_makes_the_next_refusal_immediate_again() -> None:
    nc = FakeClient()
    consumer = await started(nc)
    try:
        await nc.server_says("503")
        await nc.server_says("503")  # second in a row: a timer, not at once
        assert len(nc.pulls) == 2
        await asyncio.sleep(0.1)
        assert len(nc.pulls) == 3
        await nc.server_says("100", "Idle Heartbeat")
        await nc.server_says("409", "Leadership Change")
        assert len(nc.pulls) == 4
    finally:
        await consumer.stop()
