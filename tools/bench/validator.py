"""Validator benchmark: parser speed, open-breaker overhead, invalid-set detection.

    intentroute bench validator --json      # or: python -m bench.validator

* parse_ms_p50: in-process `validate()` of the ~50-line program in tests/data/valid_avap.jsonl.
* open_breaker_ms_p50: what `GuardedParser.check` adds while the circuit is OPEN (no call).
* invalid_flagged / invalid_line_accuracy: over tests/data/invalid_avap.jsonl (lenient mode,
  the production default): share flagged invalid, and share whose first error is on the
  labelled line.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from services.parser.avap import validate
from services.validator.breaker import CircuitBreaker
from services.validator.parser_client import GuardedParser
from services.validator.ports import CheckStatus, ParseOutcome
from shared.contracts.parser import is_error

REPO = Path(__file__).resolve().parents[2]

DATA = REPO / "tests" / "data"
BENCH_PROGRAM_ID = "order_report_50"


def _load(name: str) -> list[dict[str, Any]]:
    with (DATA / name).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _p50_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 4)


def bench_parse(program: str, iterations: int = 2000) -> float:
    for _ in range(50):  # warm-up
        validate(program)
    samples = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        validate(program)
        samples.append(time.perf_counter() - t0)
    return _p50_ms(samples)


class _NeverCalled:
    calls = 0

    async def validate(self, code: str, *, strict: bool = False) -> ParseOutcome:
        self.calls += 1
        raise AssertionError("the parser must not be called while the circuit is open")


async def _bench_open_breaker(program: str, iterations: int) -> float:
    breaker = CircuitBreaker(threshold=1, cooldown=3600)
    breaker.record_failure()  # OPEN for the whole run
    client = _NeverCalled()
    guarded = GuardedParser(client, breaker, timeout=2.0)
    samples = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        result = await guarded.check(program)
        samples.append(time.perf_counter() - t0)
        assert result.status is CheckStatus.UNAVAILABLE
    assert client.calls == 0
    return _p50_ms(samples)


def bench_open_breaker(program: str, iterations: int = 2000) -> float:
    import logging

    # Keep the per-call RC-07 log line out of the measurement's stderr.
    logger = logging.getLogger("intentroute.validator")
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return asyncio.run(_bench_open_breaker(program, iterations))
    finally:
        logger.setLevel(previous)


def invalid_set_scores(rows: list[dict[str, Any]], *, strict: bool = False) -> tuple[float, float]:
    flagged = right_line = 0
    for row in rows:
        result = validate(row["program"], strict=strict)
        errors = [t for t in result.trace if is_error(t)]
        flagged += not result.valid
        right_line += bool(errors) and errors[0].line == row["error_line"]
    n = len(rows)
    return round(flagged / n, 4), round(right_line / n, 4)


def run() -> dict[str, float]:
    valid = {row["id"]: row["program"] for row in _load("valid_avap.jsonl")}
    program = valid[BENCH_PROGRAM_ID]
    flagged, line_accuracy = invalid_set_scores(_load("invalid_avap.jsonl"))
    return {
        "parse_ms_p50": bench_parse(program),
        "open_breaker_ms_p50": bench_open_breaker(program),
        "invalid_flagged": flagged,
        "invalid_line_accuracy": line_accuracy,
    }


if __name__ == "__main__":
    print(json.dumps(run()))
