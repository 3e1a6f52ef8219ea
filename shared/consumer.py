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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Tracer

from shared.ports import Delivery

log = logging.getLogger("intentroute.consumer")

_NS = 1_000_000_000
_encode = msgspec.json.Encoder().encode


class StageSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Delivery settings of one stage, stated where the stage is declared.

    The consumer is durable and pull-based with explicit acks: a message is acked
    after its handler returns, nacked with a delay by the handler on a retryable
    error, and after `max_deliver` deliveries the stage answers with an error
    instead of trying again (shared.stage.run_stage)."""

    stream: str
    subject: str
    durable: str
    # Messages one replica pulls and handles at once.
    max_inflight: int
    # Seconds a replica may hold a message before JetStream redelivers it elsewhere.
    ack_wait: float
    max_deliver: int

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
            max_deliver=self.max_deliver,
        )


class JsDelivery:
    """A JetStream message as the `Delivery` a stage handler sees."""

    __slots__ = ("msg",)

    def __init__(self, msg: Msg) -> None:
        self.msg = msg

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
    def settled(self) -> bool:
        return bool(self.msg.is_acked)

    async def nack(self, delay: float | None = None) -> None:
        await self.msg.nak(delay=delay)

    async def in_progress(self) -> None:
        await self.msg.in_progress()


Handler = Callable[[Delivery], Awaitable[None]]


async def ensure_consumer(js: JetStreamContext, spec: StageSpec) -> None:
    """Create the durable consumer, or bring an existing one to `spec` (the server
    creates or updates; every replica may call it at start)."""
    await js.add_consumer(spec.stream, config=spec.consumer_config())


class StageConsumer:
    def __init__(
        self,
        nc: Client,
        spec: StageSpec,
        handler: Handler,
        *,
        tracer: Tracer | None = None,
        heartbeat: float = 5.0,
        expires: float = 30.0,
    ) -> None:
        self.nc = nc
        self.spec = spec
        self._handler = handler
        self._tracer = tracer
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

    async def start(self) -> None:
        await ensure_consumer(self.nc.jetstream(), self.spec)
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(self._inbox, cb=self._on_message)
        self._last_seen = asyncio.get_running_loop().time()
        self._watchdog = asyncio.create_task(self._watch(), name=f"{self.spec.durable}-watch")
        await self._pull()

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop pulling, let in-flight handlers finish, give back what arrives meanwhile."""
        self._stopping = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()  # type: ignore[attr-defined]

    async def _pull(self) -> None:
        if self._stopping or not self.nc.is_connected:
            return
        free = self.spec.max_inflight - self._inflight - self._outstanding
        # Top up in halves: one pull request per message would double the traffic.
        if free <= 0 or (self._outstanding and free < max(1, self.spec.max_inflight // 2)):
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
        self._outstanding = max(0, self._outstanding - 1)
        if self._stopping:
            await msg.nak()
            return
        self._inflight += 1
        task = asyncio.create_task(self._run(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_status(self, msg: Msg) -> None:
        headers = msg.headers or {}
        status = headers.get("Status", "")
        if status == "100":  # idle heartbeat: the pull is alive
            return
        # 408: a pull expired; 409: the server ended it (limits, leadership change).
        pending = headers.get("Nats-Pending-Messages")
        if pending is not None:
            self._outstanding = max(0, self._outstanding - int(pending))
        else:
            self._outstanding = 0
        if status == "408":
            await self._pull()
        else:
            log.warning("[%s] pull ended with %s %s", self.spec.durable, status,
                        headers.get("Description", ""))

    async def _run(self, msg: Msg) -> None:
        delivery = JsDelivery(msg)
        try:
            if self._tracer is None:
                await self._handler(delivery)
            else:
                await self._traced(delivery)
            if not delivery.settled:
                await msg.ack()
        except Exception:
            # stage_guard sorts the expected errors; this is a bug or a dead connection.
            log.exception("[%s] handler failed; message goes back for redelivery",
                          self.spec.durable)
            if not delivery.settled:
                with contextlib.suppress(Exception):
                    await msg.nak(delay=1.0)
        finally:
            self._inflight -= 1
            await self._pull()

    async def _traced(self, delivery: JsDelivery) -> None:
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
                await self._handler(delivery)
        finally:
            otel_context.detach(token)

    async def _watch(self) -> None:
        """A pull lost to a reconnect or a server restart is noticed by the missing
        heartbeats, and asked again."""
        loop = asyncio.get_running_loop()
        while not self._stopping:
            await asyncio.sleep(self._heartbeat)
            silent = loop.time() - self._last_seen
            if silent > 2 * self._heartbeat + 1:
                self._outstanding = 0
                self._last_seen = loop.time()
                await self._pull()
