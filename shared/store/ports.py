"""What the stages read from and write to Postgres, and how it fails;
`shared.store.stores` implements it.

The store's errors are part of the error model (shared.contracts.errors): each says its
code and whether a retry can help, so a stage handles them as it handles any other
(shared.runtime.stage) without knowing the adapter."""

from __future__ import annotations

from typing import Protocol

from shared.contracts.errors import IntentrouteError
from shared.contracts.response import ErrorCode
from shared.contracts.routing import HISTORY_WINDOW, HistoryEntry
from shared.store.rows import Row


class StoreError(IntentrouteError):
    """A write did not happen (an unexpected failure: the stage tries again)."""

    code = ErrorCode.STAGE_FAILED
    retryable = True


class StoreUnavailableError(StoreError):
    """The database could not be reached (retryable: the store retries a write until its
    deadline, a stage's delivery is tried again)."""

    code = ErrorCode.STORE_UNAVAILABLE
    retryable = True


class StoreReadTimeoutError(StoreUnavailableError):
    """A read on the request path got no answer within its bound (Postgres paused or
    away, or the session's rows still queued for it): the caller goes on without it."""


class StoreRejectedError(StoreError):
    """The database refused these rows (permanent: the same rows would fail again)."""

    code = ErrorCode.STAGE_FAILED
    retryable = False


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
