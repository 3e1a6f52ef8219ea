"""`bench learning`: the learning job over a month of logged traffic (ADR-0006).

A fresh embedded Postgres is seeded with COPY (not timed) with `rows` logged requests
(default 1,000,000) of `agents` agents (default 50, Zipf-like volumes) spread over 30
days: request-log rows as the pipeline writes them (layer, confidence, slot, model,
outcome, fallback), their `classify_history` rows, explicit feedback for a share of
them and implicit outcomes for the failures the pipeline knows; a third of the agents
ask when unsure, a fifth have their own fallback chain, and ten have a proposal in A/B
for the last three days. The table is analysed (as autovacuum would have done), then
the whole learning job runs once: `learn_1m_rows_s` is its wall time, with each phase's.

The other figures of `bench learning` come from the benchmarks of the parts that own
them, each on its own fresh stack: `feedback_to_score_s` from `bench feedback` (HTTP
feedback to a running gateway until the agent's score moved, median) and
`dashboard_load_ms` from `bench dashboard` (the page in headless Chromium with a month
of data for 50 agents, median). A figure that cannot be measured here (no Chromium) is
reported as null and listed under `not_measured`, never guessed.
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from shared.learning.job import learn_once
from shared.learning.settings import LearnSettings
from shared.policy.agent import AgentPolicy, apply_assignment
from shared.store import asyncpg_dsn, migrate
from shared.store.partitions import ensure_partitions
from shared.store.policies import save_policy


def _feedback_to_score_s() -> float | None:
    from bench.feedback import run as feedback_bench

    value = feedback_bench()["feedback_to_score_s"]
    return float(value) if value is not None else None


def _dashboard_load_ms() -> float | None:
    from bench.dashboard import run as dashboard_bench

    value = dashboard_bench()["dashboard_load_ms"]
    return float(value) if value is not None else None


# Key -> its measurement:
#   feedback_to_score_s: feedback sent -> the agent's updated score visible (seconds)
#   dashboard_load_ms:   the dashboard page with a month of data for 50 agents (ms)
Hook = Callable[[], float | None]
HOOKS: dict[str, Hook] = {"feedback_to_score_s": _feedback_to_score_s,
                          "dashboard_load_ms": _dashboard_load_ms}

DAYS = 30
CHUNK = 100_000
TYPES = (("RETRIEVAL", "main"), ("CODE_GENERATION", "main"), ("CONVERSATIONAL",
         "conversational"), ("PLATFORM", "conversational"))
# Deciding layer of a logged decision, and its share.
LAYERS = (("rules", 0.40), ("embedding", 0.33), ("declared", 0.02), ("llm", 0.10),
          ("fallback", 0.15))
EXPLICIT_SHARE = 0.3

_REQUEST_COLUMNS = ["agent_id", "request_id", "session_id", "query_type", "layer",
                    "confidence", "model_slot", "answered_by", "total_ms", "outcome",
                    "created_at", "model", "tokens_in", "tokens_out", "first_chunk_ms",
                    "compute_ms", "fallback", "fallback_reason"]
_HISTORY_COLUMNS = ["agent_id", "session_id", "request_id", "type", "topic", "layer",
                    "confidence", "created_at"]
_FEEDBACK_COLUMNS = ["agent_id", "request_id", "outcome", "source", "completion_quality",
                     "created_at", "updated_at"]


class _Agent:
    """One seeded agent: its volume, policy and truth (what succeeds for it)."""

    def __init__(self, index: int, requests: int) -> None:
        self.id = f"agent-{index:02d}"
        self.requests = requests
        self.asks = index % 3 == 0
        self.threshold = 0.65
        self.chain = ["m-small", "m-big", "extractive"] if index % 5 == 0 else None
        self.ask_success = 0.2 + 0.15 * (index % 4)
        self.answer_bias = 0.1 * ((index % 5) - 2)
        self.model_success = {"m-big": 0.92 - 0.02 * (index % 3),
                              "m-small": 0.7 + 0.05 * (index % 4)}

    def policy(self) -> AgentPolicy:
        policy = AgentPolicy()
        if self.asks:
            policy = apply_assignment(policy, "clarity_policy=ask")
            policy = apply_assignment(policy, f"clarity_threshold={self.threshold}")
        if self.chain:
            policy = apply_assignment(policy, "fallback.main=" + ",".join(self.chain))
        return policy


def _agents(rows: int, count: int) -> list[_Agent]:
    weights = [1 / (i + 1) ** 0.8 for i in range(count)]
    total = sum(weights)
    volumes = [int(rows * w / total) for w in weights]
    volumes[0] += rows - sum(volumes)
    return [_Agent(i, n) for i, n in enumerate(volumes)]


def _generate(agent: _Agent, now: datetime, rng: random.Random,
              ) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...] | None]]:
    """(request_log row, classify_history row, feedback row or None) per request."""
    start = now - timedelta(days=DAYS)
    span = DAYS * 86400.0
    layer_names = [name for name, _ in LAYERS]
    layer_weights = [w for _, w in LAYERS]
    for i in range(agent.requests):
        request_id = f"{agent.id}-{i}"
        session = f"s{i // 8}"
        at = start + timedelta(seconds=rng.random() * span)
        query_type, slot = TYPES[rng.randrange(4)]
        layer = rng.choices(layer_names, layer_weights)[0]
        unsure = layer in ("llm", "fallback")
        confidence = rng.uniform(0.3, 0.85) if unsure else rng.uniform(0.85, 1.0)
        asked = unsure and agent.asks and confidence < agent.threshold
        if slot == "main":
            model = agent.chain[0] if agent.chain else ("m-big", "m-small")[i % 2]
        else:
            model = "m-small"
        fallback, reason, outcome = False, "", "ok"
        if asked:
            model, outcome, p = "", "clarification", agent.ask_success
        else:
            p = agent.model_success[model]
            if unsure:
                p *= min(1.0, max(0.0, confidence + agent.answer_bias))
            roll = rng.random()
            if roll < 0.01:
                outcome = "error:STAGE_FAILED"
            elif roll < 0.04:
                fallback, reason, model = True, "backend_error", "extractive"
        tokens_in = 0 if model in ("", "extractive") else rng.randrange(50, 2000)
        tokens_out = 0 if model in ("", "extractive") else rng.randrange(20, 600)
        total_ms = rng.uniform(20, 900)
        request = (agent.id, request_id, session, query_type, layer, round(confidence, 4),
                   slot, model or "classifier", total_ms, outcome, at, model, tokens_in,
                   tokens_out, total_ms * 0.3, total_ms * 0.8, fallback, reason)
        history = (agent.id, session, request_id, query_type, "topic", layer,
                   round(confidence, 4), at)
        feedback: tuple[Any, ...] | None = None
        if outcome.startswith("error:"):
            feedback = (agent.id, request_id, "error", "implicit", None, at, at)
        elif fallback:
            feedback = (agent.id, request_id, "fallback", "implicit", None, at, at)
        elif rng.random() < EXPLICIT_SHARE:
            good = rng.random() < p
            feedback = (agent.id, request_id, "success" if good else "user_rejected",
                        "explicit", float(rng.randrange(6, 11) if good else rng.randrange(0, 5)),
                        at, at)
        yield request, history, feedback


async def _seed(db_url: str, agents: list[_Agent], now: datetime) -> dict[str, int]:
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    counts = {"request_log": 0, "classify_history": 0, "feedback": 0}
    try:
        # A month of day partitions, as the accounting pass keeps them in a running
        # deployment (rows of a day without one would wait in the DEFAULT partition).
        await ensure_partitions(conn, [(now - timedelta(days=d)).date()
                                       for d in range(-1, DAYS + 1)])
        rng = random.Random(14)
        for agent in agents:
            batch: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
            for request, history, feedback in _generate(agent, now, rng):
                batch[0].append(request)
                batch[1].append(history)
                if feedback is not None:
                    batch[2].append(feedback)
                if len(batch[0]) >= CHUNK:
                    await _copy(conn, batch, counts)
                    batch = ([], [], [])
            await _copy(conn, batch, counts)
            await save_policy(conn, agent.id, agent.policy())
        # Ten agents with a proposal in A/B for the last three days.
        for agent in agents[:10]:
            await conn.execute(
                "INSERT INTO learning_proposals (agent_id, key, value, status, origin, share,"
                " created_at, ab_started_at) VALUES ($1, 'clarity_threshold', '0.55', 'ab',"
                " 'learn', 0.1, $2, $2)", agent.id, now - timedelta(days=3))
        await conn.execute("ANALYZE")
    finally:
        await conn.close()
    return counts


async def _copy(conn: asyncpg.Connection, batch: tuple[list[Any], list[Any], list[Any]],
                counts: dict[str, int]) -> None:
    requests, history, feedback = batch
    if requests:
        await conn.copy_records_to_table("request_log", records=requests,
                                         columns=_REQUEST_COLUMNS)
        await conn.copy_records_to_table("classify_history", records=history,
                                         columns=_HISTORY_COLUMNS)
    if feedback:
        await conn.copy_records_to_table("feedback", records=feedback,
                                         columns=_FEEDBACK_COLUMNS)
    counts["request_log"] += len(requests)
    counts["classify_history"] += len(history)
    counts["feedback"] += len(feedback)


def run(rows: int = 1_000_000, agents: int = 50) -> dict[str, Any]:
    from intentroute.stack.postgres import PostgresServer

    now = datetime.now(UTC).replace(microsecond=0)
    fleet = _agents(rows, agents)
    with tempfile.TemporaryDirectory(prefix="ir-bench-learning-") as tmp:
        pg = PostgresServer(Path(tmp) / "postgres").start()
        try:
            migrate(pg.url)
            t0 = time.perf_counter()
            seeded = asyncio.run(_seed(pg.url, fleet, now))
            seed_s = time.perf_counter() - t0
            settings = LearnSettings()
            t1 = time.perf_counter()
            summary = asyncio.run(learn_once(pg.url, settings, clock=lambda: now))
            learn_s = time.perf_counter() - t1
            report: dict[str, Any] = {
                "learn_1m_rows_s": round(learn_s, 2),
                "learn_phases_s": {name: figures["seconds"]
                                   for name, figures in summary["phases"].items()},
                "learn_ok": summary["ok"],
                "rows": seeded,
                "agents": agents,
                "seed_s": round(seed_s, 1),
                "proposed": summary["phases"].get("propose", {}).get("proposed"),
                "observe": {k: v for k, v in summary["phases"].get("observe", {}).items()
                            if k != "seconds"},
                "ab": {k: v for k, v in summary["phases"].get("ab", {}).items()
                       if k in ("running", "promoted", "rejected")},
            }
        finally:
            pg.stop()
    not_measured = []
    for key, hook in HOOKS.items():
        report[key] = hook()
        if report[key] is None:
            not_measured.append(key)
    report["not_measured"] = not_measured
    return report


if __name__ == "__main__":
    print(json.dumps(run()))
