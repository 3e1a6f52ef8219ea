"""Walking a chain (shared.llm.chain) across the fleet: one answer, whatever the model
servers do (shared.llm.faults has the table of what each fault gets).

`stream_answer` streams the first step that answers into `sink`. It times every call
itself — the first byte (`Timing.first_byte`), the first token (the agent's `ttft`, or
less under `@within`), every gap between tokens (the agent's `stall`) — so a silent,
slow or stalled server is left at once, never waited on until the request's deadline.
An answer broken mid-stream is continued by the next step from what the caller already
has when that model takes a prefill (the text stays; the continuation follows it), and
otherwise restarted cleanly: `on_restart` (the reset marker) is called just before the
first token of the answer that replaces it, so a caller never gets the abandoned part
and a second answer run together. Each backend's circuit (shared.llm.circuit) is asked
before a call and told its outcome.

`Walked` says what came of it: who wrote the delivered answer (`answered_by`, a
`backend/model`, `extractive`, or "" for an error), its parts (two or more when it was
continued: each part is billed at its own model's price), every failed attempt with its
fault (logged, counted in the backend's health, never billed as an answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from shared.common.deadline import time_left
from shared.llm.choice import Choice
from shared.llm.circuit import CircuitBoard, Ticket
from shared.llm.faults import COUNTS_AGAINST_BACKEND, DOWN, MID_STREAM, Fault, ModelError
from shared.llm.fleet import BackendKind, BackendSpec, Fleet, FleetError, ModelSpec, split_ref
from shared.llm.ports import (
    BackendUnavailableError,
    ChatBackend,
    ChatMessage,
    ChoiceBackend,
    Ended,
    Started,
    TokenCounts,
)
from shared.policy.chain import ERROR, EXTRACTIVE, Condition, Step

log = logging.getLogger("intentroute.llm")

Sink = Callable[[str], Awaitable[None]]

# Attempts on one model: a 500 and a reset before any byte get one retry; a 429/503
# without Retry-After up to three tries, backing off (jittered) at least BACKOFF_MIN
# seconds apart; a Retry-After is waited for when it is at most RATE_WAIT_MAX seconds
# and fits the deadline.
SERVER_RETRIES = 1
RESET_RETRIES = 1
OVERLOADED_TRIES = 3
BACKOFF_MIN = 0.3
RATE_WAIT_MAX = 10.0
RATE_RETRIES = 2


@dataclass(frozen=True)
class Timing:
    """Seconds a model call may take: to its first byte, to its first token (the
    agent's ttft), between two tokens (the agent's stall)."""

    first_byte: float = 5.0
    ttft: float = 15.0
    stall: float = 5.0


@dataclass
class Attempt:
    ref: str
    fault: Fault | None = None
    detail: str = ""
    ms: float = 0.0


@dataclass
class Part:
    """One model's share of the delivered answer."""

    ref: str
    tokens_in: int = 0
    tokens_out: int = 0
    counted: bool = False  # the server reported the counts
    ms: float = 0.0


@dataclass
class Walked:
    answered_by: str = ""
    parts: list[Part] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    # "" | "BACKEND_UNAVAILABLE" | "CONTENT_FILTERED" (an ErrorCode) and why.
    error_code: str = ""
    error: str = ""
    # A step after the first answered (or none did).
    fell_back: bool = False
    # The delivered answer ended without its end marker (finalised with what came).
    unmarked: bool = False

    @property
    def failures(self) -> list[Attempt]:
        return [a for a in self.attempts if a.fault is not None]

    def reason(self) -> str:
        failed = self.failures
        if not failed:
            return ""
        extra = f" +{len(failed) - 1}" if len(failed) > 1 else ""
        return f"{failed[0].fault} {failed[0].ref}{extra}"


def fallback_why(walked: Walked, *, first: bool) -> str:
    """Why the extractive answerer answers, in one phrase: no model server configured
    (it is the slot's first step), or the first model step's failure."""
    if first:
        return "no model server is configured: OLLAMA_HOST, OPENAI_BASE_URL or `up --llm`"
    failed = walked.failures
    if not failed:
        return "no model step was tried (the chain's conditions skipped them)"
    attempt = failed[0]
    more = f", and {len(failed) - 1} more" if len(failed) > 1 else ""
    return f"{attempt.ref}: {attempt.detail or attempt.fault}{more}"[:160]


class _Stream:
    """One call's events with the walker's clocks on them."""

    def __init__(self, events: AsyncIterator[object], timing: Timing, ttft: float) -> None:
        self._events = events
        self._timing = timing
        self._ttft_at = time.monotonic() + ttft
        self.started = False
        self.tokens = 0

    async def next(self) -> object:
        if not self.started:
            wait, fault = min(self._timing.first_byte, time_left(self._timing.first_byte)), \
                Fault.NO_RESPONSE
        elif not self.tokens:
            wait, fault = self._ttft_at - time.monotonic(), Fault.SLOW
        else:
            wait, fault = self._timing.stall, Fault.STALLED
        wait = min(wait, time_left(wait))
        if wait <= 0:
            raise ModelError(fault, "no time left")
        try:
            event = await asyncio.wait_for(anext(self._events), wait)
        except TimeoutError as exc:
            raise ModelError(fault, f"nothing for {wait:.2f}s") from exc
        if isinstance(event, Started):
            self.started = True
        elif isinstance(event, str):
            self.started = True
            self.tokens += 1
        return event

    async def close(self) -> None:
        close = getattr(self._events, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(close(), 1.0)


class _Run:
    """One walk's state: what the caller has of the answer, whether it is a broken one
    the next answer must replace, what the failures were."""

    def __init__(self, walked: Walked, sink: Sink,
                 on_restart: Callable[[], Awaitable[None]]) -> None:
        self.walked = walked
        self.sink = sink
        self._on_restart = on_restart
        self.sent = ""  # what the caller has of the answer so far
        self.abandoned = False  # `sent` is a broken answer the next one must replace
        self.only_down = True  # every failure so far was the server being down
        self.context_refused = -1  # the context of a model that refused the prompt

    async def first_token(self) -> None:
        """An answer that replaces the broken one begins: the reset marker first, and
        the broken one's parts are not delivered (not billed as the answer)."""
        if self.abandoned:
            await self._on_restart()
            self.abandoned, self.sent = False, ""
            self.walked.parts.clear()

    async def abandon(self) -> None:
        """The walk ends in an error: what the caller has of a broken answer is taken
        back (the reset marker) before the error, never left looking like an answer."""
        if self.abandoned:
            await self._on_restart()
            self.abandoned, self.sent = False, ""
            self.walked.parts.clear()

    def after(self, fault: Fault, streamed: str, ref: str, spec: ModelSpec) -> None:
        """What a step's fault leaves for the next steps."""
        self.only_down = self.only_down and fault in DOWN
        if fault is Fault.CONTENT_FILTER:
            self.walked.error_code = "CONTENT_FILTERED"
            self.walked.error = f"{ref}: {self.walked.attempts[-1].detail}"
            self.walked.fell_back = True
        if fault is Fault.CONTEXT_LENGTH:
            self.context_refused = spec.context
        if streamed:
            self.sent += streamed
            self.abandoned = True

    def unanswered(self, *, ended_in_error: bool) -> Walked:
        walked = self.walked
        walked.fell_back = True
        walked.error_code = "BACKEND_UNAVAILABLE"
        tried = "; ".join(f"{a.fault} {a.ref}" for a in walked.failures) or "no model step"
        walked.error = (f"no model answered ({tried})"
                        + (" and the chain ends in an error" if ended_in_error else ""))
        return walked


class _Retries:
    """The attempts one step has left on its model, by fault (module doc)."""

    def __init__(self, sleep: Callable[[float], Awaitable[None]]) -> None:
        self._sleep = sleep
        self._left = {Fault.SERVER_ERROR: SERVER_RETRIES, Fault.RESET: RESET_RETRIES,
                      Fault.OVERLOADED: OVERLOADED_TRIES - 1,
                      Fault.RATE_LIMITED: RATE_RETRIES}
        self._backoff = BACKOFF_MIN

    async def again(self, error: ModelError) -> bool:
        """Wait as the fault asks and return True to try the same model again, or
        False when the step is over (no retry left, or no time for the wait)."""
        if self._left.get(error.fault, 0) <= 0:
            return False
        self._left[error.fault] -= 1
        pause = 0.0
        if error.fault is Fault.RATE_LIMITED:
            pause = error.retry_after or 0.0
            if pause > RATE_WAIT_MAX:
                return False
        elif error.fault is Fault.OVERLOADED:
            pause = self._backoff * (1 + random.random())
            self._backoff *= 2
        if pause and pause >= time_left(pause + 1) - 0.5:
            return False  # the wait does not fit the request's deadline
        if pause:
            await self._sleep(pause)
        return True


class Walker:
    """The fleet's clients (one per backend), its declarations and the shared circuits."""

    def __init__(self, fleet: Fleet, clients: Mapping[str, ChatBackend | ChoiceBackend],
                 board: CircuitBoard | None = None, *, timing: Timing | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.fleet = fleet
        self.clients = clients
        self.board = board
        self.timing = timing or Timing()
        self._sleep = sleep

    @classmethod
    def single(cls, client: ChatBackend | ChoiceBackend, model: str) -> Walker:
        """A walker over one client and one model (tests, evaluations): no circuit."""
        spec = BackendSpec(kind=BackendKind.OPENAI, url="http://single.invalid/v1",
                           models={model: ModelSpec()})
        return cls(Fleet(backends={client.name: spec}), {client.name: client})

    def _spec(self, ref: str) -> ModelSpec | None:
        """The model's declaration: a model the fleet does not declare on a backend it
        has gets the defaults (the server says whether it serves it); None when the
        backend is not in the fleet."""
        try:
            backend, model = split_ref(ref)
        except FleetError:
            return None
        found = self.fleet.backends.get(backend)
        if found is None:
            return None
        return found.models.get(model, ModelSpec())

    async def stream_answer(
        self, steps: list[Step], messages: list[ChatMessage], *, sink: Sink,
        on_restart: Callable[[], Awaitable[None]], extractive: Callable[[str], str],
        accepted_at: float, timing: Timing | None = None,
    ) -> Walked:
        """The first step that answers streams into `sink`; `extractive(why)` is the
        extractive answerer's text, `why` no model answered in one phrase
        (`fallback_why`)."""
        run = _Run(Walked(), sink, on_restart)
        timing = timing or self.timing
        for n, step in enumerate(steps):
            if step.ref == EXTRACTIVE:
                await run.first_token()
                started = time.perf_counter()
                await sink(extractive(fallback_why(run.walked, first=n == 0)))
                run.walked.answered_by = EXTRACTIVE
                run.walked.parts = [Part(EXTRACTIVE, ms=(time.perf_counter() - started) * 1000)]
                run.walked.fell_back = n > 0
                return run.walked
            if step.ref == ERROR:
                break
            ttft = self._ttft_for(step, run, timing, accepted_at)
            if ttft is None:
                continue
            if await self._step(step, messages, run, timing, ttft):
                run.walked.fell_back = n > 0
                return run.walked
            if run.walked.error_code:  # a content filter: no other model is asked
                await run.abandon()
                return run.walked
        await run.abandon()
        return run.unanswered(ended_in_error=bool(steps) and steps[-1].ref == ERROR)

    def _ttft_for(self, step: Step, run: _Run, timing: Timing,
                  accepted_at: float) -> float | None:
        """The first-token time this step gets, None when its condition skips it."""
        if step.condition is Condition.IF_UNAVAILABLE and not (
                run.walked.failures and run.only_down):
            return None
        if step.condition is Condition.WITHIN:
            left = step.within_s - (time.time() - accepted_at)
            return min(timing.ttft, left) if left > 0 else None
        return timing.ttft

    async def _step(self, step: Step, messages: list[ChatMessage], run: _Run,
                    timing: Timing, ttft: float) -> bool:
        """One model step; True when it answered."""
        walked = run.walked
        spec = self._spec(step.ref)
        backend, model = split_ref(step.ref)
        client = self.clients.get(backend)
        if spec is None or client is None:
            walked.attempts.append(Attempt(step.ref, Fault.REFUSED, "not in the fleet"))
            return False
        if run.context_refused >= 0 and spec.context and spec.context <= run.context_refused:
            return False  # no larger context than the one that refused the prompt
        ticket = await self.board.allow(backend) if self.board else Ticket(backend)
        if ticket is None:
            walked.attempts.append(Attempt(step.ref, Fault.CIRCUIT_OPEN, "its circuit is open"))
            return False
        prefill = run.sent if (run.sent and run.abandoned and spec.prefill) else ""
        outcome = await self._answer_on(client, model, step.ref, messages, prefill=prefill,
                                        run=run, timing=timing, ttft=ttft)
        if outcome is None:
            if self.board:
                await self.board.success(ticket)
            walked.answered_by = step.ref
            return True
        fault, streamed = outcome
        if self.board and fault in COUNTS_AGAINST_BACKEND:
            await self.board.failure(ticket, walked.attempts[-1].detail)
        elif self.board:
            await self.board.success(ticket)  # the server works; the request did not
        run.after(fault, streamed, step.ref, spec)
        return False

    async def _answer_on(
        self, client: ChatBackend | ChoiceBackend, model: str, ref: str,
        messages: list[ChatMessage], *, prefill: str, run: _Run, timing: Timing,
        ttft: float,
    ) -> tuple[Fault, str] | None:
        """One step: its attempts on `model` (the retries faults.py allows). None when it
        answered (its part added); else the fault it ended with and the text it streamed
        before breaking (a mid-stream fault)."""
        retries = _Retries(self._sleep)
        while True:
            started = time.perf_counter()
            part = Part(ref)
            streamed: list[str] = []
            stream = _Stream(client.stream(model, messages, prefill=prefill),  # type: ignore[union-attr]
                             timing, ttft)
            try:
                await self._consume(stream, part, streamed, run, continuing=bool(prefill))
            except BackendUnavailableError as exc:
                error = exc if isinstance(exc, ModelError) else ModelError(
                    Fault.UNREACHABLE, str(exc))
                ms = (time.perf_counter() - started) * 1000
                run.walked.attempts.append(Attempt(ref, error.fault, error.detail, ms))
                log.warning("[llm] %s: %s (%s)", ref, error.fault, error.detail[:200])
                if streamed:
                    # What the caller has of it is kept: counted by its pieces (a cut
                    # stream reports no usage), delivered if the next step continues it.
                    run.walked.parts.append(Part(ref, tokens_out=len(streamed), ms=ms))
                    fault = error.fault if error.fault in (*MID_STREAM,
                                                           Fault.CONTENT_FILTER) else Fault.CUT
                    return fault, "".join(streamed)
                if error.fault in MID_STREAM:
                    return error.fault, ""
                if error.fault is Fault.PREFILL_REFUSED and prefill:
                    prefill = ""  # restart on the same model instead
                    continue
                if await retries.again(error):
                    continue
                return error.fault, ""
            finally:
                await stream.close()
            part.ms = (time.perf_counter() - started) * 1000
            run.walked.attempts.append(Attempt(ref, None, "", part.ms))
            run.walked.parts.append(part)
            return None

    @staticmethod
    async def _consume(stream: _Stream, part: Part, streamed: list[str], run: _Run, *,
                       continuing: bool) -> None:
        """The events of one call into the sink and `part`, until its end."""
        while True:
            try:
                event = await stream.next()
            except StopAsyncIteration:
                run.walked.unmarked = True
                return
            if isinstance(event, str):
                if not streamed and not continuing:
                    await run.first_token()
                streamed.append(event)
                await run.sink(event)
            elif isinstance(event, TokenCounts):
                part.tokens_in = event.prompt or 0
                part.tokens_out = event.completion or 0
                part.counted = event.prompt is not None and event.completion is not None
            elif isinstance(event, Ended):
                run.walked.unmarked = not event.marked
                if not event.marked:
                    log.warning("%s ended without its end marker: finalised with what "
                                "came (%d pieces)", part.ref, len(streamed))
                return

    async def choose(self, refs: list[str], messages: list[ChatMessage], choice: Choice, *,
                     timeout: float) -> tuple[str | None, str]:
        """A label from the first model of `refs` that gives one: (option or None for an
        off-schema answer, the model asked); ModelError (the last fault) when none
        answered. A context-length or content-filter refusal is not asked again; a reset
        is, once; an open circuit is passed over."""
        last: ModelError | None = None
        for ref in refs:
            backend, model = split_ref(ref)
            client = self.clients.get(backend)
            if client is None or self._spec(ref) is None:
                continue
            ticket = await self.board.allow(backend) if self.board else Ticket(backend)
            if ticket is None:
                last = ModelError(Fault.CIRCUIT_OPEN, f"{ref}: its circuit is open")
                continue
            for attempt in range(1 + RESET_RETRIES):
                try:
                    answer = await client.choose(model, messages, choice,  # type: ignore[union-attr]
                                                 timeout=timeout)
                except ModelError as exc:
                    last = exc
                    if self.board and exc.fault in COUNTS_AGAINST_BACKEND:
                        await self.board.failure(ticket, exc.detail)
                    if exc.fault in (Fault.RESET, Fault.SERVER_ERROR) and (
                            attempt < RESET_RETRIES):
                        continue  # once more on the same model (faults.py)
                    break
                if self.board:
                    await self.board.success(ticket)
                return answer, ref
        raise last or ModelError(Fault.REFUSED, "no model of the chain is in the fleet")
