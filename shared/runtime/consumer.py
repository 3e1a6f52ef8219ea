"""JetStream stage consumer: a durable pull consumer that keeps its pulls outstanding.

Every stage hand-off (and `agent.request`) is read through this consumer instead of
FastStream's pull subscriber. FastStream fetches a batch, handles it, then fetches
again, so each batch pays a fetch round trip and waits for its slowest message, and
its per-message middleware chain cost about three times the handler's own work
(py-spy on a four-stage chain: 41% of a stage's time in FastStream's consume path,
11% in the handler). Here pull requests stay outstanding for up to `max_inflight`
messages per replica: a message is handled as soon as the server has it, replicas
still share the durable consumer (each receives only what it asked for), and a
message whose replica dies is redelivered to another after `ack_wait`.

With `lookahead`, a replica asks for that many messages more than it handles at once;
they wait in the replica, each agent's in order, and a free slot takes the next agent's
(shared.runtime.turns): the stream is FIFO, so without it a request admitted behind a
flood waited behind all of the flood's admitted work in every stage (issue 32). When
every slot is taken, an agent with no handler running at the replica takes one of
`max_inflight // 4` (at least one) spare slots: a flood holding all the slots makes
another agent's message wait for none of them to end (the generator's slots end with
their turn's group commit: ~10 ms of the victims' wait under `bench fairness`), and
an agent can never hold more than one spare slot, so a flood's share stays its slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Tracer

from shared.contracts import deadletter
from shared.contracts.pipeline import envelope_agent
from shared.runtime.ports import Delivery
from shared.runtime.signals import Lag, Outcome, StageStats
from shared.runtime.streams import until_ready
from shared.runtime.turns import AgentTurns

log = logging.getLogger("intentroute.consumer")

_NS = 1_000_000_000
_encode = msgspec.json.Encoder().encode


class StageSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Delivery settings of one stage, stated where the stage is declared.

    The consumer is durable and pull-based with explicit acks: a message is acked
    after its handler returns, nacked with a delay by the handler on a retryable
    error, and after `max_deliver` deliveries the stage answers with an error
    instead of trying again (shared.runtime.stage.run_stage)."""

    stream: str
    subject: str
    durable: str
    # Messages one replica pulls and handles at once.
    max_inflight: int
    # Seconds a replica may hold a message before JetStream redelivers it elsewhere.
    ack_wait: float
    max_deliver: int
    # One durable consumer per agent (`agent_consumer_name`), filtered to that agent's
    # subject, instead of one for the whole subject (the gateway's fair share).
    per_agent: bool = False
    # Messages a replica holds beyond `max_inflight`, waiting their agent's turn (module
    # doc; 0: handled in arrival order, as the stream delivers them).
    lookahead: int = 0

    def per_agent_stage(self) -> StageSpec:
        """The same stage read through one consumer per agent (taken in turns by agent
        already: nothing waits in the replica)."""
        return msgspec.structs.replace(self, per_agent=True, lookahead=0)

    def consumer_config(self) -> ConsumerConfig:
        # With a name nats-py creates through `CONSUMER.CREATE.<stream>.<name>.<filter>`,
        # the form a per-user permission can pin to this consumer and filter.
        return ConsumerConfig(
            name=self.durable,
            durable_name=self.durable,
            filter_subject=self.subject,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            # Headroom over the stage's own bound: a replica killed on the last allowed
            # delivery leaves the message to one more, which answers it (run_stage).
            max_deliver=self.max_deliver + 2,
        )


class JsDelivery:
    """A JetStream message as the `Delivery` a stage handler sees."""

    __slots__ = ("again", "agent", "dlq_subject", "js", "msg", "nacked", "touched")

    def __init__(self, msg: Msg, js: JetStreamContext, dlq_subject: str) -> None:
        self.msg = msg
        self.js = js
        self.dlq_subject = dlq_subject
        # Loop time of the last sign of life sent for it (or of its arrival).
        self.touched = 0.0
        # Later deliveries of the same message to this replica while it held this one
        # (StageConsumer._on_message): kept alive with it, settled after it.
        self.again: list[Msg] = []
        self.nacked = False
        # Whose message it is ("" unknown): a stage with lookahead counts its handlers by agent.
        self.agent = ""

    @property
    def data(self) -> bytes:
        return self.msg.data

    @property
    def subject(self) -> str:
        return self.msg.subject

    @property
    def deliveries(self) -> int:
        return int(self.msg.metadata.num_delivered or 1)

    @property
    def stream_seq(self) -> int:
        return int(self.msg.metadata.sequence.stream or 0)

    @property
    def stored_at(self) -> float:
        # The ack subject's timestamp: when the stream stored the message (nats-py calls
        # it the delivery time; the server sends the stored message's time).
        stamp = self.msg.metadata.timestamp
        return stamp.timestamp() if stamp is not None else 0.0

    @property
    def settled(self) -> bool:
        return bool(self.msg.is_acked)

    async def nack(self, delay: float | None = None) -> None:
        self.nacked = True
        await self.msg.nak(delay=delay)

    async def in_progress(self) -> None:
        await self.msg.in_progress()
        for msg in self.again:
            await msg.in_progress()

    async def dead_letter(self, stage: str, reason: str) -> None:
        await self.js.publish(
            self.dlq_subject, self.msg.data, stream=deadletter.STREAM,
            headers={deadletter.STAGE_HEADER: stage, deadletter.REASON_HEADER: reason[:1000],
                     deadletter.SUBJECT_HEADER: self.msg.subject,
                     deadletter.DELIVERIES_HEADER: str(self.deliveries),
                     **{k: v for k, v in (self.msg.headers or {}).items()
                        if k.lower().startswith("traceparent")}})
        await self.msg.ack()


# A handler may say how the delivery ended (None: OK), for the stage's signals.
Handler = Callable[[Delivery], Awaitable[Outcome | None]]
# Called after each delivery with its outcome and handling time (seconds).
OnHandled = Callable[[Outcome, float], None]


def agent_consumer_name(durable: str, agent_id: str) -> str:
    """The durable consumer of one agent's subject in a per-agent stage."""
    return f"{durable}-{agent_id}"


async def per_agent_lag(js: JetStreamContext, stream: str, durable: str) -> Lag | None:
    """A per-agent stage's lag: the sum over its agents' consumers (None: it has none)."""
    prefix, found, offset = f"{durable}-", [], 0
    while True:
        page = await js.consumers_info(stream, offset=offset or None)
        found += [c for c in page if (c.name or "").startswith(prefix)]
        offset += len(page)
        if len(page) < 256:  # the server's page size
            break
    if not found:
        return None
    return Lag(pending=sum(c.num_pending or 0 for c in found),
               ack_pending=sum(c.num_ack_pending or 0 for c in found),
               redelivered=sum(c.num_redelivered or 0 for c in found),
               waiting=sum(c.num_waiting or 0 for c in found))


async def ensure_consumer(js: JetStreamContext, spec: StageSpec) -> None:
    """Create the durable consumer, or bring an existing one to `spec` (the server
    creates or updates; every replica may call it at start). A replica restarted
    while a cluster elects the stream's leader waits for it."""
    await until_ready(lambda: js.add_consumer(spec.stream, config=spec.consumer_config()),
                      f"consumer {spec.durable}")


class StageConsumer:
    def __init__(
        self,
        nc: Client,
        spec: StageSpec,
        handler: Handler,
        *,
        tracer: Tracer | None = None,
        # The server's sign of life on an idle pull: a pull lost with its server (a
        # cluster node killed without a word) is asked again after 2 * heartbeat + 1 s.
        heartbeat: float = 2.0,
        expires: float = 30.0,
        stats: StageStats | None = None,
        on_handled: OnHandled | None = None,
    ) -> None:
        self.nc = nc
        self.spec = spec
        self._handler = handler
        self._tracer = tracer
        # Counted here for the services API and the metrics (shared.runtime.signals).
        self.stats = stats or StageStats(spec.durable)
        self._on_handled = on_handled
        self._heartbeat = heartbeat
        self._expires = expires
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}"
        self._inbox = ""
        self._sub: object | None = None
        self._outstanding = 0
        self._inflight = 0
        self._stopping = False
        self._last_seen = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._watchdog: asyncio.Task[None] | None = None
        self._held: set[JsDelivery] = set()
        # Every message this replica holds (handled or waiting), by stream sequence.
        self._holding: dict[int, JsDelivery] = {}
        # Delivered, not yet handled: waiting for a free slot, in turns by agent.
        self._waiting: AgentTurns[JsDelivery] = AgentTurns()
        # Handlers running, per agent (a stage with lookahead): an agent with none gets
        # one of `_spare` slots past `max_inflight` (`_dispatch`).
        self._busy: Counter[str] = Counter()
        self._spare = max(1, spec.max_inflight // 4) if spec.lookahead else 0
        self._reconnects = 0
        self._repull: asyncio.TimerHandle | None = None
        # Pulls ended by the server (409/503) since the last message or heartbeat.
        self._refusals = 0
        self._dlq_subject = deadletter.dead_letter_subject(spec.durable)
        self._js = nc.jetstream()

    async def start(self) -> None:
        await ensure_consumer(self.nc.jetstream(), self.spec)
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(self._inbox, cb=self._on_message)
        self._last_seen = asyncio.get_running_loop().time()
        self._reconnects = self.nc.stats.get("reconnects", 0)
        self._watchdog = asyncio.create_task(self._watch(), name=f"{self.spec.durable}-watch")
        await self._pull()

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop pulling, give back what waits and what arrives meanwhile, let in-flight
        handlers finish (still kept alive)."""
        self._stopping = True
        if self._repull is not None:
            self._repull.cancel()
        # The pull is closed before anything is given back: a message nacked while this
        # replica's pull is still open comes straight back into it, and bounced so until
        # max_deliver (a CI run saw 3 of 5 given-back messages counted redelivered). The
        # drain hands what the server already sent to `_on_message`, which nacks it.
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.drain()  # type: ignore[attr-defined]
            self._sub = None
        for delivery in self._waiting.take_all():  # another replica takes them at once
            self._holding.pop(delivery.stream_seq, None)
            with contextlib.suppress(Exception):
                await delivery.nack()
        self._count()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        if self._watchdog is not None:  # kept the handlers alive until now
            self._watchdog.cancel()

    async def _pull(self) -> None:
        if self._stopping or not self.nc.is_connected:
            return
        room = self.spec.max_inflight + self.spec.lookahead
        free = room - self._inflight - len(self._waiting) - self._outstanding
        # Top up in halves: one pull request per message would double the traffic.
        if free <= 0 or (self._outstanding and free < max(1, room // 2)):
            return
        request = {
            "batch": free,
            "expires": int(self._expires * _NS),
            "idle_heartbeat": int(self._heartbeat * _NS),
        }
        try:
            await self.nc.publish(self._next_subject, _encode(request), reply=self._inbox)
        except Exception as exc:  # connection lost: the watchdog asks again
            log.warning("[%s] pull request not sent: %r", self.spec.durable, exc)
            return
        self._outstanding += free

    async def _on_message(self, msg: Msg) -> None:
        # Runs on the subscription's reader: hand the message off and return at once.
        self._last_seen = asyncio.get_running_loop().time()
        if not msg.reply:
            await self._on_status(msg)
            return
        self._refusals = 0
        self._outstanding = max(0, self._outstanding - 1)
        if self._stopping:
            await msg.nak()
            return
        delivery = JsDelivery(msg, self._js, self._dlq_subject)
        delivery.touched = self._last_seen
        seq = delivery.stream_seq
        held = self._holding.get(seq) if seq else None
        if held is not None:
            # Redelivered to this replica while it still holds the message: its pull was
            # still open while it could not answer (SIGSTOPped, a stalled loop). Handled
            # twice at once in one process, the two deliveries each sent a final
            # (`bench chaos` sigstop_replicas): the one in hand answers for both.
            log.warning("[%s] message %d delivered again while held here; not handled twice",
                        self.spec.durable, seq)
            held.again.append(msg)
            return
        if seq:
            self._holding[seq] = delivery
        if not self.spec.lookahead:
            self._start(msg, delivery)
            return
        delivery.agent = envelope_agent(msg.data)
        self._waiting.push(delivery.agent, delivery)
        self._dispatch()

    def _start(self, msg: Msg, delivery: JsDelivery | None = None) -> None:
        """Handle `msg` now (as `delivery`, when it was made on arrival)."""
        self._inflight += 1
        if delivery is not None and delivery.agent:
            self._busy[delivery.agent] += 1
        self._count()
        task = asyncio.create_task(self._run(msg, delivery))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _dispatch(self) -> None:
        """Free slots take the waiting messages, one agent's at a time (module doc); an
        agent with no handler running here takes a spare slot when none is free."""
        limit = self.spec.max_inflight
        while self._waiting and not self._stopping:
            if self._inflight < limit:
                delivery = self._waiting.pop()
            elif self._inflight < limit + self._spare:
                found = self._waiting.pop_first(self._idle)
                if found is None:
                    break
                delivery = found
            else:
                break
            self._start(delivery.msg, delivery)
        self._count()

    def _idle(self, agent: str) -> bool:
        """No handler of `agent`'s runs here (a message of no known agent never is)."""
        return bool(agent) and not self._busy.get(agent)

    def _count(self) -> None:
        self.stats.inflight = self._inflight
        self.stats.waiting = len(self._waiting)

    async def _on_status(self, msg: Msg) -> None:
        headers = msg.headers or {}
        status = headers.get("Status", "")
        if status == "100":  # idle heartbeat: the pull is alive
            self._refusals = 0
            return
        # 408: a pull expired; 409: the server ended it (limits, a consumer leader
        # elected elsewhere); 503: no responder for the consumer (a server restarting,
        # a cluster electing the consumer's new leader).
        pending = headers.get("Nats-Pending-Messages")
        if pending is not None:
            self._outstanding = max(0, self._outstanding - int(pending))
        else:
            self._outstanding = 0
        if status == "408":
            self._refusals = 0
            await self._pull()
            return
        self._refusals += 1
        log.log(logging.WARNING if self._refusals == 1 else logging.DEBUG,
                "[%s] pull ended with %s %s", self.spec.durable, status,
                headers.get("Description", ""))
        if self._refusals == 1:
            # The first refusal is asked again at once: after a leadership change the
            # new leader is there already, and a failover must not wait for a timer.
            await self._pull()
        else:
            self._pull_soon(self._refusal_delay())

    def _refusal_delay(self) -> float:
        """Refused again (no leader yet): 50 ms, doubling up to 250 ms, so a pull lands
        within a quarter second of a new leader without a storm of requests meanwhile."""
        return min(0.25, 0.05 * 2.0 ** (self._refusals - 2))

    def _pull_soon(self, delay: float = 0.25) -> None:
        """Ask again after `delay` (one timer at a time)."""
        if self._repull is None or self._repull.cancelled():
            loop = asyncio.get_running_loop()
            self._repull = loop.call_later(delay, lambda: asyncio.ensure_future(self._repull_now()))

    async def _repull_now(self) -> None:
        self._repull = None
        await self._pull()

    async def _run(self, msg: Msg, delivery: JsDelivery | None = None) -> None:
        if delivery is None:
            delivery = JsDelivery(msg, self._js, self._dlq_subject)
            delivery.touched = asyncio.get_running_loop().time()
        self._held.add(delivery)
        started = time.perf_counter()
        outcome = Outcome.OK
        try:
            if self._tracer is None:
                outcome = await self._handler(delivery) or Outcome.OK
            else:
                outcome = await self._traced(delivery) or Outcome.OK
            if not delivery.settled:
                await msg.ack()
        except Exception as exc:
            # run_stage sorts the expected errors; this is a dead connection or a bug.
            outcome = await self._handler_failed(delivery, exc)
        finally:
            self._held.discard(delivery)
            if self._holding.get(delivery.stream_seq) is delivery:
                del self._holding[delivery.stream_seq]
            if delivery.again and not delivery.nacked:
                # Settled: the later deliveries' acks say so too (nacked: it comes back).
                for again in delivery.again:
                    with contextlib.suppress(Exception):
                        await again.ack()
            self._inflight -= 1
            if delivery.agent:
                self._busy[delivery.agent] -= 1
                if self._busy[delivery.agent] <= 0:
                    del self._busy[delivery.agent]
            self._record(outcome, time.perf_counter() - started, delivery)
            self._dispatch()
            await self._pull()

    def _record(self, outcome: Outcome, seconds: float, delivery: JsDelivery) -> None:
        stats = self.stats
        self._count()
        try:
            stats.record(outcome, seconds, delivery.deliveries)
            if self._on_handled is not None:
                self._on_handled(outcome, seconds)
        except Exception as exc:  # a signal must never cost a message
            log.warning("[%s] recording signals failed: %r", self.spec.durable, exc)

    async def _handler_failed(self, delivery: JsDelivery, exc: Exception) -> Outcome:
        """Redeliver; after the last allowed delivery, dead-letter: never a silent drop,
        never a message left unacknowledged in its stream."""
        self.stats.last_error = repr(exc)[:200]
        if delivery.settled:
            return Outcome.FAILED
        last = delivery.deliveries >= self.spec.max_deliver
        log.error("[%s] handler failed on delivery %d%s: %r", self.spec.durable,
                  delivery.deliveries, " (the last): dead-lettered" if last else "", exc)
        with contextlib.suppress(Exception):
            if last:
                await delivery.dead_letter(self.spec.durable, f"handler failed: {exc!r}")
                return Outcome.DEAD_LETTER
            await delivery.nack(delay=1.0)
        return Outcome.FAILED

    async def _traced(self, delivery: JsDelivery) -> Outcome | None:
        assert self._tracer is not None
        parent = propagate.extract(delivery.msg.headers or {})
        token = otel_context.attach(parent)
        try:
            with self._tracer.start_as_current_span(
                f"{self.spec.subject} process",
                kind=SpanKind.CONSUMER,
                attributes={
                    "messaging.system": "nats",
                    "messaging.destination.name": self.spec.subject,
                    "messaging.consumer.group.name": self.spec.durable,
                    "messaging.message.delivery_count": delivery.deliveries,
                },
            ):
                return await self._handler(delivery)
        finally:
            otel_context.detach(token)

    async def _watch(self) -> None:
        """Every quarter second: after a reconnect, ask again at once (the server lost
        the pulls, and waiting for missing heartbeats would stall for seconds); a pull
        whose heartbeats stopped is asked again; messages still being handled (and
        those waiting their turn) get a sign of life, so a short ack_wait redelivers a
        dead replica's messages fast while a long answer keeps its own (at stop too,
        until the handlers finish: `stop` cancels it last)."""
        loop = asyncio.get_running_loop()
        keepalive = max(0.5, self.spec.ack_wait / 3)
        while True:
            await asyncio.sleep(0.25)
            now = loop.time()
            if not self._stopping:
                await self._pull_again_if_lost(now)
            for delivery in [*self._held, *self._waiting]:
                if now - delivery.touched >= keepalive and not delivery.settled:
                    delivery.touched = now
                    with contextlib.suppress(Exception):
                        await delivery.in_progress()

    async def _pull_again_if_lost(self, now: float) -> None:
        reconnects = self.nc.stats.get("reconnects", 0)
        if reconnects != self._reconnects and self.nc.is_connected:
            self._reconnects = reconnects
            log.info("[%s] reconnected: pulling again", self.spec.durable)
        elif now - self._last_seen <= 2 * self._heartbeat + 1:
            return
        self._outstanding = 0
        self._last_seen = now
        await self._pull()
