"""What a NATS cluster's JetStream says about its replicas: who leads each stream and
durable consumer, and whether a node is a current, lag-free replica of all of them.

Asked through the JetStream API (`stream_info` / `consumer_info`, the admin's), so it
works on any cluster, embedded or not; used by `bench chaos --nats-cluster 3` and the
cluster tests to time a failover (leaders elected elsewhere) and a catch-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import NamedTuple

from nats.js import JetStreamContext
from nats.js.api import ClusterInfo


class Replicated(NamedTuple):
    """A stream, or one of its durable consumers (`consumer` set)."""

    stream: str
    consumer: str = ""

    def __str__(self) -> str:
        return f"{self.stream}/{self.consumer}" if self.consumer else self.stream


async def cluster_info(js: JetStreamContext, item: Replicated, timeout: float = 1.0
                       ) -> ClusterInfo | None:
    """Its cluster info, None while the API cannot answer (no leader to ask)."""
    try:
        if item.consumer:
            cinfo = await asyncio.wait_for(js.consumer_info(item.stream, item.consumer),
                                           timeout)
            consumer_cluster: ClusterInfo | None = cinfo.cluster
            return consumer_cluster
        sinfo = await asyncio.wait_for(js.stream_info(item.stream), timeout)
        stream_cluster: ClusterInfo | None = sinfo.cluster
        return stream_cluster
    except Exception:  # no leader yet, a reconnect: not an answer either way
        return None


async def leaders(js: JetStreamContext, items: Sequence[Replicated]) -> dict[str, str]:
    """Who leads each (by `str(item)`); "" when none answers."""
    found = {}
    for item in items:
        info = await cluster_info(js, item)
        found[str(item)] = (info.leader or "") if info else ""
    return found


def _led_elsewhere(info: ClusterInfo | None, node: str) -> bool:
    return info is not None and bool(info.leader) and info.leader != node


def _current_on(info: ClusterInfo | None, node: str) -> bool:
    if info is None or not info.leader:
        return False
    if info.leader == node:
        return True
    return any(peer.name == node and peer.current and not peer.offline and not peer.lag
               for peer in info.replicas or [])


async def wait_until(js: JetStreamContext, items: Sequence[Replicated], node: str, *,
                     caught_up: bool, timeout: float, poll: float = 0.05) -> float:
    """Seconds until every item is led by a node other than `node` (`caught_up`
    False: the failover), or has `node` as a current replica with no lag (True: the
    catch-up of a restarted node). Raises TimeoutError after `timeout`."""
    check = _current_on if caught_up else _led_elsewhere
    loop = asyncio.get_running_loop()
    start = loop.time()
    pending = list(items)
    while pending:
        pending = [item for item in pending if not check(await cluster_info(js, item), node)]
        if not pending:
            break
        if loop.time() - start > timeout:
            raise TimeoutError(f"{', '.join(map(str, pending))}: not "
                               f"{'caught up on' if caught_up else 'led away from'} {node} "
                               f"within {timeout}s")
        await asyncio.sleep(poll)
    return loop.time() - start
