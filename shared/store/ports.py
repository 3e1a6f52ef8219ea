"""What the stages read from and write to Postgres; `shared.store.stores` implements it."""

from __future__ import annotations

from typing import Protocol

from shared.contracts.routing import HISTORY_WINDOW, HistoryEntry
from shared.store.rows import Row


class HistoryReader(Protocol):
    async def last_history(
        self, agent_id: str, session_id: str, n: int = HISTORY_WINDOW
    ) -> list[HistoryEntry]:
        """At most the last `n` classify_history entries of a session, oldest first."""


class TurnStore(HistoryReader, Protocol):
    """What the stages read from and write to Postgres."""

    async def previous_answer(self, agent_id: str, session_id: str) -> str | None:
        """The session's last assistant answer."""

    async def last_turns(
        self, agent_id: str, session_id: str, n: int = 4
    ) -> list[tuple[str, str]]:
        """The session's last `n` messages as (role, content), oldest first."""

    async def write(self, *rows: Row, deadline: float | None = None) -> None:
        """Returns once every row is committed, retrying an unreachable store until
        `deadline` (epoch seconds); raises a StoreError otherwise."""
