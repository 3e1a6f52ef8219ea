"""Which waiting message a stage replica handles next: one per agent in turn.

Pure logic (the JetStream side is `shared.runtime.consumer.StageConsumer`). A stage
replica may hold more messages than it handles at once (`StageSpec.lookahead`); those
wait here, each agent's in arrival order, and a free handler slot takes the next agent's
oldest, round robin over the agents with messages waiting. So a request admitted
behind a flood waits behind at most one message of each other agent waiting at this
replica, not behind the whole flood the stream holds in arrival order (issue 32: the
gateway's turns ended at admission, and victims then queued ~0.1 s behind admitted
flood work in each stage).

`pop_first` takes the first agent in turn that may go: the replica's spare slots go to
an agent with no handler running there (shared.runtime.consumer).

Weights are not applied here: the gateway admits in weighted turns, so an agent's share
of the pipeline is already its share; the order here only decides who waits less.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class AgentTurns(Generic[T]):
    """Messages waiting at a replica, taken one per agent in turn (module doc)."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[T]] = {}
        # Agents with messages waiting, in the order of their next turn.
        self._order: deque[str] = deque()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[T]:
        for queue in self._queues.values():
            yield from queue

    def push(self, agent: str, item: T) -> None:
        queue = self._queues.get(agent)
        if queue is None:
            queue = self._queues[agent] = deque()
            self._order.append(agent)
        queue.append(item)
        self._count += 1

    def pop(self) -> T:
        """The oldest message of the agent whose turn it is; IndexError when empty."""
        return self._take(self._order.popleft())

    def pop_first(self, may: Callable[[str], bool]) -> T | None:
        """The oldest message of the first agent in turn for which `may(agent)` holds
        (None: no such agent waits); the others keep their turns."""
        for agent in self._order:
            if may(agent):
                break
        else:
            return None
        self._order.remove(agent)
        return self._take(agent)

    def _take(self, agent: str) -> T:
        """`agent`'s oldest message; `agent`, out of the order, goes to its back if it
        has more waiting."""
        queue = self._queues[agent]
        item = queue.popleft()
        self._count -= 1
        if queue:
            self._order.append(agent)
        else:
            del self._queues[agent]
        return item

    def take_all(self) -> list[T]:
        """Every waiting message, emptying the turns (a replica stopping gives them back)."""
        items = list(self)
        self._queues.clear()
        self._order.clear()
        self._count = 0
        return items
