"""The gateway's fair scheduling as pure logic (a fake clock), and the grants it needs."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from services.gateway.fairshare import (
    RECHECK,
    RING_GRACE,
    DrainRate,
    FairScheduler,
    Hops,
    Residence,
    Stranded,
    pipeline_bound,
    pipeline_room,
    stranded_now,
)
from shared.auth.permissions import WORKER_GRANTS, ops_permissions, service_permissions


class Backlogs:
    """Agents' waiting requests; `turn` plays one pull the scheduler chose."""

    def __init__(self, sched: FairScheduler, **waiting: int) -> None:
        self.sched = sched
        self.waiting = dict(waiting)
        self.taken: list[str] = []
        for agent in waiting:
            sched.wake(agent, 0.0)

    def turn(self, room: int = 100, now: float = 0.0) -> tuple[str, int] | None:
        choice = self.sched.pick(room)
        if choice is None:
            return None
        agent, asked = choice
        got = min(asked, self.waiting.get(agent, 0))
        self.waiting[agent] = self.waiting.get(agent, 0) - got
        self.taken += [agent] * got
        self.sched.served(agent, asked, got, now)
        return agent, got


def _sched(quantum: int = 4, **weights: float) -> FairScheduler:
    return FairScheduler(quantum=quantum, weight=lambda agent: weights.get(agent, 1.0))


def test_agents_take_turns_of_one_quantum_whatever_their_backlogs() -> None:
    q = Backlogs(_sched(), flood=1000, b=8, c=8)
    for _ in range(6):
        q.turn()
    # Round robin by quantum: the flood's 1000 never hold b and c back.
    assert q.taken == ["flood"] * 4 + ["b"] * 4 + ["c"] * 4 + ["flood"] * 4 + ["b"] * 4 + \
        ["c"] * 4


def test_weights_share_the_admissions_in_proportion() -> None:
    q = Backlogs(_sched(quantum=2, heavy=2.0, light=1.0, tenth=0.1),
                 heavy=10_000, light=10_000, tenth=10_000)
    while len(q.taken) < 6_300:
        q.turn()
    counts = Counter(q.taken)
    assert counts["heavy"] / counts["light"] == pytest.approx(2.0, rel=0.02)
    assert counts["light"] / counts["tenth"] == pytest.approx(10.0, rel=0.05)


def test_a_pull_never_takes_more_than_the_room_left() -> None:
    q = Backlogs(_sched(quantum=8), a=100)
    assert q.turn(room=3) == ("a", 3)
    assert q.sched.pick(0) is None
    assert q.turn(room=100) == ("a", 5)  # the rest of its quantum, then a fresh one


def test_a_newly_active_agent_goes_before_the_busy_ones() -> None:
    q = Backlogs(_sched(), a=1000, b=1000)
    q.turn()
    q.turn()
    q.taken.clear()
    q.waiting["victim"] = 1
    q.sched.wake("victim", 1.0, rang=True)
    q.turn()
    assert q.taken == ["victim"]  # next turn, not after a whole round of a and b
    q.turn()
    assert q.taken == ["victim", "a", "a", "a", "a"]
    assert "victim" not in q.sched.active  # found empty: out of the round


def test_an_idle_agent_earns_no_credit() -> None:
    q = Backlogs(_sched(), a=1000, b=2)
    for _ in range(4):
        q.turn()
    assert q.taken.count("b") == 2
    assert "b" not in q.sched.active
    # Later b floods too: it gets one quantum a turn like a (plus the one quantum a newly
    # active agent gets first), not the credit of the rounds it sat out.
    q.waiting["b"] = 1000
    q.sched.wake("b", 5.0)
    q.taken.clear()
    for _ in range(100):
        q.turn()
    counts = Counter(q.taken)
    assert counts["a"] + counts["b"] == 400
    assert abs(counts["a"] - counts["b"]) <= 2 * q.sched.quantum


def test_an_agent_rung_before_its_request_was_stored_is_looked_at_again() -> None:
    sched = _sched()
    q = Backlogs(sched)
    sched.wake("b", 10.0, rang=True)
    assert q.turn(now=10.0) == ("b", 0)  # the doorbell beat the stream
    assert not sched
    assert sched.next_recheck() == pytest.approx(10.0 + RECHECK[0])
    assert sched.due(10.0) == []  # not yet
    assert sched.due(10.0 + RECHECK[0]) == ["b"]
    q.waiting["b"] = 1  # stored now
    assert q.turn(now=10.01) == ("b", 1)
    assert sched.next_recheck() is None


def test_looks_again_stop_after_the_last_delay_or_the_grace() -> None:
    sched = _sched()
    q = Backlogs(sched)
    sched.wake("b", 0.0, rang=True)
    now = 0.0
    for delay in RECHECK:
        q.turn(now=now)
        now += delay
        assert sched.due(now) == ["b"]
    q.turn(now=now)
    assert sched.next_recheck() is None  # every look found nothing: left to the scan
    sched.wake("c", 0.0, rang=True)
    q.turn(now=RING_GRACE + 1)  # empty long after its doorbell: nothing to wait for
    assert sched.next_recheck() is None


def test_a_weight_that_cannot_be_read_is_the_default_share() -> None:
    def broken(agent: str) -> float:
        raise RuntimeError("policy store away")

    sched = FairScheduler(quantum=3, weight=broken)
    sched.wake("a", 0.0)
    assert sched.pick(10) == ("a", 3)
    assert _sched(zero=0.0).weight("zero") == 1.0


def _matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` one token, `>` the rest."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or token not in ("*", have[i]):
            return False
    return len(want) == len(have)


def test_the_gateway_may_run_one_consumer_per_agent_and_nothing_else_there() -> None:
    from services.gateway.handlers import build_stage
    from services.gateway.settings import GatewaySettings
    from shared.contracts.request import request_subject
    from shared.runtime.consumer import agent_consumer_name

    spec = build_stage(GatewaySettings.from_env({})).spec
    assert spec.per_agent
    assert WORKER_GRANTS["gateway"].per_agent
    publish = service_permissions("gateway").publish
    name = agent_consumer_name(spec.durable, "alice")
    config = dataclasses.replace(spec.consumer_config(), name=name,
                                 filter_subject=request_subject("alice"))
    # What the fair consumer sends: create (the form nats-py uses), pull, ack; delete
    # the catch-all; list for the lag.
    allowed = [
        f"$JS.API.CONSUMER.CREATE.{spec.stream}.{config.name}.{config.filter_subject}",
        f"$JS.API.CONSUMER.MSG.NEXT.{spec.stream}.{name}",
        f"$JS.ACK.{spec.stream}.{name}.1.1.1.1700000000.0",
        f"$JS.API.CONSUMER.DELETE.{spec.stream}.gateway",
        f"$JS.API.CONSUMER.LIST.{spec.stream}",
        "$JS.API.STREAM.INFO.INTENTROUTE_PIPELINE",  # the pipeline's backlog
        # What the stages' consumers delivered and what their live replicas hold.
        "$JS.API.CONSUMER.LIST.INTENTROUTE_PIPELINE",
        "$SRV.STATS",
    ]
    for subject in allowed:
        assert any(_matches(p, subject) for p in publish), subject
    refused = [
        f"$JS.API.CONSUMER.DELETE.{spec.stream}.{name}",  # only the catch-all goes
        f"$JS.API.CONSUMER.CREATE.{spec.stream}.x.agent.request.alice.more",
        "$JS.API.CONSUMER.CREATE.INTENTROUTE_PIPELINE.x.intentroute.stage.classify",
        "$JS.API.CONSUMER.MSG.NEXT.INTENTROUTE_PIPELINE.classifier",
        f"$JS.API.STREAM.PURGE.{spec.stream}",
        "$JS.API.CONSUMER.DELETE.INTENTROUTE_PIPELINE.classifier",
        "$SRV.STATS.intentroute-classifier.x",  # the stats only, of every service
    ]
    for subject in refused:
        assert not any(_matches(p, subject) for p in publish), subject
    # The doorbell: every publication on agent.request.*.
    assert "agent.request.*" in service_permissions("gateway").subscribe
    # The ops reader sums the gateway's lag from the consumer list, and only reads.
    assert f"$JS.API.CONSUMER.LIST.{spec.stream}" in ops_permissions().publish



def test_the_pipeline_bound_follows_the_drain_rate_and_never_falls_below_the_floor() -> None:
    drain = DrainRate()
    assert pipeline_bound(8, 0.1, drain.rate) == 8  # nothing measured yet: the floor
    # 2,000 pipeline messages acknowledged a second, read every 10 ms for 5 s.
    stored = 0
    for step in range(500):
        stored += 20
        drain.observe(step * 0.01, stored, 50)
    assert 1900 <= drain.rate <= 2000
    assert 190 <= pipeline_bound(8, 0.1, drain.rate) <= 200  # 0.1 s of work
    # The pipeline stalls: the rate decays, the bound returns to the floor.
    for step in range(500, 1100):
        drain.observe(step * 0.01, stored, 50)
    assert drain.rate < 10
    assert pipeline_bound(8, 0.1, drain.rate) == 8


def test_the_rate_does_not_depend_on_how_often_the_stream_is_read() -> None:
    rates = []
    for interval in (0.01, 0.5):
        drain, stored, now = DrainRate(), 0, 0.0
        while now < 5.0:
            now += interval
            stored += round(300 * interval)  # 300 a second
            drain.observe(now, stored, 7)
        rates.append(drain.rate)
    assert rates[0] == pytest.approx(300, rel=0.02)
    assert rates[1] == pytest.approx(300, rel=0.02)


def test_the_bound_counts_requests_not_the_hops_each_makes() -> None:
    # 600 requests a second, each three hops (classify, retrieve, generate): the stream
    # drains 1,800 messages a second while holding one message per request.
    drain, hops = DrainRate(), Hops()
    assert hops.value == 1.0  # nothing measured yet
    stored = delivered = entered = 0
    for step in range(500):
        now = step * 0.01
        stored, delivered, entered = stored + 18, delivered + 18, entered + 6
        drain.observe(now, stored, 60)
        if step % 20 == 0:  # the holdings are read every 0.2 s
            hops.observe(now, delivered, entered)
    assert 2.9 <= hops.value <= 3.0
    requests = drain.rate / hops.value
    assert 590 <= requests <= 610
    # 0.1 s of waiting is 60 requests admitted ahead, not the 180 the message rate said
    # (measured: victims of a flood waited ~250 ms at the generator's queue).
    assert 59 <= pipeline_bound(8, 0.1, requests) <= 61


def test_hops_skip_a_recreated_consumer_and_a_quiet_entry() -> None:
    hops = Hops(window=0.5)
    hops.observe(0.0, 100, 50)
    hops.observe(1.0, 400, 150)  # 300 deliveries for 100 entries
    assert 2.5 <= hops.value <= 3.0
    settled = hops.value
    hops.observe(2.0, 10, 5)  # a consumer recreated: its counter restarted
    assert hops.value == settled
    hops.observe(3.0, 40, 5)  # nothing entered (a stage's redeliveries): no reading
    assert hops.value == settled
    hops.observe(4.0, 70, 20)  # 60 deliveries since the last counted reading, 15 entries
    assert 3.0 < hops.value <= 4.0
    hops.observe(5.0, 80, 30)  # fewer deliveries than entries never makes it under one
    assert hops.value >= 1.0


def test_without_a_delay_the_bound_is_the_fixed_backlog() -> None:
    assert pipeline_bound(8, 0.0, 5000.0) == 8


def _drained(rate: float, seconds: float = 5.0, present: int = 14) -> DrainRate:
    """A DrainRate fed `rate` pipeline messages acknowledged a second, read every 10 ms."""
    drain, stored = DrainRate(), 0.0
    for step in range(int(seconds / 0.01)):
        stored += rate * 0.01
        drain.observe(step * 0.01, round(stored), present)
    return drain


def _held_at_floor(residence: Residence, drain: DrainRate, present: int, seconds: float,
                   start: float = 0.0, floor: int = 8) -> None:
    now = start
    while now < start + seconds:
        at_floor = pipeline_bound(floor, 0.1, drain.rate, residence.seconds) <= floor
        residence.observe(now, present, drain.rate, floor, at_floor)
        now += 0.01


def test_a_stage_that_takes_long_but_many_at_once_gets_what_its_rate_needs() -> None:
    # `bench chaos` at the floor: 8 messages, one request in three of them generating for
    # 0.4 s (many at once): 20 requests a second, 60 stage messages, 8 / 60 s a message.
    residence = Residence()
    drain = _drained(60.0, present=8)
    assert pipeline_bound(8, 0.1, drain.rate) == 8  # 0.1 s of the rate: under the floor
    _held_at_floor(residence, drain, 8, 1.0)
    assert residence.seconds == 0.0  # not settled yet
    _held_at_floor(residence, drain, 8, 1.0, start=1.0)
    assert residence.seconds == pytest.approx(8 / 60, rel=0.02)
    # The bound now holds what the stages take at that rate and 0.1 s more, and grows
    # with the rate: at the 40 requests a second offered (120 messages), 16 generating
    # and 12 more, where it stayed at the floor's 8 (20 requests a second) without it.
    assert pipeline_bound(8, 0.1, drain.rate, residence.seconds) == 13
    assert pipeline_bound(8, 0.1, 120.0, residence.seconds) == 28
    assert pipeline_bound(8, 0.1, 120.0) == 12


def test_a_flood_through_a_fast_pipeline_never_sets_the_residence() -> None:
    # A flood leaves the floor at once (0.1 s of 600 messages a second is 60): every
    # message present then is waiting the bound allowed, not service.
    residence = Residence()
    drain = _drained(600.0, present=60)
    _held_at_floor(residence, drain, 60, 5.0)
    assert residence.seconds == 0.0
    assert pipeline_bound(8, 0.1, drain.rate, residence.seconds) == pipeline_bound(
        8, 0.1, drain.rate)
    # Nor does a pipeline holding a few, or draining nothing.
    residence.observe(0.0, 3, 50.0, 8, at_floor=True)
    residence.observe(5.0, 3, 50.0, 8, at_floor=True)
    residence.observe(6.0, 20, 0.0, 8, at_floor=True)
    residence.observe(9.0, 20, 0.0, 8, at_floor=True)
    assert residence.seconds == 0.0
    assert pipeline_bound(8, 0.0, 1000.0, 0.5) == 8  # no delay: the fixed backlog


def test_after_a_kill_admission_does_not_wait_for_the_dead_replicas_messages() -> None:
    # 140 stage messages acknowledged a second (the bound 0.1 s of it); a generator
    # replica killed holding 8 (0.4 s of echo generation each).
    drain = _drained(140.0)
    bound = pipeline_bound(8, 0.1, drain.rate)
    assert bound == 13
    live = 9  # what the live replicas hold, all delivered
    assert pipeline_room(bound, live, 0) == 4  # before the kill
    held = Stranded()
    both = {"classifier": {"c1", "c2"}, "generator-main": {"g1", "g2"}}
    held.observe(0.0, {"classifier": 1, "generator-main": live - 1},
                 {"classifier": 1, "generator-main": live - 1}, both)
    # After: g2 is gone; the stream still holds its 8 until their ack wait (2 s).
    ack_pending = {"classifier": 1, "generator-main": live - 1 + 8}
    answering = {"classifier": 1, "generator-main": live - 1}
    left = {"classifier": {"c1", "c2"}, "generator-main": {"g1"}}
    outstanding = live + 8
    # Counted, they fill the bound: no admission until they are redelivered.
    assert pipeline_room(bound, outstanding, held.count) < 0
    held.observe(0.2, ack_pending, answering, left)
    assert held.count == 0  # the least of the last two readings: one is not enough
    held.observe(0.4, ack_pending, answering, {**left, "generator-main": {"g1", "g3"}})
    assert held.count == 8  # g3, its restart, holds none of them
    assert pipeline_room(bound, outstanding, held.count) == 4  # as before the kill
    # Redelivered, the live replicas hold them: counted again.
    held.observe(2.2, ack_pending, {**answering, "generator-main": live - 1 + 8}, left)
    assert held.count == 0
    assert pipeline_room(bound, outstanding, held.count) == bound - outstanding


def test_a_reply_missed_once_or_a_reading_failed_leaves_nothing_out() -> None:
    held, both, one = Stranded(), {"classifier": {"a", "b"}}, {"classifier": {"a"}}
    held.observe(0.0, {"classifier": 5}, {"classifier": 5}, both)
    held.observe(0.2, {"classifier": 5}, {"classifier": 1}, one)  # b answered late
    assert held.count == 0
    held.observe(0.4, {"classifier": 5}, {"classifier": 1}, one)
    assert held.count == 4
    held.unknown()
    assert held.count == 0
    # Forgotten after GONE_MEMORY: by then its messages were redelivered long ago.
    held.observe(20.0, {"classifier": 5}, {"classifier": 1}, one)
    held.observe(20.2, {"classifier": 5}, {"classifier": 1}, one)
    assert held.count == 0


def test_a_busy_replica_s_unread_deliveries_are_not_stranded() -> None:
    # Every replica answers: what the server delivered and they have not read yet (a
    # stage saturated under a flood) is theirs, not a dead replica's.
    held, both = Stranded(), {"retriever": {"r1", "r2"}}
    for at in (0.0, 0.2, 0.4):
        held.observe(at, {"retriever": 40}, {"retriever": 12}, both)
    assert held.count == 0


def test_a_stage_no_replica_answers_for_is_counted_whole() -> None:
    # Every replica of the retriever gone: nothing drains there, its messages count.
    assert stranded_now({"retriever": 6, "classifier": 3}, {"classifier": 1}) == 2
    # A replica may say it holds more than the server counts (acknowledged meanwhile).
    assert stranded_now({"classifier": 1}, {"classifier": 3}) == 0
