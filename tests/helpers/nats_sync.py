"""Knowing the server has read what a connection wrote (a SUB above all).

nats-py's `flush()` writes its PING straight to the socket while earlier commands (a
SUB, a PUB) may still wait in the client's pending buffer for its flusher task: the
PONG can come back before the server has read them (seen: a subscriber that missed a
message another connection published after its flush). The first flush wakes the
flusher, which writes the buffer before the PONG can be read; the second's PING then
follows everything written so far.
"""

from __future__ import annotations

from nats.aio.client import Client


async def flushed(nc: Client) -> None:
    """Return once the server has processed every command `nc` sent before the call."""
    await nc.flush()
    await nc.flush()
