"""The bounds of the bus's streams, as one struct the settings read
(`CommonSettings.streams`, variables STREAM_*) and the stream declarations apply
(shared.runtime.streams.stream_configs)."""

from __future__ import annotations

import msgspec


class StreamLimits(msgspec.Struct, frozen=True, kw_only=True):
    """The bounds of every JetStream stream (shared.runtime.streams.stream_configs). A
    work-queue stream that is full refuses the next publish (discard "new": the
    publisher gets an error, no queued work is dropped); a limits stream (answers,
    claims, dead letters) drops its oldest messages instead."""

    # Bytes and messages each stream may hold.
    max_bytes: int = 1 << 30
    max_msgs: int = 1_000_000
    # Seconds a message waits in a work-queue stream (requests, pipeline, feedback)
    # before it is dropped unread; answers and claims keep RESPONSE_TTL.
    work_max_age: float = 24 * 3600.0
    dead_letter_max_age: float = 7 * 24 * 3600.0
    # Requests (and feedback messages) one agent may have waiting in its stream: the
    # subject is the agent's, so one agent cannot fill the stream for the others.
    per_agent: int = 10_000
    # Consumers each stream may have: the stages' durables, and on AGENT_RESPONSES the
    # gateway's short-lived replay consumers (agents may create none). Not on
    # AGENT_REQUESTS, read through one gateway consumer per active agent.
    max_consumers: int = 256
