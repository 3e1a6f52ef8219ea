"""The global defaults of the per-agent limits (LIMIT_*), read here only; an agent's
policy overrides each one (`intentroute agent set NAME rate=20/s ...`). "off" (or unset)
turns a limit off.

Every limit is off by default. Checking one is now nearly free for the requests
(`bench pipeline --limits`, every limit configured far above the load, against all off:
throughput and latency within the runs' noise, see docs/explanation/limits.md, Cost (measured)): a
gateway replica admits on an allowance leased from Postgres (lease.py), one statement
per lease instead of one per request. What stays is background work per agent with a
limit: about two statements a second per active agent and gateway replica, and one
statement a request near its limits. A global default would put every agent on that
footing (a thousand active agents: ~2,000 statements a second per replica) for limits
whose right values depend on the deployment, while fair share and the per-agent stream
caps (STREAM_MAX_PER_AGENT) already keep one agent from starving the others at no cost.
Set LIMIT_* for a global default or `agent set` per agent; budgets have no global
default (cost units mean something only with an agent's own prices)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import msgspec

from shared.common.settings import env, read_env
from shared.policy.agent import OnBudget, per_second


def _off(raw: str) -> bool:
    return raw.strip().lower() == "off"


def _rate(raw: str) -> float | None:
    return None if _off(raw) else per_second("LIMIT_RATE", raw.strip())


def _count(raw: str) -> int | None:
    if _off(raw):
        return None
    value = int(raw)
    if value < 1:
        raise ValueError("expected a whole number >= 1 or off")
    return value


def _amount(raw: str) -> float | None:
    if _off(raw):
        return None
    value = float(raw)
    if not 0 <= value < float("inf"):
        raise ValueError("expected a number >= 0 or off")
    return value


class LimitSettings(msgspec.Struct, frozen=True, kw_only=True):
    # Requests per second (a rate: 1000, 1000/s, 60000/min) refilling each agent's bucket.
    rate: Annotated[float | None, env("LIMIT_RATE", parse=_rate, blank_is_unset=True)] = None
    # The bucket's size; unset: twice the rate (a second's worth of burst, twice over).
    burst: Annotated[int | None, env("LIMIT_BURST", parse=_count, blank_is_unset=True)] = None
    # Requests of one agent admitted and not answered yet.
    max_inflight: Annotated[int | None, env("LIMIT_MAX_INFLIGHT", parse=_count,
                                            blank_is_unset=True)] = None
    # Model tokens (in + out, as the request log counts them) per sliding minute.
    tokens_per_min: Annotated[int | None, env("LIMIT_TOKENS_PER_MIN", parse=_count,
                                              blank_is_unset=True)] = None
    # Cost units per UTC day / month, priced with the agent's own price table.
    budget_day: Annotated[float | None, env("LIMIT_BUDGET_DAY", parse=_amount,
                                            blank_is_unset=True)] = None
    budget_month: Annotated[float | None, env("LIMIT_BUDGET_MONTH", parse=_amount,
                                              blank_is_unset=True)] = None
    # Past a budget: refuse (BUDGET_EXCEEDED), or degrade (the extractive answer, marked).
    on_budget: Annotated[OnBudget, env("LIMIT_ON_BUDGET")] = OnBudget.REFUSE

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LimitSettings:
        return read_env(cls, environ)
