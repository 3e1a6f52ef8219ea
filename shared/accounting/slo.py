"""The SLO report (`intentroute report slo`): per agent and UTC day, p50/p95/p99 of the
request's total time (admission to final answer) from `daily_agent_latency`, each day's
p95 checked against the agent's `slo_p95_ms`.

Percentiles do not add up across days, so the window's figures per agent are the
request-weighted means of its daily percentiles (an approximation, labelled as such)
next to the worst day's p95; breaches are decided per day, exactly.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import date
from typing import Any

import asyncpg
import msgspec

from shared.accounting.hashing import AgentNamer, identity
from shared.policy.agent import AgentPolicy


class SloDay(msgspec.Struct, kw_only=True):
    day: str
    requests: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    breach: bool


class AgentSlo(msgspec.Struct, kw_only=True):
    agent_id: str
    slo_p95_ms: float | None
    requests: int
    # Request-weighted means of the daily percentiles (days with a figure).
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    worst_day_p95_ms: float | None
    breach_days: int
    breached: bool
    days: list[SloDay]


class SloReport(msgspec.Struct, kw_only=True):
    since: str
    until: str
    hashed_agents: bool
    agents: list[AgentSlo]


def _weighted(days: list[SloDay], field: str) -> float | None:
    pairs = [(getattr(d, field), d.requests) for d in days if getattr(d, field) is not None]
    weight = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / weight if weight else None


def build_slo_report(rows: Sequence[Mapping[str, Any]], policies: Mapping[str, AgentPolicy],
                     *, since: date, until: date, name: AgentNamer = identity) -> SloReport:
    per_agent: dict[str, list[SloDay]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: (r["agent_id"], r["day"])):
        slo = policies.get(row["agent_id"], AgentPolicy()).slo_p95_ms
        p95 = row["latency_p95_ms"]
        per_agent[row["agent_id"]].append(SloDay(
            day=row["day"].isoformat(), requests=int(row["requests"]),
            p50_ms=row["latency_p50_ms"], p95_ms=p95, p99_ms=row["latency_p99_ms"],
            breach=slo is not None and p95 is not None and p95 > slo))
    agents = []
    for agent, days in per_agent.items():
        p95s = [d.p95_ms for d in days if d.p95_ms is not None]
        breaches = sum(d.breach for d in days)
        agents.append(AgentSlo(
            agent_id=name(agent), slo_p95_ms=policies.get(agent, AgentPolicy()).slo_p95_ms,
            requests=sum(d.requests for d in days), p50_ms=_weighted(days, "p50_ms"),
            p95_ms=_weighted(days, "p95_ms"), p99_ms=_weighted(days, "p99_ms"),
            worst_day_p95_ms=max(p95s) if p95s else None, breach_days=breaches,
            breached=breaches > 0, days=days))
    return SloReport(since=since.isoformat(), until=until.isoformat(),
                     hashed_agents=name is not identity, agents=agents)


async def slo_report(conn: asyncpg.Connection, since: date, until: date, *,
                     policies: Mapping[str, AgentPolicy],
                     name: AgentNamer = identity) -> SloReport:
    rows = await conn.fetch(
        "SELECT day, agent_id, requests, latency_p50_ms, latency_p95_ms, latency_p99_ms "
        "FROM daily_agent_latency WHERE day >= $1 AND day <= $2", since, until)
    return build_slo_report([dict(r) for r in rows], policies, since=since, until=until,
                            name=name)


def breach_line(agent: AgentSlo, day: SloDay) -> str:
    return (f"BREACH {agent.agent_id} {day.day}: p95 {day.p95_ms:.1f} ms > SLO "
            f"{agent.slo_p95_ms:g} ms ({day.requests} requests)")
