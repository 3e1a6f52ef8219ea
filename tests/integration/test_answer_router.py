"""A door's answers through one subscription per agent (shared/client/answers.py), on a
real nats-server: each request gets its own chunks only, many requests share one
subscription, and it is dropped once the agent has asked nothing for its linger."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared.client.answers import AnswerRouter, RequestInFlightError
from shared.contracts.response import response_subject
from tests.helpers.nats_sync import flushed

AGENT = "tests"


async def test_requests_share_one_subscription_and_get_only_their_own_chunks(
        nc: Any, admin_nc: Any) -> None:
    router = AnswerRouter(nc, linger=0.2)
    async with router.waiting(AGENT, "r1") as one, router.waiting(AGENT, "r2") as two:
        assert router.subscribed() == {AGENT}
        await flushed(nc)
        for rid, text in (("r2", b"two"), ("r0", b"nobody's"), ("r1", b"one")):
            await admin_nc.publish(response_subject(AGENT, rid), text)
        await admin_nc.flush()
        assert (await one.next_msg(5)).data == b"one"
        assert (await two.next_msg(5)).data == b"two"
        assert one.queue.empty()
        assert two.queue.empty()
    assert router.subscribed() == {AGENT}  # lingers for the next request
    await asyncio.sleep(0.5)
    assert router.subscribed() == set()
    async with router.waiting(AGENT, "r3") as three:  # subscribed again
        await flushed(nc)
        await admin_nc.publish(response_subject(AGENT, "r3"), b"three")
        await admin_nc.flush()
        assert (await three.next_msg(5)).data == b"three"
    await router.close()
    assert router.subscribed() == set()


async def test_a_request_asking_again_within_the_linger_keeps_the_subscription(
        nc: Any, admin_nc: Any) -> None:
    router = AnswerRouter(nc, linger=0.3)
    for i in range(3):
        async with router.waiting(AGENT, f"again-{i}") as waiting:
            await flushed(nc)
            await admin_nc.publish(response_subject(AGENT, f"again-{i}"), b"x")
            await admin_nc.flush()
            assert (await waiting.next_msg(5)).data == b"x"
        await asyncio.sleep(0.1)
        assert router.subscribed() == {AGENT}
    await router.close()


async def test_a_second_request_of_an_id_in_flight_is_refused_and_the_first_reads_on(
        nc: Any, admin_nc: Any) -> None:
    # A door's caller chooses its ids: two at once used to share one queue, and the
    # second to leave failed (KeyError: a 500 with a traceback at the OpenAI door).
    router = AnswerRouter(nc, linger=0.2)
    async with router.waiting(AGENT, "same") as first:
        with pytest.raises(RequestInFlightError):
            async with router.waiting(AGENT, "same"):
                pass
        await flushed(nc)
        await admin_nc.publish(response_subject(AGENT, "same"), b"one")
        await admin_nc.flush()
        assert (await first.next_msg(5)).data == b"one"
    async with router.waiting(AGENT, "same"):  # free again once the first is done
        pass
    await router.close()
