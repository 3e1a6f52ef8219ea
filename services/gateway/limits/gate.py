"""The admission check the gateway's handler calls: the agent's limits from its policy
and the global defaults, decided on the shared state (`LimitStore`), and the refusal
answered as a final error chunk with its request-log row."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from services.gateway.limits.logic import (
    ADMITTED,
    Admission,
    Limits,
    Refusal,
    price_table,
    resolve,
)
from services.gateway.limits.settings import LimitSettings
from services.gateway.ports import LimitStore
from shared.contracts.pipeline import Admitted
from shared.contracts.response import ErrorInfo
from shared.policy.ports import Policies
from shared.runtime.answer_stream import AnswerStream
from shared.runtime.answers import request_log_row, write_after_answer
from shared.runtime.ports import Publisher
from shared.store.ports import TurnStore
from shared.store.writer import UNREACHABLE

# Seconds admission waits for the limits' shared count in Postgres (one statement:
# ~1 ms here). Past it (Postgres paused or down) the request is admitted unchecked, and
# so is every one for the next UNCHECKED_FOR seconds, then Postgres is asked again: a
# Postgres pause must not stop answers that need no database (issue 20). The limits
# protect the service from one agent; stopping every agent's answers for as long as
# the database is away would protect nobody.
LIMITS_WAIT = 0.25
UNCHECKED_FOR = 1.0

log = logging.getLogger("intentroute.gateway.limits")


class LimitGate:
    def __init__(self, store: LimitStore, policies: Policies, defaults: LimitSettings, *,
                 clock: Callable[[], float] = time.time, wait: float = LIMITS_WAIT) -> None:
        self._store = store
        self._policies = policies
        self._defaults = defaults
        self._clock = clock
        self._wait = wait
        # Until when (monotonic) requests are admitted without asking Postgres.
        self._unchecked_until = 0.0

    async def check(self, env: Admitted) -> tuple[Admission, Limits]:
        """The verdict on `env` and the limits it was checked against; an agent with no
        limit at all costs no round trip."""
        req = env.request
        policy = self._policies.policy_for(req.agent_id)
        limits = resolve(policy, self._defaults)
        if limits.unlimited or time.monotonic() < self._unchecked_until:
            return ADMITTED, limits
        asked = asyncio.ensure_future(self._store.admit(
            req.agent_id, req.request_id, accepted_at=env.accepted_at, deadline=env.deadline,
            limits=limits, prices=price_table(policy), now=self._clock()))
        done, _ = await asyncio.wait({asked}, timeout=self._wait)
        try:
            if done:
                return asked.result(), limits
        except UNREACHABLE as exc:
            log.warning("limits not checked, Postgres unreachable: %r", exc)
        else:  # left to finish when Postgres is back: its count is then right again
            asked.add_done_callback(_settled_late)
            log.warning("limits not checked: Postgres did not answer within %.2fs", self._wait)
        self._unchecked_until = time.monotonic() + UNCHECKED_FOR
        return ADMITTED, limits


def _settled_late(task: asyncio.Future[Admission]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("late limits check failed: %r", task.exception())


async def answer_refusal(bus: Publisher, store: TurnStore, env: Admitted, refused: Refusal
                         ) -> None:
    """The refused request's one final chunk (its code, message and `retry_after_ms`),
    then its request-log row (`error:<CODE>`): the refusal is counted like any answer. No
    log line: a flood of refusals would be a flood of lines, and the log row says it."""
    req = env.request
    await AnswerStream(bus, req.agent_id, req.request_id).final(
        decision=None, error=ErrorInfo(refused.code, refused.message, refused.retry_after_ms))
    await write_after_answer(store, [request_log_row(env, f"error:{refused.code}")],
                             req.request_id)
