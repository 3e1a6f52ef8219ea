"""How a generator's model backend is doing, as `intentroute status` shows it.

A backend that fails every call (a wrong model name: 404 on each chat call while the
start-up probe of `/models` passes; a server answering 500) only ever shows as the
extractive fallback in the answers; the worker reports the state of its last calls on
the services API instead (`WorkerSignals.watch_state("backend", ...)`), one line:

- `ok: <backend> <model> answered the last call`
- `failing: <backend> <model> failed the last N calls: <why>; answers fall back ...`
- `unchecked: <backend> <model> not called yet` (an OpenAI-compatible server's start-up
  probe replaces it with `ok` or `failing`)
- `extractive: no model server configured` (the extractive answerer answers itself)

The first word is the state; the rest is for a person. Pure: the outcomes are recorded
by the fallback chain (`fallback.produce`) and the start-up probe (`app.report_probe`).
"""

from __future__ import annotations

from dataclasses import dataclass

# A state line stays one table caption line: the server's error body is cut here.
_WHY_CHARS = 160
FALLS_BACK = "answers fall back to each agent's chain (the extractive answerer by default)"


@dataclass
class BackendHealth:
    """The outcome of a backend's last calls. `backend` is "" when none is configured;
    `model` is the slot's model, then the model of the last call (a fallback chain may
    name others)."""

    backend: str
    model: str
    failures_in_a_row: int = 0
    answered: int = 0
    why: str = ""
    probed: bool = False

    def ok(self, model: str) -> None:
        self.model = model
        self.answered += 1
        self.failures_in_a_row = 0
        self.why = ""

    def failed(self, model: str, why: str) -> None:
        self.model = model
        self.failures_in_a_row += 1
        self.why = why

    def probe(self, why: str | None) -> None:
        """The start-up probe's finding, unless a call already told more."""
        if self.answered or self.failures_in_a_row:
            return
        self.probed = True
        self.why = why or ""

    def state(self) -> str:
        if not self.backend:
            return "extractive: no model server configured; the extractive answerer answers"
        who = f"{self.backend} {self.model}".rstrip()
        if self.failures_in_a_row:
            calls = ("the last call" if self.failures_in_a_row == 1
                     else f"the last {self.failures_in_a_row} calls")
            return f"failing: {who} failed {calls}: {_line(self.why)}; {FALLS_BACK}"
        if self.answered:
            return f"ok: {who} answered the last call"
        if self.probed and self.why:
            return f"failing: {who} at start: {_line(self.why)}; {FALLS_BACK}"
        if self.probed:
            return f"ok: {who} answered the start-up probe, not called yet"
        return f"unchecked: {who} not called yet"


def _line(why: str) -> str:
    one = " ".join(why.split())
    return one if len(one) <= _WHY_CHARS else one[:_WHY_CHARS - 1] + "…"
