"""The gateway's fair reader of `agent.request.*`: per-agent consumers, taken in turn.

One durable pull consumer per agent on AGENT_REQUESTS (`gateway-<agent_id>`, filtered
to `agent.request.<agent_id>`; a work-queue stream takes several consumers whose filters
do not overlap, so the old catch-all `gateway` consumer is deleted at start), shared by
every gateway replica as the single consumer was. Which agent's requests come next is
`fairshare.FairScheduler`'s weighted deficit round robin; this module is its JetStream
side:

* who has requests waiting: a core-NATS subscription on `agent.request.*` (the
  doorbell: every publication rings, no polling of idle agents), and a scan every
  `scan` seconds of the stream's per-subject counts (one STREAM.INFO) for requests
  stored while no gateway ran, or redelivered after a replica died;
* a turn is one pull of at most `quantum x weight` requests with `no_wait` (the server
  answers at once with what it has), so an agent's requests are only ever taken when
  it is its turn;
* admission is bounded by the pipeline's backlog: the requests in INTENTROUTE_PIPELINE
  (a work-queue stream holds exactly what a stage has not acknowledged yet: one message
  per request being worked on; one STREAM.INFO) plus those admitted since that reading
  stay under the bound: what the pipeline's measured drain rate (the same reading's
  count of messages ever stored less those still there, as a moving rate) clears in the
  least time a message has stayed in it (`fairshare.Residence`: its service time) plus
  `delay` seconds, and never under `backlog`. So a fast pipeline is kept full (its
  queue is short in time however long in messages), a stage that takes long but many
  at once (a remote model) gets as many as its rate needs, and a slow or loaded one
  holds at most about `delay` seconds of waiting ahead of a newly admitted request.
  Requests wait in their agent's consumer instead of a stage's FIFO queue, where a
  flood would hold everyone else's behind it;
* messages a dead (or stopped) replica holds are left out of that count: they stay in
  the stream until their ack wait redelivers them, and are no work ahead of anyone
  meanwhile. Every `HOLDINGS_READ` seconds the stages' consumers (one CONSUMER.LIST:
  delivered and unacknowledged, per stage) are read together with what every live
  replica says it holds (`$SRV.STATS`, the services API's `inflight`); at a stage one of
  whose replicas stopped answering, what is delivered and held by no replica answering,
  two readings in a row, is *stranded* (`fairshare.Stranded`). Counted, they paused
  admission for up to an ack wait after a kill when the bound was at its floor.

Each delivery is then handled exactly as the plain stage consumer handles it (this is
a `StageConsumer`: explicit ack, progress acks while held, redelivery after
`ack_wait`, dead letters after `max_deliver` under the stage's `gateway` name).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from itertools import count
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.errors import NotFoundError
from opentelemetry.trace import Tracer

from services.gateway.fairshare import (
    DrainRate,
    FairScheduler,
    Hops,
    Residence,
    Stranded,
    pipeline_bound,
    pipeline_room,
)
from shared.auth.permissions import SERVICES_API, agent_id_problem
from shared.contracts import pipeline, request
from shared.contracts.request import agent_of
from shared.policy.ports import Policies
from shared.runtime.consumer import (
    Handler,
    OnHandled,
    StageConsumer,
    StageSpec,
    agent_consumer_name,
)
from shared.runtime.signals import StageStats
from shared.runtime.stage_status import gather
from shared.runtime.worker import MakeConsumer

log = logging.getLogger("intentroute.gateway.fair")

_encode = msgspec.json.Encoder().encode
# An agent's consumer unused this long is removed by the server (it is created again at
# its next request; requests stored meanwhile stay in the work-queue stream).
AGENT_CONSUMER_IDLE = 24 * 3600.0
# A pull the server has not ended in this long is given up (a server going away).
PULL_TIMEOUT = 1.0
# While requests wait and the pipeline is full, its backlog is re-read this often
# (one STREAM.INFO, ~0.1 ms on loopback); otherwise every IDLE_READ.
FULL_READ = 0.01
IDLE_READ = 0.5
# Seconds between readings of what the stages' replicas hold (CONSUMER.LIST and one
# `$SRV.STATS` scatter-gather, each reply within a few ms on loopback; a replica is
# waited for up to HOLDINGS_QUIET after the last reply): with STRANDED_READINGS, a
# kill's messages leave the count within about half a second.
HOLDINGS_READ = 0.2
HOLDINGS_TIMEOUT = 0.2
HOLDINGS_QUIET = 0.1


@dataclasses.dataclass
class _Pull:
    asked: int
    done: asyncio.Future[None]
    got: int = 0
    # The consumer was not there (deleted, expired): created again next time.
    missing: bool = False

    def end(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


class FairConsumer(StageConsumer):
    """A per-agent stage consumer taken in weighted fair turns (module doc)."""

    def __init__(
        self,
        nc: Client,
        spec: StageSpec,
        handler: Handler,
        *,
        weight: Callable[[str], float],
        backlog: int,
        quantum: int,
        scan: float,
        delay: float = 0.0,
        tracer: Tracer | None = None,
        stats: StageStats | None = None,
        on_handled: OnHandled | None = None,
    ) -> None:
        super().__init__(nc, spec, handler, tracer=tracer, stats=stats, on_handled=on_handled)
        self.scheduler = FairScheduler(quantum=quantum, weight=weight)
        self._backlog = backlog
        self._delay = delay
        # Pipeline messages acknowledged per second, from the backlog readings.
        self.drain = DrainRate()
        # Pipeline messages per request (the drain counts hops; the bound is requests).
        self.hops = Hops()
        # The least time a message stays in the pipeline (fairshare.Residence).
        self.residence = Residence()
        # Pipeline messages held by replicas that no longer answer (module doc).
        self.stranded = Stranded()
        self._scan_every = scan
        self._wake = asyncio.Event()
        # Set when admission stops for want of room: the backlog is read at once.
        self._room_gone = asyncio.Event()
        self._ready: set[str] = set()
        # The one pull under way (its id is the last token of its reply inbox).
        self._current: tuple[str, _Pull] | None = None
        self._pull_ids = count()
        self._doorbell: Subscription | None = None
        self._loops: list[asyncio.Task[None]] = []
        # The pipeline's last reading, and what was admitted / in hand when it was asked.
        self._pipeline = 0
        self._admitted = 0
        self._mark = (0, 0)
        # Requests this replica admitted, per agent (tests and the bench read it).
        self.admitted_by_agent: dict[str, int] = {}

    async def start(self) -> None:
        js = self._js
        loop = asyncio.get_running_loop()
        # The catch-all consumer overlaps every per-agent one: the stream would refuse them.
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(self.spec.stream, self.spec.durable)
            log.info("[gateway] removed the catch-all consumer %r", self.spec.durable)
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(f"{self._inbox}.*", cb=self._on_message)
        self._doorbell = await self.nc.subscribe(request.SUBJECTS, cb=self._on_doorbell)
        self._last_seen = loop.time()
        self._reconnects = self.nc.stats.get("reconnects", 0)
        await self._read_backlog()
        await self._scan()
        self._watchdog = asyncio.create_task(self._watch(), name="gateway-watch")
        self._loops = [asyncio.create_task(self._admit_loop(), name="gateway-admit"),
                       asyncio.create_task(self._scan_loop(), name="gateway-scan"),
                       asyncio.create_task(self._backlog_loop(), name="gateway-backlog")]
        if self._backlog > 0:
            self._loops.append(asyncio.create_task(self._holdings_loop(),
                                                   name="gateway-holdings"))

    async def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        if self._doorbell is not None:
            with contextlib.suppress(Exception):
                await self._doorbell.unsubscribe()
        await super().stop(timeout)

    async def _pull(self) -> None:
        # The base consumer calls this when a slot frees or after a reconnect: wake the
        # admission loop, which decides whose requests to take.
        self._wake.set()

    def room(self) -> int:
        """Requests that may be admitted now: free handler slots of this replica, and
        what the pipeline's backlog bound leaves (`backlog` <= 0: unbounded)."""
        free = self.spec.max_inflight - self._inflight
        if self._backlog <= 0:
            return free
        admitted, held = self._mark
        estimate = self._pipeline + (self._admitted - admitted) + held
        return min(free, pipeline_room(self.bound(), estimate, self.stranded.count))

    def bound(self) -> int:
        return pipeline_bound(self._backlog, self._delay, self.requests_rate(),
                              self.residence.seconds)

    def requests_rate(self) -> float:
        """Requests the pipeline clears a second: its message drain over the hops."""
        return self.drain.rate / self.hops.value

    async def _admit_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            self.scheduler.due(loop.time())
            while not self._stopping:
                choice = self.scheduler.pick(self.room())
                if choice is None:
                    break
                agent, asked = choice
                got = await self._fetch(agent, asked)
                self.scheduler.served(agent, asked, got, loop.time())
            if self.scheduler and self.room() <= 0:
                self._room_gone.set()
            recheck = self.scheduler.next_recheck()
            timeout = None if recheck is None else max(0.0, recheck - loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()

    async def _fetch(self, agent: str, asked: int) -> int:
        """One turn: up to `asked` of `agent`'s requests, handed to the stage."""
        name = agent_consumer_name(self.spec.durable, agent)
        if agent not in self._ready and not await self._create(agent, name):
            return 0
        pull_id = str(next(self._pull_ids))
        pull = _Pull(asked, asyncio.get_running_loop().create_future())
        self._current = (pull_id, pull)
        try:
            await self.nc.publish(
                f"$JS.API.CONSUMER.MSG.NEXT.{self.spec.stream}.{name}",
                _encode({"batch": asked, "no_wait": True}), reply=f"{self._inbox}.{pull_id}")
            await asyncio.wait_for(asyncio.shield(pull.done), PULL_TIMEOUT)
        except Exception as exc:  # the connection away: the next wake-up tries again
            log.warning("[gateway] pull of %s's requests: %r", agent, exc)
        finally:
            self._current = None
        if pull.missing:
            self._ready.discard(agent)
        return pull.got

    async def _create(self, agent: str, name: str) -> bool:
        config = dataclasses.replace(
            self.spec.consumer_config(), name=name, durable_name=name,
            filter_subject=request.request_subject(agent),
            inactive_threshold=AGENT_CONSUMER_IDLE)
        try:
            await self._js.add_consumer(self.spec.stream, config=config)
        except Exception as exc:
            log.error("[gateway] consumer %s not created: %r", name, exc)
            self.scheduler.forget(agent)
            return False
        self._ready.add(agent)
        return True

    async def _on_message(self, msg: Msg) -> None:
        self._last_seen = asyncio.get_running_loop().time()
        # A delivery carries its stream subject; a status, the pull's inbox. Pulls are
        # one at a time: a delivery belongs to the current one (a straggler of a pull
        # given up on is still handled, and counted to the next).
        pull = self._current[1] if self._current is not None else None
        if not msg.reply:  # a status: the pull ended (404/408 nothing more, 409, 503)
            current = self._current is not None and msg.subject.endswith(
                f".{self._current[0]}")
            if pull is not None and current:
                status = (msg.headers or {}).get("Status", "")
                if status == "503" or "not found" in (msg.headers or {}).get(
                        "Description", "").lower():
                    pull.missing = True
                pull.end()
            return
        if pull is not None:
            pull.got += 1
            if pull.got >= pull.asked:
                pull.end()
        self._admitted += 1
        if self._stopping:
            await msg.nak()
            return
        agent = agent_of(msg.subject)
        self.admitted_by_agent[agent] = self.admitted_by_agent.get(agent, 0) + 1
        self._start(msg)

    async def _on_doorbell(self, msg: Msg) -> None:
        agent = msg.subject.rsplit(".", 1)[-1]
        if agent_id_problem(agent):
            return
        self.scheduler.wake(agent, asyncio.get_running_loop().time(), rang=True)
        self._wake.set()

    async def _scan(self) -> None:
        """Agents with requests in the stream (stored while no gateway ran, or waiting for
        redelivery after a replica died) join the round."""
        try:
            info = await self._js.stream_info(self.spec.stream,
                                              subjects_filter=request.SUBJECTS)
        except Exception as exc:
            log.debug("[gateway] scan: %r", exc)
            return
        now = asyncio.get_running_loop().time()
        for subject, stored in (info.state.subjects or {}).items():
            agent = subject.rsplit(".", 1)[-1]
            if stored and not agent_id_problem(agent):
                self.scheduler.wake(agent, now)
        self._wake.set()

    async def _scan_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self._scan_every)
            await self._scan()

    async def _read_backlog(self) -> None:
        mark = (self._admitted, self._inflight)
        try:
            info = await self._js.stream_info(pipeline.STREAM)
        except Exception as exc:
            log.debug("[gateway] pipeline backlog: %r", exc)
            return
        present = int(info.state.messages or 0)
        self._pipeline, self._mark = present, mark
        self.drain.observe(asyncio.get_running_loop().time(),
                           int(info.state.last_seq or 0), present)
        self.residence.observe(
            asyncio.get_running_loop().time(), present, self.requests_rate(), self._backlog,
            at_floor=self.bound() <= self._backlog)

    async def _backlog_loop(self) -> None:
        # Measured: sleeping IDLE_READ whenever the room was not gone *before* the sleep
        # let admission fill the room and then wait out the rest of the 0.5 s: 16 req/s
        # through `bench pipeline` (445 unbounded). Admission now says when it stops.
        while not self._stopping:
            if self.scheduler and self.room() <= 0:
                await asyncio.sleep(FULL_READ)
            else:
                self._room_gone.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room_gone.wait(), IDLE_READ)
            if self._backlog > 0:
                before = self.room()
                await self._read_backlog()
                if self.room() > 0 >= before:
                    self._wake.set()

    async def _read_holdings(self) -> None:
        try:
            consumers, replies = await asyncio.gather(
                self._js.consumers_info(pipeline.STREAM),
                gather(self.nc, f"{SERVICES_API}.STATS", timeout=HOLDINGS_TIMEOUT,
                       quiet=HOLDINGS_QUIET))
        except Exception as exc:
            log.debug("[gateway] pipeline holdings: %r", exc)
            self.stranded.unknown()
            return
        ack_pending = {info.name: int(info.num_ack_pending or 0) for info in consumers}
        self.hops.observe(
            asyncio.get_running_loop().time(),
            sum(_delivered(info) for info in consumers),
            sum(_delivered(info) for info in consumers
                if info.config.filter_subject == pipeline.CLASSIFY_SUBJECT))
        inflight: dict[str, int] = {}
        replicas: dict[str, set[str]] = {}
        stage = f"{pipeline.SUBJECT_PREFIX}."
        for reply in replies:
            for endpoint in reply.get("endpoints") or []:
                if str(endpoint.get("subject", "")).startswith(stage):
                    name = str(endpoint.get("name", ""))
                    data = endpoint.get("data") or {}
                    # Handled now, and delivered waiting for a slot (StageSpec.lookahead).
                    held = int(data.get("inflight", 0)) + int(data.get("waiting", 0))
                    inflight[name] = inflight.get(name, 0) + held
                    replicas.setdefault(name, set()).add(str(reply.get("id", "")))
        self.stranded.observe(asyncio.get_running_loop().time(), ack_pending, inflight,
                              replicas)

    async def _holdings_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(HOLDINGS_READ)
            before = self.room()
            await self._read_holdings()
            if self.room() > 0 >= before:
                self._wake.set()


def _delivered(info: Any) -> int:
    """A consumer's deliveries so far (its delivered consumer sequence)."""
    return int(getattr(info.delivered, "consumer_seq", 0) or 0)


class AgentWeights:
    """Each agent's `weight` from its policy (1 without one); the policies are attached
    once the worker has opened them (`policies`), the default share until then."""

    def __init__(self) -> None:
        self.policies: Policies | None = None

    def __call__(self, agent: str) -> float:
        if self.policies is None:
            return 1.0
        return self.policies.policy_for(agent).weight or 1.0


def fair_consumer_factory(*, weight: Callable[[str], float], backlog: int, quantum: int,
                          scan: float, delay: float = 0.0) -> MakeConsumer[Any]:
    """The gateway stage's consumer for `shared.runtime.worker.build_app`."""

    def make(nc: Client, spec: StageSpec, handler: Handler, deps: Any, *,
             tracer: Tracer | None, stats: StageStats,
             on_handled: OnHandled | None) -> StageConsumer:
        return FairConsumer(nc, spec, handler, weight=weight, backlog=backlog,
                            quantum=quantum, scan=scan, delay=delay, tracer=tracer, stats=stats,
                            on_handled=on_handled)

    return make
