"""One fuzz example (a message and the state around it) and a target (what is fuzzed,
with the strategy of its input and the check of one example)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from testkit.fuzzing.oracle import Verdict


@dataclass(frozen=True)
class Example:
    """One message and the state around it (what the store and adapters return)."""

    subject: str
    data: bytes
    deliveries: int = 1
    backend: bool = False  # generator: a chat backend answers (else the extractive one)
    parser: bool = True  # validator: the parser is on
    previous: str = ""
    history: tuple[Any, ...] = ()
    turns: tuple[tuple[str, str], ...] = ()
    extra_passages: tuple[Any, ...] = ()
    # The bus connection drops at this publish of the first delivery (0: no fault).
    fault: int = 0


@dataclass(frozen=True)
class Target:
    name: str
    examples: st.SearchStrategy[Example]
    check: Callable[[Example], Coroutine[Any, Any, Verdict]]
    doc: str = ""
    kind: str = field(default="handler")
