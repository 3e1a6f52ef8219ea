"""The cost report (`intentroute report costs`): per agent and model from the daily
rollups, the saving against the main slot's model, and cost anomalies.

* cost: the rollups' cost (tokens * the agent's price + compute seconds * its compute
  price; see rollups.py);
* main_slot_cost: the same tokens and compute seconds priced at the agent's price for
  the main slot's model (`OLLAMA_MODEL_NAME`, or `--main-model`): what the agent's
  traffic would have cost had every request gone to the main slot; None when the
  agent has no price for that model. saving = main_slot_cost - cost. Requests answered
  without a model (extractive answers, clarifications, errors) have no tokens and count
  zero on both sides, so the saving is a lower bound;
* anomaly: a day of the window whose cost exceeds mean + 2 sd (sample standard deviation)
  of the same agent's cost on its days with traffic among the 28 days before it (a
  trailing window, read from the rollups, which reach back a year), once it has at
  least 7 such days;
* refused: the agent's requests refused at admission, by code (RATE_LIMITED,
  CONCURRENCY_LIMITED, QUOTA_EXCEEDED, BUDGET_EXCEEDED; `daily_outcomes`). They are
  among its requests and errors (model "", no tokens) and never billed: no model ran;
* currency: the agent's `currency` policy key (its prices' currency), "" for plain cost
  units; totals are also given per currency, since agents may price in different ones.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import date, timedelta
from typing import Any

import asyncpg
import msgspec

from shared.accounting.hashing import AgentNamer, identity
from shared.accounting.rollups import Prices
from shared.contracts.errors import ADMISSION_REFUSALS
from shared.policy.agent import Price, price_of

# Refusals at admission (per-agent limits): logged as `error:<CODE>`, nothing answered.
REFUSALS = tuple(code.value for code in ADMISSION_REFUSALS)
ERROR_PREFIX = "error:"

TRAILING_DAYS = 28
MIN_HISTORY_DAYS = 7
SIGMAS = 2.0


class ModelCost(msgspec.Struct, kw_only=True):
    model: str
    requests: int
    errors: int
    fallbacks: int
    tokens_in: int
    tokens_out: int
    compute_s: float
    cost: float
    # False when the agent has no price for this model (its cost counts 0).
    priced: bool


class AgentCost(msgspec.Struct, kw_only=True):
    agent_id: str
    requests: int
    errors: int
    fallbacks: int
    tokens_in: int
    tokens_out: int
    compute_s: float
    cost: float
    main_slot_cost: float | None
    saving: float | None
    models: list[ModelCost]
    # Refused at admission, by code (among `requests`; never billed).
    refused: dict[str, int] = {}
    currency: str = ""


class Anomaly(msgspec.Struct, kw_only=True):
    agent_id: str
    day: str
    cost: float
    mean: float
    stdev: float
    threshold: float
    history_days: int


class CostTotals(msgspec.Struct, kw_only=True):
    requests: int
    tokens_in: int
    tokens_out: int
    compute_s: float
    cost: float
    # Over the agents that have a main-slot price.
    main_slot_cost: float
    saving: float
    refused: dict[str, int] = {}
    # Cost per currency ("" = plain cost units): `cost` adds them up only when one.
    cost_by_currency: dict[str, float] = {}


class CostReport(msgspec.Struct, kw_only=True):
    since: str
    until: str
    main_model: str
    hashed_agents: bool
    agents: list[AgentCost]
    totals: CostTotals
    anomalies: list[Anomaly]
    # Agents and models with usage but no price (counted at 0).
    unpriced: list[dict[str, Any]]


def price_cost(price: Price, tokens_in: float, tokens_out: float, compute_s: float) -> float:
    return (tokens_in / 1000.0 * price.input_per_1k + tokens_out / 1000.0 * price.output_per_1k
            + compute_s * price.per_compute_s)


def anomalies(daily: Mapping[str, Mapping[date, float]], since: date, until: date
              ) -> list[Anomaly]:
    """Days in [since, until] whose cost is above the agent's trailing mean + 2 sd."""
    found = []
    for agent, days in daily.items():
        for day in sorted(d for d in days if since <= d <= until):
            history = [cost for d, cost in days.items()
                       if day - timedelta(days=TRAILING_DAYS) <= d < day]
            if len(history) < MIN_HISTORY_DAYS:
                continue
            mean, stdev = statistics.fmean(history), statistics.stdev(history)
            threshold = mean + SIGMAS * stdev
            if days[day] > threshold:
                found.append(Anomaly(agent_id=agent, day=day.isoformat(), cost=days[day],
                                     mean=mean, stdev=stdev, threshold=threshold,
                                     history_days=len(history)))
    return found


def build_cost_report(model_rows: Sequence[Mapping[str, Any]],
                      daily: Mapping[str, Mapping[date, float]], *, prices: Prices,
                      main_model: str, since: date, until: date,
                      name: AgentNamer = identity,
                      refused: Mapping[str, Mapping[str, int]] | None = None,
                      currencies: Mapping[str, str] | None = None) -> CostReport:
    """The report from the window's (agent, model) sums, the agents' daily costs, their
    refusals by code and their prices' currencies."""
    refused = refused or {}
    currencies = currencies or {}
    by_agent: dict[str, list[ModelCost]] = defaultdict(list, {a: [] for a in refused})
    unpriced = []
    for row in model_rows:
        agent, model = row["agent_id"], row["model"]
        priced = price_of(dict(prices.get(agent, {})), model) is not None
        by_agent[agent].append(ModelCost(
            model=model, requests=int(row["requests"]), errors=int(row["errors"]),
            fallbacks=int(row["fallbacks"]), tokens_in=int(row["tokens_in"]),
            tokens_out=int(row["tokens_out"]), compute_s=float(row["compute_s"]),
            cost=float(row["cost"]), priced=priced))
        if not priced and (row["tokens_in"] or row["tokens_out"] or row["compute_s"]):
            unpriced.append({"agent_id": name(agent), "model": model,
                             "tokens_in": int(row["tokens_in"]),
                             "tokens_out": int(row["tokens_out"]),
                             "compute_s": float(row["compute_s"])})
    agents = []
    for agent, models in sorted(by_agent.items()):
        cost = _agent_cost(agent, models, price_of(dict(prices.get(agent, {})), main_model),
                           name)
        cost.refused = _by_code(refused.get(agent, {}))
        cost.currency = currencies.get(agent, "")
        agents.append(cost)
    by_currency: dict[str, float] = defaultdict(float)
    all_refused: dict[str, int] = defaultdict(int)
    for a in agents:
        by_currency[a.currency] += a.cost
        for code, n in a.refused.items():
            all_refused[code] += n
    totals = CostTotals(
        requests=sum(a.requests for a in agents), tokens_in=sum(a.tokens_in for a in agents),
        tokens_out=sum(a.tokens_out for a in agents),
        compute_s=sum(a.compute_s for a in agents), cost=sum(a.cost for a in agents),
        main_slot_cost=sum(a.main_slot_cost for a in agents if a.main_slot_cost is not None),
        saving=sum(a.saving for a in agents if a.saving is not None),
        refused=_by_code(all_refused), cost_by_currency=dict(sorted(by_currency.items())))
    found = anomalies(daily, since, until)
    for anomaly in found:
        anomaly.agent_id = name(anomaly.agent_id)
    return CostReport(since=since.isoformat(), until=until.isoformat(), main_model=main_model,
                      hashed_agents=name is not identity, agents=agents, totals=totals,
                      anomalies=found, unpriced=unpriced)


def _by_code(counts: Mapping[str, int]) -> dict[str, int]:
    """Refusal counts in REFUSALS' order, the codes without any left out."""
    return {code: counts[code] for code in REFUSALS if counts.get(code)}


def _agent_cost(agent: str, models: list[ModelCost], main_price: Price | None,
                name: AgentNamer) -> AgentCost:
    models.sort(key=lambda m: (-m.cost, m.model))
    cost = sum(m.cost for m in models)
    main = (sum(price_cost(main_price, m.tokens_in, m.tokens_out, m.compute_s) for m in models)
            if main_price is not None else None)
    return AgentCost(
        agent_id=name(agent), requests=sum(m.requests for m in models),
        errors=sum(m.errors for m in models), fallbacks=sum(m.fallbacks for m in models),
        tokens_in=sum(m.tokens_in for m in models), tokens_out=sum(m.tokens_out for m in models),
        compute_s=sum(m.compute_s for m in models), cost=cost, main_slot_cost=main,
        saving=main - cost if main is not None else None, models=models)


_SQL_MODELS = """
SELECT agent_id, model, sum(requests) AS requests, sum(errors) AS errors,
       sum(fallbacks) AS fallbacks, sum(tokens_in) AS tokens_in,
       sum(tokens_out) AS tokens_out, sum(compute_s) AS compute_s, sum(cost) AS cost
FROM daily_rollups WHERE day >= $1 AND day <= $2
GROUP BY agent_id, model
"""
_SQL_DAILY = """
SELECT agent_id, day, sum(cost) AS cost FROM daily_rollups
WHERE day >= $1 AND day <= $2 GROUP BY agent_id, day
"""
_SQL_REFUSED = """
SELECT agent_id, substr(outcome, length($3) + 1) AS code, sum(requests)::bigint AS n
FROM daily_outcomes WHERE day >= $1 AND day <= $2 AND outcome = ANY($4::text[])
GROUP BY 1, 2
"""


async def cost_report(conn: asyncpg.Connection, since: date, until: date, *, prices: Prices,
                      main_model: str, name: AgentNamer = identity,
                      currencies: Mapping[str, str] | None = None) -> CostReport:
    """The report from the rollups as they are (refresh them first for fresh figures)."""
    model_rows = await conn.fetch(_SQL_MODELS, since, until)
    daily: dict[str, dict[date, float]] = defaultdict(dict)
    for row in await conn.fetch(_SQL_DAILY, since - timedelta(days=TRAILING_DAYS), until):
        daily[row["agent_id"]][row["day"]] = float(row["cost"])
    refused: dict[str, dict[str, int]] = defaultdict(dict)
    for row in await conn.fetch(_SQL_REFUSED, since, until, ERROR_PREFIX,
                                [ERROR_PREFIX + code for code in REFUSALS]):
        refused[row["agent_id"]][row["code"]] = int(row["n"])
    return build_cost_report([dict(r) for r in model_rows], daily, prices=prices,
                             main_model=main_model, since=since, until=until, name=name,
                             refused=refused, currencies=currencies)


CSV_COLUMNS = ("agent_id", "model", "requests", "errors", "fallbacks", "tokens_in",
               "tokens_out", "compute_s", "cost", "main_slot_cost", "saving", "currency",
               *(f"refused_{code.lower()}" for code in REFUSALS))


def csv_rows(report: CostReport) -> list[tuple[object, ...]]:
    """One line per (agent, model), then the agent's total as model `*` (with the
    main-slot cost, saving and refusals by code, which are per agent)."""
    rows: list[tuple[object, ...]] = []
    for agent in report.agents:
        for m in agent.models:
            rows.append((agent.agent_id, m.model, m.requests, m.errors, m.fallbacks,
                         m.tokens_in, m.tokens_out, m.compute_s, m.cost, "", "",
                         agent.currency, *([""] * len(REFUSALS))))
        rows.append((agent.agent_id, "*", agent.requests, agent.errors, agent.fallbacks,
                     agent.tokens_in, agent.tokens_out, agent.compute_s, agent.cost,
                     "" if agent.main_slot_cost is None else agent.main_slot_cost,
                     "" if agent.saving is None else agent.saving, agent.currency,
                     *(agent.refused.get(code, 0) for code in REFUSALS)))
    return rows


def refused_text(refused: Mapping[str, int]) -> str:
    """`RATE_LIMITED 12, BUDGET_EXCEEDED 3`, or `-` when none."""
    return ", ".join(f"{code} {n}" for code, n in refused.items()) or "-"


def anomaly_line(a: Anomaly) -> str:
    return (f"ANOMALY {a.agent_id} {a.day}: cost {a.cost:.4f} > mean {a.mean:.4f} + "
            f"{SIGMAS:g} sd ({a.stdev:.4f}) = {a.threshold:.4f} over its {a.history_days} "
            f"previous days with traffic")
