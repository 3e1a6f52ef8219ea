"""Each stage's live figures, as `intentroute status` and the doors' dashboard show
them: what one reading holds and how two readings become one row per stage (and one
per worker that reads no stage: the doors, the learner; no lag, their own counts).

A reading (`Sample`) asks the services API once (`$SRV.STATS`: every replica of every
worker answers with its counts, `shared.runtime.micro`), and the server for each stage's
durable consumer (lag) and for the dead-letter stream (parked letters per stage).
Rates and the p95 are over the time between two readings: the difference of each
replica's counters and latency buckets (a replica restarted in between counts from
zero). Everything here but `gather` and `read_sample` is pure.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from shared.auth.permissions import CLIENT_GRANTS, SERVICES_API, WORKER_GRANTS, service_user
from shared.contracts import deadletter
from shared.runtime.consumer import per_agent_lag
from shared.runtime.signals import Lag, bucket_delta, merge_buckets, quantile


class Instance(msgspec.Struct, frozen=True, kw_only=True):
    """One replica's answer to `$SRV.STATS`, for one stage (endpoint)."""

    id: str
    service: str
    stage: str
    handled: int
    errors: int
    processing_ns: int
    buckets: list[int] = []
    inflight: int = 0
    redelivered: int = 0
    outcomes: dict[str, int] = {}
    breakers: dict[str, str] = {}
    metadata: dict[str, str] = {}
    # Named one-line states (the generator's model backend: "ok: ...", "failing: ...").
    states: dict[str, str] = {}


class Sample(msgspec.Struct, frozen=True, kw_only=True):
    at: float
    instances: list[Instance]
    # Per durable: None when the stage's consumer does not exist (never started).
    lag: dict[str, Lag | None]
    dead_letters: dict[str, int]


class StageRow(msgspec.Struct, frozen=True, kw_only=True):
    stage: str
    replicas: int
    pending: int | None
    ack_pending: int | None
    redelivered: int | None
    dead_letters: int
    handled: int
    errors: int
    inflight: int
    # Over the interval between two readings (None with one reading).
    rate_per_s: float | None
    p95_ms: float | None
    # Since the replicas started.
    p95_ms_all: float | None
    breakers: dict[str, str] = {}
    instances: list[dict[str, Any]] = []
    # Each named state across the replicas: the worst one (`worst_state`).
    states: dict[str, str] = {}


def parse_stats(reply: dict[str, Any]) -> list[Instance]:
    """A `$SRV.STATS` reply -> one Instance per endpoint (stage)."""
    out = []
    for endpoint in reply.get("endpoints") or []:
        data = endpoint.get("data") or {}
        out.append(Instance(
            id=str(reply.get("id", "")), service=str(reply.get("name", "")),
            stage=str(endpoint.get("name", "")),
            handled=int(endpoint.get("num_requests", 0)),
            errors=int(endpoint.get("num_errors", 0)),
            processing_ns=int(endpoint.get("processing_time", 0)),
            buckets=[int(c) for c in data.get("buckets") or []],
            inflight=int(data.get("inflight", 0)),
            redelivered=int(data.get("redelivered", 0)),
            outcomes={str(k): int(v) for k, v in (data.get("outcomes") or {}).items()},
            breakers={str(k): str(v) for k, v in (data.get("breakers") or {}).items()},
            metadata={str(k): str(v) for k, v in (reply.get("metadata") or {}).items()},
            states={str(k): str(v) for k, v in (data.get("states") or {}).items()}))
    return out


# A state line's first word, worst first: a failing replica shows over a healthy one.
_STATE_ORDER = ("failing", "unchecked", "extractive", "ok")


def worst_state(lines: list[str]) -> str:
    """Of one named state's lines (one per replica), the one a person must see first."""
    def rank(line: str) -> int:
        word = line.split(":", 1)[0].strip()
        return _STATE_ORDER.index(word) if word in _STATE_ORDER else 0
    return min(lines, key=rank)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def stage_rows(current: Sample, previous: Sample | None = None) -> list[StageRow]:
    """One row per worker type, in pipeline order, whether or not any replica runs: a
    stage's under its durable, then each worker that reads no stage under its name."""
    rows = []
    endpoints = [*((worker, grant.durable) for worker, grant in WORKER_GRANTS.items()),
                 *((worker, worker) for worker in CLIENT_GRANTS)]
    for worker, durable in endpoints:
        mine = [i for i in current.instances
                if i.service == service_user(worker) and i.stage == durable]
        before = {i.id: i for i in (previous.instances if previous else [])
                  if i.service == service_user(worker) and i.stage == durable}
        rate = p95 = None
        if previous is not None and current.at > previous.at:
            window, handled = [], 0
            for inst in mine:
                old = before.get(inst.id)
                restarted = old is None or old.handled > inst.handled
                handled += inst.handled - (0 if restarted or old is None else old.handled)
                window.append(bucket_delta(inst.buckets, None if restarted or old is None
                                           else old.buckets))
            rate = round(handled / (current.at - previous.at), 2)
            p95 = _ms(quantile(merge_buckets(window), 0.95))
        lag = current.lag.get(durable)
        breakers: dict[str, str] = {}
        states: dict[str, list[str]] = {}
        for inst in mine:
            breakers.update(inst.breakers)
            for name, line in inst.states.items():
                states.setdefault(name, []).append(line)
        rows.append(StageRow(
            stage=durable, replicas=len(mine),
            pending=lag.pending if lag else None,
            ack_pending=lag.ack_pending if lag else None,
            redelivered=lag.redelivered if lag else None,
            dead_letters=current.dead_letters.get(durable, 0),
            handled=sum(i.handled for i in mine), errors=sum(i.errors for i in mine),
            inflight=sum(i.inflight for i in mine), rate_per_s=rate, p95_ms=p95,
            p95_ms_all=_ms(quantile(merge_buckets(i.buckets for i in mine), 0.95)),
            breakers=breakers,
            states={name: worst_state(lines) for name, lines in states.items()},
            instances=[{"id": i.id, "pid": i.metadata.get("pid", ""),
                        "host": i.metadata.get("host", ""),
                        "metrics": i.metadata.get("metrics", ""),
                        "handled": i.handled, "errors": i.errors, "inflight": i.inflight,
                        "avg_ms": round(i.processing_ns / max(1, i.handled) / 1e6, 3),
                        "states": i.states}
                       for i in sorted(mine, key=lambda i: i.id)]))
    return rows


async def gather(nc: Client, subject: str, *, timeout: float = 2.0, quiet: float = 0.3
                 ) -> list[dict[str, Any]]:
    """Scatter-gather: every reply to one request, until `quiet` seconds pass without one
    (after the first), `timeout` at most."""
    inbox = nc.new_inbox()
    replies: list[dict[str, Any]] = []
    arrived = asyncio.Event()

    async def on_reply(msg: Msg) -> None:
        try:
            replies.append(json.loads(msg.data))
        except ValueError:
            return
        arrived.set()

    sub = await nc.subscribe(inbox, cb=on_reply)
    try:
        await nc.publish(subject, b"", reply=inbox)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        wait = timeout
        while True:
            arrived.clear()
            try:
                await asyncio.wait_for(arrived.wait(), min(wait, deadline - loop.time()))
            except TimeoutError:
                break
            wait = quiet
            if loop.time() >= deadline:
                break
    finally:
        await sub.unsubscribe()
    return replies


async def read_sample(nc: Client, *, timeout: float = 2.0) -> Sample:
    from nats.js.errors import NotFoundError

    js = nc.jetstream()
    replies = await gather(nc, f"{SERVICES_API}.STATS", timeout=timeout)
    instances = [inst for reply in replies
                 if str(reply.get("name", "")).startswith("intentroute-")
                 for inst in parse_stats(reply)]
    at = time.time()
    lag: dict[str, Lag | None] = {}
    for grant in WORKER_GRANTS.values():
        if grant.per_agent:  # the gateway: the sum over its agents' consumers
            lag[grant.durable] = await per_agent_lag(js, grant.stream, grant.durable)
            continue
        try:
            info = await js.consumer_info(grant.stream, grant.durable)
        except NotFoundError:
            lag[grant.durable] = None
            continue
        lag[grant.durable] = Lag(pending=info.num_pending or 0,
                                 ack_pending=info.num_ack_pending or 0,
                                 redelivered=info.num_redelivered or 0,
                                 waiting=info.num_waiting or 0)
    dead: dict[str, int] = {}
    try:
        dlq = await js.stream_info(deadletter.STREAM,
                                   subjects_filter=f"{deadletter.SUBJECT_PREFIX}.>")
        prefix = f"{deadletter.SUBJECT_PREFIX}."
        dead = {subject.removeprefix(prefix): int(count)
                for subject, count in (dlq.state.subjects or {}).items()}
    except NotFoundError:
        pass
    return Sample(at=at, instances=instances, lag=lag, dead_letters=dead)
