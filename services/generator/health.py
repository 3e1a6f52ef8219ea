"""How the fleet's models are doing, as `intentroute status` and /metrics show it.

A model that fails every call (a wrong model name; a server answering 500; one that is
down) otherwise only shows as fallbacks in the answers. The worker reports, on the
services API (`WorkerSignals.watch_state("backend", ...)`), one line for its models:
the first word the worst state — `ok`, `failing` (its last calls failed, or its circuit
is open: since when, and the last error), `unchecked` (not called yet), `extractive`
(no model server: the extractive answerer answers) — then each model's own state. Each
backend's circuit is also a breaker on /metrics (`llm:<backend>`).

Pure: the outcomes come from the chain's walks (`record`), the start-up probes
(`probe`) and the shared circuits' last snapshot (`circuits`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from shared.llm.circuit import Circuit, State
from shared.llm.walk import Walked
from shared.policy.chain import EXTRACTIVE

# A state line stays one table caption line: the server's error body is cut here.
_WHY_CHARS = 120
FALLS_BACK = "answers follow each agent's chain (the extractive answerer by default)"
BREAKER_STATE = {State.CLOSED: "CLOSED", State.PROBING: "HALF_OPEN", State.OPEN: "OPEN"}


@dataclass
class ModelHealth:
    answered: int = 0
    failures_in_a_row: int = 0
    why: str = ""
    probed: bool = False


@dataclass
class FleetHealth:
    """The fleet's models (`backend/model`, the slot's first) and their last outcomes;
    `circuits` is the last snapshot of the shared circuits (refreshed by the worker)."""

    models: list[str]
    states: dict[str, ModelHealth] = field(default_factory=dict)
    circuits: dict[str, Circuit] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for ref in self.models:
            self.states.setdefault(ref, ModelHealth())

    def _of(self, ref: str) -> ModelHealth:
        return self.states.setdefault(ref, ModelHealth())

    def record(self, walked: Walked) -> None:
        for attempt in walked.attempts:
            state = self._of(attempt.ref)
            if attempt.fault is None:
                state.answered += 1
                state.failures_in_a_row, state.why = 0, ""
            else:
                state.failures_in_a_row += 1
                state.why = f"{attempt.fault}: {attempt.detail}"

    def probe(self, ref: str, why: str | None) -> None:
        """A start-up probe's finding, unless a call already told more."""
        state = self._of(ref)
        if state.answered or state.failures_in_a_row:
            return
        state.probed = True
        state.why = why or ""

    def breaker(self, backend: str) -> str:
        return BREAKER_STATE[self.circuits.get(backend, Circuit()).state]

    def model_state(self, ref: str) -> tuple[str, str]:
        """(its state word, a phrase about it) for one model."""
        state = self._of(ref)
        circuit = self.circuits.get(ref.partition("/")[0], Circuit())
        if circuit.state is not State.CLOSED:
            since = time.strftime("%H:%M:%S", time.localtime(circuit.since))
            word = "open" if circuit.state is State.OPEN else "probing"
            return "failing", f"{ref} circuit {word} since {since} ({_line(circuit.error)})"
        if state.failures_in_a_row:
            calls = ("the last call" if state.failures_in_a_row == 1
                     else f"the last {state.failures_in_a_row} calls")
            return "failing", f"{ref} failed {calls} ({_line(state.why)})"
        if state.answered:
            return "ok", f"{ref} answered the last call"
        if state.probed and state.why:
            return "failing", f"{ref} at start ({_line(state.why)})"
        if state.probed:
            return "ok", f"{ref} answered the start-up probe"
        return "unchecked", f"{ref} not called yet"

    def state(self) -> str:
        models = [ref for ref in self.models if ref != EXTRACTIVE]
        if not models:
            return "extractive: no model server configured; the extractive answerer answers"
        found = [self.model_state(ref) for ref in models]
        order = ("failing", "unchecked", "ok")
        worst = min((word for word, _ in found), key=order.index)
        tail = f"; {FALLS_BACK}" if worst == "failing" else ""
        return f"{worst}: " + "; ".join(text for _, text in found) + tail


def _line(why: str) -> str:
    one = " ".join(why.split())
    return one if len(one) <= _WHY_CHARS else one[:_WHY_CHARS - 1] + "…"
