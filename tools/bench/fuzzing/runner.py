"""`intentroute bench fuzz`: every target for N generated examples (10,000 by default),
counting crashes, unanswered messages and untyped errors instead of stopping at the
first (no shrinking: the test tier, tests/fuzz, shrinks a failure to its smallest)."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as fixed_seed

from testkit.fuzzing.caches import keep_caches_out_of_the_repo
from testkit.fuzzing.example import Example, Target
from testkit.fuzzing.oracle import Verdict
from testkit.fuzzing.targets import TARGETS

DEFAULT_EXAMPLES = 10_000


@dataclass
class Tally:
    examples: int = 0
    crashes: int = 0
    unanswered: int = 0
    untyped_errors: int = 0
    failures: list[str] = field(default_factory=list)
    # How handled messages ended (hand-off, answer, error or report by code): whether
    # the examples reached the stage's logic, not only its checks.
    ends: Counter[str] = field(default_factory=Counter)

    def add(self, verdict: Verdict, example: Example) -> None:
        self.examples += 1
        self.ends[verdict.end] += 1
        self.crashes += bool(verdict.crashed)
        self.unanswered += bool(verdict.unanswered)
        self.untyped_errors += bool(verdict.untyped)
        if not verdict.ok and len(self.failures) < 3:
            self.failures.append(f"{verdict}\n    {_short(example)}")

    def counts(self) -> dict[str, int]:
        return {"examples": self.examples, "crashes": self.crashes,
                "unanswered": self.unanswered, "untyped_errors": self.untyped_errors}


def _short(example: Example, limit: int = 400) -> str:
    text = repr(example)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


@contextmanager
def quiet() -> Iterator[None]:
    """Every bad message is logged by the stage that refuses it: not 100,000 times here."""
    root = logging.getLogger("intentroute")
    level = root.level
    root.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        root.setLevel(level)


def fuzz_target(target: Target, examples: int, seed: int, runner: asyncio.Runner) -> Tally:
    tally = Tally()

    @settings(max_examples=examples, phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @fixed_seed(seed)
    @given(target.examples)
    def one(example: Example) -> None:
        try:
            verdict = runner.run(target.check(example))
        except Exception as exc:  # raised while judging: production code the oracle calls
            verdict = Verdict(crashed=f"raised while checking: {exc!r}")
        tally.add(verdict, example)

    one()
    return tally


def run(examples: int = DEFAULT_EXAMPLES, seed: int = 0, only: list[str] | None = None
        ) -> dict[str, Any]:
    """{"targets": {name: {"examples", "crashes", "unanswered", "untyped_errors"}}};
    findings, and how the messages ended, are described on stderr."""
    unknown = set(only or ()) - {t.name for t in TARGETS}
    if unknown:
        raise ValueError(f"unknown fuzz target(s) {sorted(unknown)}; targets: "
                         f"{', '.join(t.name for t in TARGETS)}")
    results: dict[str, dict[str, int]] = {}
    keep_caches_out_of_the_repo()
    with quiet(), asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
        for target in TARGETS:
            if only and target.name not in only:
                continue
            started = time.perf_counter()
            tally = fuzz_target(target, examples, seed, runner)
            results[target.name] = tally.counts()
            print(f"[fuzz] {target.name}: {tally.counts()} in "
                  f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
            if target.kind == "handler":
                ends = ", ".join(f"{end} {n}" for end, n in tally.ends.most_common())
                print(f"  ended: {ends}", file=sys.stderr)
            for failure in tally.failures:
                print(f"  {failure}", file=sys.stderr)
    return {"targets": results}
