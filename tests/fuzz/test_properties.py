"""Fuzz tier: every subject's decoder and every stage handler on generated hostile input
(testkit/fuzzing: arbitrary bytes, broken JSON, wrong types, subject-special and reserved
ids, NUL characters, over-long and unicode-edge text, huge numbers, wrong admission
stamps, a connection lost mid-answer). Per example: nothing raises out of the handler,
the message ends exactly once (one final chunk on its caller's subject, one readable
hand-off, or a report on intentroute.invalid when no caller can be read), every error
is an ErrorCode. Hypothesis shrinks a failure to its smallest example."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import given

from testkit.fuzzing.targets import TARGETS, Example, Target


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    """One loop for every example of a target (its own: the session loop is pytest's)."""
    quiet = logging.getLogger("intentroute")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # every refused message is logged: not here
    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as loop:
        yield loop
    quiet.setLevel(level)


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_no_crash_each_message_ends_once_with_typed_errors(
    target: Target, runner: asyncio.Runner
) -> None:
    ends: Counter[str] = Counter()

    @given(target.examples)
    def holds(example: Example) -> None:
        verdict = runner.run(target.check(example))
        ends[verdict.end] += 1
        assert verdict.ok, str(verdict)

    holds()
    if target.kind == "handler":
        # The examples get past the checks into the stage's own work, not only refused.
        assert ends["handoff"] + ends["answer"] > 0, dict(ends)
