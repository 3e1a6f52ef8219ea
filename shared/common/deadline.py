"""The request's deadline, as the ambient bound of every outbound call a stage makes.

`run_stage` sets it around a stage's logic; adapters (model server, Elasticsearch, the
parser) bound their own timeouts with `time_left(their_timeout)`, so no call outlives the
request it serves. A context variable reaches them without threading a parameter
through every Protocol, and tasks started inside inherit it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_DEADLINE: ContextVar[float] = ContextVar("intentroute_deadline", default=0.0)
# A call made right at the deadline still gets this long, so it fails on its own timeout
# (with its own error) rather than on a zero budget.
MIN_BUDGET = 0.01


def time_left(cap: float) -> float:
    """Seconds a call may take: `cap`, or less if the request's deadline is nearer."""
    deadline = _DEADLINE.get()
    if not deadline:
        return cap
    return max(MIN_BUDGET, min(cap, deadline - time.time()))


@contextmanager
def bounded_by(deadline: float) -> Iterator[None]:
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)
