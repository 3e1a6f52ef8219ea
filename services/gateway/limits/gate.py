"""The admission check the gateway's handler calls: the agent's limits from its policy
and the global defaults, decided on the shared state (`LimitStore`) through this
replica's allowance (`lease.AgentLease`), and the refusal answered as a final error
chunk with its request-log row.

A request admitted on the allowance costs no round trip. One that finds none waits for
the agent's call to Postgres: one call at a time per agent, which takes every request
waiting by then (they are decided in order, as one by one) and tops the allowance up.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from services.gateway.limits.lease import LEASE_TTL, SHARE, AgentLease
from services.gateway.limits.logic import Refusal, price_table, resolve
from services.gateway.limits.ports import ADMITTED, Admission, Ask, Limits, LimitStore
from services.gateway.limits.settings import LimitSettings
from shared.contracts.pipeline import Admitted
from shared.contracts.response import ErrorInfo
from shared.policy.ports import Policies
from shared.runtime.answer_stream import AnswerStream
from shared.runtime.endings import request_log_row, write_after_answer
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
# Requests decided in one call at most.
MAX_ASKS = 256
# Seconds `close` waits for the last calls (admissions recorded, allowances given back).
CLOSE_WAIT = 2.0

log = logging.getLogger("intentroute.gateway.limits")

# A waiting request's verdict; None: not checked (Postgres unreachable).
Pending = asyncio.Future[Admission | None]


@dataclass(eq=False)
class _Agent:
    """One agent at this replica: its allowance, its requests waiting for a call, the
    call under way and the timer of the next top-up or give-back."""

    lease: AgentLease
    waiting: deque[tuple[Ask, Pending]] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None


class LimitGate:
    def __init__(self, store: LimitStore, policies: Policies, defaults: LimitSettings, *,
                 clock: Callable[[], float] = time.time, wait: float = LIMITS_WAIT,
                 ttl: float = LEASE_TTL) -> None:
        self._store = store
        self._policies = policies
        self._defaults = defaults
        self._clock = clock
        self._wait = wait
        self._ttl = ttl
        # This replica in the shared state, and its calls' numbers (a late call never
        # overwrites a newer one's allowance).
        self._replica = uuid.uuid4().hex
        self._seq = itertools.count(1)
        self._agents: dict[str, _Agent] = {}
        # Until when (monotonic) requests are admitted without asking Postgres.
        self._unchecked_until = 0.0

    async def check(self, env: Admitted) -> tuple[Admission, Limits]:
        """The verdict on `env` and the limits it was checked against; an agent with no
        limit at all costs no round trip, nor does one admitted on the allowance."""
        req = env.request
        policy = self._policies.policy_for(req.agent_id)
        limits = resolve(policy, self._defaults)
        if limits.unlimited or time.monotonic() < self._unchecked_until:
            return ADMITTED, limits
        agent = self._agent(req.agent_id, limits, price_table(policy))
        ask = Ask(req.request_id, env.accepted_at, env.deadline)
        now = self._clock()
        if agent.lease.take(ask, now):
            if agent.lease.low(now):
                self._start(agent)
            return ADMITTED, limits
        verdict: Pending = asyncio.get_running_loop().create_future()
        agent.waiting.append((ask, verdict))
        self._start(agent)
        done, _ = await asyncio.wait({verdict}, timeout=self._wait)
        if done:
            admission = verdict.result()
            if admission is not None:
                return admission, limits
        else:  # left to finish when Postgres is back: its count is then right again
            log.warning("limits not checked: Postgres did not answer within %.2fs", self._wait)
            verdict.add_done_callback(_settled_late)
            self._replace(agent)
        self._unchecked_until = time.monotonic() + UNCHECKED_FOR
        return ADMITTED, limits

    async def close(self) -> None:
        """Record what was admitted on allowances and give them back (shutdown)."""
        agents = list(self._agents.values())
        self._agents.clear()
        for agent in agents:
            if agent.timer is not None:
                agent.timer.cancel()
        running = {a.task for a in agents if a.task is not None and not a.task.done()}
        if running:
            await asyncio.wait(running, timeout=CLOSE_WAIT)
        calls = [self._serve(agent, release=True) for agent in agents
                 if (agent.task is None or agent.task.done())
                 and (agent.lease.held or agent.lease.allowance)]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), CLOSE_WAIT)

    def _agent(self, agent_id: str, limits: Limits, prices: dict[str, list[float]]) -> _Agent:
        agent = self._agents.get(agent_id)
        if agent is None:
            agent = self._agents[agent_id] = _Agent(
                AgentLease(agent_id, limits, prices, ttl=self._ttl))
        elif not agent.lease.fits(limits, prices):  # its policy changed: a new allowance
            agent = self._replace(agent, limits, prices)
        return agent

    def _replace(self, agent: _Agent, limits: Limits | None = None,
                 prices: dict[str, list[float]] | None = None) -> _Agent:
        """A new lease for the agent (its policy changed, or a call hangs): the new
        one's first call records the old one's admissions (twice does no harm) and gives
        back what is left of its allowance."""
        old = agent.lease
        if agent.timer is not None:
            agent.timer.cancel()
        new = _Agent(AgentLease(old.agent_id, old.limits if limits is None else limits,
                                old.prices if prices is None else prices, ttl=self._ttl))
        new.lease.held = old.unsent()
        self._agents[old.agent_id] = new
        self._schedule(new, self._clock(), retry=True)  # recorded if nothing else asks
        return new

    def _start(self, agent: _Agent) -> None:
        if agent.task is None or agent.task.done():
            agent.task = asyncio.create_task(self._serve(agent))

    def _tick(self, agent: _Agent) -> None:
        """Half the allowance's time gone: top it up, or give it back if unused."""
        agent.timer = None
        current = self._agents.get(agent.lease.agent_id) is agent
        if current and (agent.task is None or agent.task.done()):
            agent.task = asyncio.create_task(self._serve(agent, force=True))

    async def _serve(self, agent: _Agent, *, force: bool = False,
                     release: bool = False) -> None:
        """The agent's calls, one at a time, while requests wait or the allowance runs
        low (or once, `force`d by the timer or `close`)."""
        lease = agent.lease
        while agent.waiting or lease.low(self._clock()) or force or release:
            force = False
            now = self._clock()
            asks = [agent.waiting.popleft() for _ in range(min(len(agent.waiting), MAX_ASKS))]
            call = lease.begin(len(asks), now, release=release)
            release = False
            try:
                grant = await self._store.lease(
                    lease.agent_id, replica=self._replica, seq=next(self._seq),
                    asks=[ask for ask, _ in asks], held=call.held, keep=call.keep,
                    want=call.want, ttl=lease.ttl, share=SHARE, limits=lease.limits,
                    prices=lease.prices, now=now)
            except Exception as exc:
                # Unreachable: the waiting requests are admitted unchecked; anything else
                # (a refused statement, a bug) is their handler's error.
                lease.failed(call)
                unreachable = isinstance(exc, UNREACHABLE)
                if unreachable:
                    log.warning("limits not checked, Postgres unreachable: %r", exc)
                for _, verdict in (*asks, *agent.waiting):
                    if verdict.done():
                        continue
                    if unreachable:
                        verdict.set_result(None)
                    else:
                        verdict.set_exception(exc)
                agent.waiting.clear()
                # Its admissions are recorded by a later call: at most one per half lease.
                self._schedule(agent, now, retry=True)
                return
            lease.answered(call, grant)
            for (_, verdict), admission in zip(asks, grant.admissions, strict=True):
                _resolve(verdict, admission)
            now = self._clock()
            while agent.waiting and lease.take(agent.waiting[0][0], now):
                _resolve(agent.waiting.popleft()[1], ADMITTED)
            self._schedule(agent, now)

    def _schedule(self, agent: _Agent, now: float, *, retry: bool = False) -> None:
        """The next background call: at half the allowance's time (or half a lease
        after a failed call), if there is anything to renew, give back or record."""
        if agent.timer is not None:
            agent.timer.cancel()
            agent.timer = None
        lease = agent.lease
        if lease.allowance or lease.held:
            half = lease.ttl / 2
            delay = half if retry else max(lease.until - half - now, 0.01)
            agent.timer = asyncio.get_running_loop().call_later(delay, self._tick, agent)


def _resolve(verdict: Pending, admission: Admission | None) -> None:
    if not verdict.done():
        verdict.set_result(admission)


def _settled_late(task: Pending) -> None:
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
