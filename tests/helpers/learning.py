"""The learning job's test world: a fresh database per test, a clock the test moves, and
agents whose truth is known (how likely an answer at a given confidence, a clarifying
question, or a model is to succeed), whose traffic is seeded into the request log and
`feedback` as the pipeline and the agent would write it."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from shared.policy.ab import effective_policy
from shared.policy.agent import AgentPolicy
from shared.store import asyncpg_dsn, migrate

_TEMPLATE = "learn_template"
_templates: set[str] = set()


def _with_db(url: str, name: str) -> str:
    parts = urlsplit(asyncpg_dsn(url))
    return urlunsplit(parts._replace(path="/" + name))


@asynccontextmanager
async def fresh_database(server_url: str) -> AsyncIterator[str]:
    """A new, migrated database on the test server (cloned from a migrated template),
    dropped afterwards: the job reads every agent, so each test gets its own."""
    admin = await asyncpg.connect(_with_db(server_url, "postgres"))
    try:
        if server_url not in _templates:
            await admin.execute(f"DROP DATABASE IF EXISTS {_TEMPLATE}")
            await admin.execute(f"CREATE DATABASE {_TEMPLATE}")
            await asyncio.to_thread(migrate, _with_db(server_url, _TEMPLATE))
            _templates.add(server_url)
        name = f"learn_{uuid.uuid4().hex[:12]}"
        await admin.execute(f"CREATE DATABASE {name} TEMPLATE {_TEMPLATE}")
        try:
            yield _with_db(server_url, name)
        finally:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


@dataclass
class Truth:
    """What really happens to an agent's requests."""

    # Success probability of an answer to an unsure message, by its confidence.
    answer: Callable[[float], float] = lambda c: c
    # Success probability of a clarifying question.
    ask: float = 0.35
    # Success probability of an answer by each model of the main slot.
    models: dict[str, float] = field(default_factory=lambda: {"m-big": 1.0})
    # Share of messages the classifier is unsure about (Layer 3 / fallback).
    unsure: float = 0.6


_REQUEST_COLUMNS = ["agent_id", "request_id", "session_id", "query_type", "layer",
                    "confidence", "model_slot", "model", "outcome", "fallback", "created_at"]
_FEEDBACK_COLUMNS = ["agent_id", "request_id", "outcome", "source", "created_at",
                     "updated_at"]


@dataclass
class Traffic:
    requests: list[tuple[object, ...]] = field(default_factory=list)
    feedback: list[tuple[object, ...]] = field(default_factory=list)
    asked: int = 0


PolicyFor = Callable[[str], AgentPolicy]


def simulate(agent_id: str, truth: Truth, n: int, *, start: datetime, end: datetime,
             policy_for: PolicyFor, seed: int) -> Traffic:
    """`n` requests of `agent_id` spread over [start, end), each handled with the policy
    `policy_for(request_id)` gives it (its clarity gate; the first model of its main
    chain answers, or, without a chain, the models take turns), the outcome drawn from
    `truth` and reported as explicit feedback (success or user_rejected)."""
    rng = random.Random(seed)
    traffic = Traffic()
    span = (end - start).total_seconds()
    models = sorted(truth.models)
    for i in range(n):
        request_id = f"{agent_id}-{seed}-{i}"
        policy = policy_for(request_id)
        at = start + timedelta(seconds=span * i / n)
        unsure = rng.random() < truth.unsure
        confidence = rng.uniform(0.30, 0.85) if unsure else rng.uniform(0.85, 1.0)
        threshold = policy.clarity_threshold if policy.clarity_threshold is not None else 0.65
        asks = unsure and policy.clarity_policy == "ask" and confidence < threshold
        chain = policy.fallback.get("main")
        model = chain[0] if chain else models[i % len(models)]
        if asks:
            p, outcome, model = truth.ask, "clarification", ""
            traffic.asked += 1
        else:
            p = truth.models[model] * (truth.answer(confidence) if unsure else 1.0)
            outcome = "ok"
        success = rng.random() < p
        traffic.requests.append((agent_id, request_id, f"s-{i % 50}", "RETRIEVAL",
                                 "fallback" if unsure else "embedding", round(confidence, 4),
                                 "main", model, outcome, False, at))
        traffic.feedback.append((agent_id, request_id,
                                 "success" if success else "user_rejected", "explicit", at,
                                 at))
    return traffic


def ab_policy(agent_id: str, base: AgentPolicy,
              candidates: dict[str, tuple[AgentPolicy, float]]) -> PolicyFor:
    """What a worker serves `agent_id` while the job's candidates are under A/B."""
    candidate, share = candidates.get(agent_id, (None, 0.0))
    return lambda request_id: effective_policy(base, candidate, agent_id, request_id, share)


async def store_traffic(conn: asyncpg.Connection, traffic: Traffic) -> None:
    await conn.copy_records_to_table("request_log", records=traffic.requests,
                                     columns=_REQUEST_COLUMNS)
    await conn.copy_records_to_table("feedback", records=traffic.feedback,
                                     columns=_FEEDBACK_COLUMNS)
