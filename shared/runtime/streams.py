"""The worker's connection and the streams it works on: the broker factory, the stream
definitions and their declaration or check at start.

Streams:
- AGENT_REQUESTS (`agent.request.*`), work-queue retention: the gateway's durable
  pull consumer shares requests among gateway replicas.
- INTENTROUTE_PIPELINE (`intentroute.stage.>`), work-queue retention: one durable
  pull consumer per stage (and per model slot for the generator).
- AGENT_RESPONSES (`agent.response.>`), limits retention with a TTL: every chunk is
  stored, so a subscriber that joins late still reads the whole answer.
- AGENT_FEEDBACK (`agent.feedback.*`), work-queue retention: agents' verdicts on their
  answers, read by the gateway's `gateway-feedback` durable consumer.
- TURN_ROWS (`intentroute.rows.>`), work-queue retention: turn rows Postgres did not
  take in time, written by every worker's `row-writer` (shared.runtime.row_queue).

Every stream has the same number of replicas (`NATS_STREAM_REPLICAS`; 3 on a cluster),
and bytes, messages, age and consumers bounded by `CommonSettings.streams`; the request
and feedback streams also bound each agent's waiting messages.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from faststream.nats import NatsBroker
from faststream.nats.security import NatsCredentials, NatsSecurity, NatsToken, NatsUserPassword
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import (
    APIError,
    BadRequestError,
    NotFoundError,
    ServiceUnavailableError,
)

from shared.auth.natsconn import connect_kwargs
from shared.auth.permissions import STREAM_SUBJECTS
from shared.common.limits import StreamLimits
from shared.common.settings import CommonSettings
from shared.contracts import (
    circuits,
    deadletter,
    feedback,
    pipeline,
    request,
    response,
    turn_rows,
)
from shared.contracts.errors import RetryableError
from shared.contracts.response import ErrorCode

log = logging.getLogger("intentroute.bus")
T = TypeVar("T")


DIRECT_READ_STREAMS = frozenset({response.STREAM, response.CLAIM_STREAM, turn_rows.STREAM,
                                 circuits.STREAM})


def circuit_bucket(response_ttl: float, limits: StreamLimits) -> StreamConfig:
    """The key-value bucket of the model backends' circuits (shared.llm.circuit), as
    JetStream keeps a bucket: one value per key, read directly. A key it ages out (an
    idle backend's) reads as a closed circuit."""
    cfg = _stream(circuits.STREAM, RetentionPolicy.LIMITS, response_ttl, limits)
    cfg.max_msgs_per_subject = 1
    cfg.allow_rollup_hdrs = True
    cfg.deny_delete = True
    return cfg


def _stream(name: str, retention: RetentionPolicy, max_age: float, limits: StreamLimits, *,
            duplicate_window: float = 120) -> StreamConfig:
    """A file-backed stream on the subjects the permission table gives it, bounded by
    `limits` (`duplicate_window` 0: the server's default). A work queue refuses a
    publish when full (discard new: the publisher sees the error, nothing queued is
    lost); a limits stream drops its oldest messages."""
    work = retention == RetentionPolicy.WORK_QUEUE
    return StreamConfig(name=name, subjects=list(STREAM_SUBJECTS[name]), retention=retention,
                        storage=StorageType.FILE, max_age=max_age,
                        duplicate_window=duplicate_window,
                        max_bytes=limits.max_bytes, max_msgs=limits.max_msgs,
                        max_consumers=limits.max_consumers,
                        discard=DiscardPolicy.NEW if work else DiscardPolicy.OLD)


def _per_agent(cfg: StreamConfig, limit: int) -> StreamConfig:
    """At most `limit` messages waiting per subject, i.e. per agent (`agent.request.<id>`,
    `agent.feedback.<id>`); the next one is refused, for that agent only
    (nats-server >= 2.10; the bundled 2.15 enforces it, tests/integration/test_bounds.py)."""
    cfg.max_msgs_per_subject = limit
    cfg.discard_new_per_subject = True
    return cfg


def stream_configs(response_ttl: float, replicas: int = 1,
                   limits: StreamLimits | None = None) -> list[StreamConfig]:
    lim = limits or StreamLimits()
    work = lim.work_max_age
    requests = _per_agent(_stream(request.STREAM, RetentionPolicy.WORK_QUEUE, work, lim),
                          lim.per_agent)
    # The gateway reads requests through one consumer per active agent
    # (services/gateway/fair_consumer.py), so their number follows the agents an operator
    # admitted; only the gateway may create them, and idle ones expire.
    requests.max_consumers = -1
    configs = [
        requests,
        _stream(pipeline.STREAM, RetentionPolicy.WORK_QUEUE, work, lim),
        _stream(response.STREAM, RetentionPolicy.LIMITS, response_ttl, lim),
        _per_agent(_stream(feedback.STREAM, RetentionPolicy.WORK_QUEUE, work, lim),
                   lim.per_agent),
        # One final chunk per run of a request, kept as long as the answers.
        _stream(response.CLAIM_STREAM, RetentionPolicy.LIMITS, response_ttl, lim),
        # Messages that exhausted their deliveries, kept a week for an operator.
        _stream(deadletter.STREAM, RetentionPolicy.LIMITS, lim.dead_letter_max_age, lim,
                duplicate_window=0),
        # Turn rows waiting for Postgres (shared.runtime.row_queue): kept as long as
        # dead letters, so an outage shorter than a week loses none.
        _stream(turn_rows.STREAM, RetentionPolicy.WORK_QUEUE, lim.dead_letter_max_age, lim),
    ]
    configs.append(circuit_bucket(response_ttl, lim))
    for cfg in configs:
        cfg.num_replicas = replicas
    # The streams workers read one message of by subject (the last chunk of an answer,
    # a claim, whether a session has queued rows) answer direct gets: a read names its
    # subject, so a worker's grant reads only subjects it names, never by sequence
    # (shared.auth.permissions).
    for cfg in configs:
        if cfg.name in DIRECT_READ_STREAMS:
            cfg.allow_direct = True
    return configs


# A cluster that has just started answers these until its JetStream leader is elected
# and its peers have joined (503 "JetStream system temporarily unavailable",
# "insufficient resources" while too few peers are known, or no answer yet).
_NOT_READY = (ServiceUnavailableError, NoRespondersError, NatsTimeoutError, TimeoutError)
_JS_INSUFFICIENT_RESOURCES = 10023
_JS_NO_PEERS = 10005


async def ensure_streams(
    js: JetStreamContext, response_ttl: float, replicas: int = 1, *,
    limits: StreamLimits | None = None, timeout: float = 30.0
) -> None:
    """Create or update the streams (a stream declared before has its limits brought to
    `limits` on the next start); every worker may call it at start. Waits (up to
    `timeout`) for a cluster that is still electing its leaders."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    for cfg in stream_configs(response_ttl, replicas, limits):
        async def declare(cfg: StreamConfig = cfg) -> None:
            try:
                await js.add_stream(config=cfg)
            except BadRequestError:
                await js.update_stream(config=cfg)

        await until_ready(declare, f"stream {cfg.name}", max(0.0, deadline - loop.time()))


class StreamsMissingError(RetryableError):
    """A worker with a credential found a stream missing: it may not declare one (an
    admin declares them; then it starts)."""

    code = ErrorCode.BUS_UNAVAILABLE


async def require_streams(
    js: JetStreamContext, response_ttl: float, *, timeout: float = 30.0
) -> None:
    """Check the streams exist (a restricted user may look, not create); waits, up to
    `timeout`, for a stream that has no leader yet (a cluster electing one)."""
    for cfg in stream_configs(response_ttl, 1):
        try:
            await until_ready(partial(js.stream_info, cfg.name or ""), f"stream {cfg.name}",
                              timeout)
        except NotFoundError:
            raise StreamsMissingError(
                f"stream {cfg.name} does not exist; an admin declares the streams "
                "(`intentroute up` does) before the workers start"
            ) from None


async def until_ready(op: Callable[[], Awaitable[T]], what: str, timeout: float = 30.0) -> T:
    """`op()`, tried again while JetStream is not ready for it (a cluster starting or
    electing a leader: no answer, 503, too few peers yet), up to `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return await op()
        except (*_NOT_READY, APIError) as exc:
            transient = isinstance(exc, _NOT_READY) or (
                isinstance(exc, APIError)
                and exc.err_code in (_JS_INSUFFICIENT_RESOURCES, _JS_NO_PEERS))
            if not transient or loop.time() > deadline:
                raise
            log.info("%s: JetStream not ready yet (%r); retrying", what, exc)
            await asyncio.sleep(0.25)


async def prepare_streams(js: JetStreamContext, settings: CommonSettings) -> None:
    """Make sure the streams exist before a worker's consumers start: on an open server
    (no credential) the worker declares them, as it always has; a worker with a
    credential only checks, since streams are the admin's (`intentroute up`)."""
    if settings.nats_authenticated:
        await require_streams(js, settings.response_ttl)
    else:
        await ensure_streams(js, settings.response_ttl, settings.replicas(),
                             limits=settings.streams)


def broker_security(kwargs: dict[str, Any]) -> NatsSecurity | None:
    """`shared.auth.natsconn.connect_kwargs` as FastStream's security object."""
    tls = kwargs.get("tls")
    if "user_credentials" in kwargs:
        return NatsCredentials(kwargs["user_credentials"], ssl_context=tls)
    if "user" in kwargs:
        return NatsUserPassword(kwargs["user"], kwargs.get("password", ""), ssl_context=tls)
    if "token" in kwargs:
        return NatsToken(kwargs["token"], ssl_context=tls)
    return NatsSecurity(ssl_context=tls) if tls is not None else None


def make_broker(settings: CommonSettings) -> NatsBroker:
    """The worker's connection (FastStream owns connect, reconnect and shutdown);
    stages read through `shared.runtime.consumer.StageConsumer` and publish through `Bus`."""
    # FastStream logs two lines per message at INFO; that costs more than a hop.
    quiet = logging.getLogger("intentroute.faststream")
    quiet.setLevel(logging.WARNING)
    kwargs = connect_kwargs(settings)
    extra: dict[str, Any] = {}
    if "inbox_prefix" in kwargs:
        extra["inbox_prefix"] = kwargs["inbox_prefix"]
    return NatsBroker(
        settings.nats_servers,
        logger=quiet,
        graceful_timeout=10.0,
        max_reconnect_attempts=-1,
        # Try again soon after a server restart: the consumers pull again as soon as the
        # connection is back, so this is most of a restart's stall.
        # (FastStream annotates it int; nats-py takes seconds as a float.)
        reconnect_time_wait=0.25,  # type: ignore[arg-type]
        security=broker_security(kwargs),
        **extra,
    )
