"""The learning job's own phases (ADR-0006 phases 2, 4 and 5): per-agent slices of the
log, proposals of per-agent routing rules checked in observe mode, and the A/B share
that promotes or rejects them. One `PolicyLearning` per run: the slices it reads once
are what the later phases work on."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from shared.learning import proposals as store
from shared.learning.estimate import (
    Half,
    Replay,
    Tally,
    ab_verdict,
    best_threshold,
    current_models,
    first_model_rate,
    pool,
    propose_order,
    replay_threshold,
)
from shared.learning.proposals import Proposal, Status
from shared.learning.settings import LearnSettings
from shared.learning.slices import FROM_SQL, AgentSlice, gated_sql, load_slices, value_sql
from shared.policy.ab import apply_proposal, arm_sql
from shared.policy.agent import SLOTS, AgentPolicy, ClarityPolicy
from shared.policy.clarity import CONFIRM_THRESHOLD
from shared.store.policies import load_policies, load_policy, save_policy

log = logging.getLogger("intentroute.learning")

Clock = Callable[[], datetime]

# Requests a model needs on the fitting half before its rank in a chain is trusted.
MIN_MODEL_REQUESTS = 50


class PhaseError(RuntimeError):
    """A phase could not do its work (the message says why)."""


def _rate(value: float) -> float:
    return round(value, 4)


class PolicyLearning:
    def __init__(self, settings: LearnSettings) -> None:
        self.settings = settings
        self._slices: dict[str, AgentSlice] | None = None
        self._pools: dict[int | None, Half] = {}

    def _pooled(self, half: int | None) -> Half:
        """All agents' tallies on one half (None: both), computed once per run."""
        if half not in self._pools:
            slices = self.slices_loaded.values()
            self._pools[half] = pool(s.halves[half] if half is not None else s.both
                                     for s in slices)
        return self._pools[half]

    @property
    def slices_loaded(self) -> dict[str, AgentSlice]:
        if self._slices is None:
            raise PhaseError("no per-agent slices: the `slices` phase did not run or failed")
        return self._slices

    # --- phase 2 ------------------------------------------------------------------------

    async def slices(self, db: asyncpg.Connection, clock: Clock) -> dict[str, Any]:
        """Every agent's window of the log, aggregated."""
        now = clock()
        since = now - timedelta(days=self.settings.window_days)
        self._slices = await load_slices(db, since, now, ask_value=self.settings.ask_value)
        self._pools.clear()
        return {
            "agents": len(self._slices),
            "requests": int(sum(s.requests for s in self._slices.values())),
            "gated_decisions": int(sum(h.decisions for s in self._slices.values()
                                       for h in s.halves)),
            "since": since.isoformat(),
        }

    # --- phase 4: proposals -------------------------------------------------------------

    def _clarity_candidate(self, agent: AgentSlice, policy: AgentPolicy,
                           pooled: Half) -> dict[str, Any] | None:
        if not _asks(policy, agent):
            return None
        fit = agent.halves[0]
        if fit.decisions * 2 < self.settings.min_decisions:
            return None
        current = _threshold(policy)
        choice = best_threshold(fit, pooled, current, ask_value=self.settings.ask_value)
        if choice is None or choice.threshold == current or choice.gain < self.settings.min_gain:
            return None
        return {"key": "clarity_threshold", "value": choice.threshold,
                "baseline": policy.clarity_threshold, "gain": choice.gain,
                "figures": {"fit": {"current": choice.current.figures(),
                                    "proposed": choice.best.figures()}}}

    def _order_candidate(self, agent: AgentSlice, policy: AgentPolicy, slot: str,
                         pooled: Half) -> dict[str, Any] | None:
        if agent.slot_requests(slot) < self.settings.min_decisions:
            return None
        fit = agent.halves[0]
        chain = policy.fallback.get(slot)
        order = propose_order(chain, fit, pooled, slot, min_requests=MIN_MODEL_REQUESTS)
        current = current_models(chain, fit, slot)
        if order is None or not current or order[0] == current[0]:
            return None
        new = first_model_rate(order, fit, pooled, slot)
        old = first_model_rate(current, fit, pooled, slot)
        if new is None or old is None or new[1] - old[1] < self.settings.min_gain:
            return None
        return {"key": f"fallback.{slot}", "value": order, "baseline": chain,
                "gain": new[1] - old[1],
                "figures": {"fit": {"current": {"model": old[0], "rate": _rate(old[1])},
                                    "proposed": {"model": new[0], "rate": _rate(new[1])}}}}

    async def propose(self, db: asyncpg.Connection, clock: Clock) -> dict[str, Any]:
        """At most one new proposal per agent with enough traffic and none open: the
        candidate (clarity threshold, or a slot's fallback order) with the largest gain
        on the fitting half of its log, unless a proposal of that key was rejected lately."""
        slices, now = self.slices_loaded, clock()
        policies = await load_policies(db)
        busy = {p.agent_id for p in await store.with_status(db, *store.OPEN)}
        rejected = await store.recently_rejected(
            db, now - timedelta(days=self.settings.retry_days))
        pooled = self._pooled(0)
        made: list[dict[str, Any]] = []
        considered = 0
        for agent_id, agent in sorted(slices.items()):
            if agent.requests < self.settings.min_requests or agent_id in busy:
                continue
            considered += 1
            policy = policies.get(agent_id, AgentPolicy())
            candidates = [self._clarity_candidate(agent, policy, pooled),
                          *(self._order_candidate(agent, policy, slot, pooled)
                            for slot in SLOTS)]
            fresh = [c for c in candidates
                     if c is not None and (agent_id, c["key"]) not in rejected]
            if not fresh:
                continue
            best = max(fresh, key=lambda c: c["gain"])
            await store.insert(db, agent_id=agent_id, key=best["key"], value=best["value"],
                               baseline=best["baseline"], figures=best["figures"],
                               origin="learn", now=now)
            log.info("learning: agent %s: proposed %s=%s (was %s), fitted gain %.3f",
                     agent_id, best["key"], json.dumps(best["value"]),
                     json.dumps(best["baseline"]), best["gain"])
            made.append({"agent_id": agent_id, "key": best["key"], "value": best["value"],
                         "gain": _rate(best["gain"])})
        return {"agents_considered": considered, "proposed": len(made), "proposals": made}

    # --- phase 4b: observe mode ---------------------------------------------------------

    def _replay(self, proposal: Proposal, policy: AgentPolicy) -> tuple[bool, dict[str, Any]]:
        """(not worse?, figures) of the proposal replayed over the agent's log: the half
        it was not fitted on (both halves for an operator's proposal)."""
        slices = self.slices_loaded
        agent = slices.get(proposal.agent_id)
        if agent is None or agent.requests == 0:
            return False, {"reason": "no logged traffic in the window to replay"}
        if proposal.origin == "learn":
            data, pooled, scope = agent.halves[1], self._pooled(1), "held-out half"
        else:
            data, pooled, scope = agent.both, self._pooled(None), "whole window"
        if proposal.key == "clarity_threshold":
            ask_value, asking = self.settings.ask_value, _asks(policy, agent)
            old = replay_threshold(data, pooled, _threshold(policy), ask_value=ask_value,
                                   ask_policy=asking)
            new = replay_threshold(data, pooled, float(proposal.value), ask_value=ask_value,
                                   ask_policy=asking)
            if old is None or new is None:
                return False, {"reason": "the log has no evidence for a decision it changes",
                               "scope": scope}
            return _not_worse(old, new, scope)
        slot = proposal.key.partition(".")[2]
        current = current_models(policy.fallback.get(slot), data, slot)
        old_first = first_model_rate(current, data, pooled, slot)
        new_first = first_model_rate(list(proposal.value), data, pooled, slot)
        if old_first is None or new_first is None:
            return False, {"reason": f"the log has no evidence for the models of slot {slot}",
                           "scope": scope}
        figures = {"scope": scope,
                   "current": {"model": old_first[0], "rate": _rate(old_first[1])},
                   "proposed": {"model": new_first[0], "rate": _rate(new_first[1])}}
        return new_first[1] >= old_first[1] - 1e-9, figures

    async def observe(self, db: asyncpg.Connection, clock: Clock) -> dict[str, Any]:
        """Each waiting proposal replayed over the agent's logged traffic with the
        proposed setting and with the current one: not worse -> A/B share of the live
        traffic (one A/B per agent at a time: the others wait), worse -> rejected."""
        now = clock()
        pending = await store.with_status(db, Status.OBSERVE)
        in_ab = {p.agent_id for p in await store.with_status(db, Status.AB)}
        policies = await load_policies(db)
        counts = {"evaluated": 0, "to_ab": 0, "rejected": 0, "waiting": 0}
        for proposal in pending:
            policy = policies.get(proposal.agent_id, AgentPolicy())
            passed, replay = self._replay(proposal, policy)
            counts["evaluated"] += 1
            figures = {**proposal.figures, "observe": replay}
            if not passed:
                reason = "observe: " + replay.get(
                    "reason", "the proposed setting replays worse than the current one")
                await store.decide(db, proposal.id, Status.REJECTED, figures=figures,
                                   reason=reason, now=now)
                counts["rejected"] += 1
                log.info("learning: agent %s: %s=%s rejected in observe mode: %s",
                         proposal.agent_id, proposal.key, json.dumps(proposal.value),
                         json.dumps(replay))
                continue
            if proposal.agent_id in in_ab:
                await store.update_figures(db, proposal.id, figures)
                counts["waiting"] += 1
                continue
            await store.start_ab(db, proposal.id, share=self.settings.ab_share,
                                 figures=figures, now=now)
            in_ab.add(proposal.agent_id)
            counts["to_ab"] += 1
            log.info("learning: agent %s: %s=%s passed observe mode %s; A/B on %.0f%% of "
                     "its traffic", proposal.agent_id, proposal.key,
                     json.dumps(proposal.value), json.dumps(replay),
                     100 * self.settings.ab_share)
        return counts

    # --- phase 5: A/B -------------------------------------------------------------------

    async def _arms(self, db: asyncpg.Connection, proposal: Proposal,
                    now: datetime) -> tuple[Tally, Tally]:
        """(arm, control) of the agent's requests since the A/B started, among those the
        key can affect (clarity threshold: the gated decisions; a slot's order: the
        slot's requests)."""
        if proposal.key == "clarity_threshold":
            scope, args = gated_sql(), []
        else:
            scope, args = "r.model_slot = $6", [proposal.key.partition(".")[2]]
        rows = await db.fetch(
            f"SELECT {arm_sql('r.agent_id', 'r.request_id')} < $4 AS in_arm, "
            f"count(*) AS n, sum({value_sql('$5')}) AS v FROM {FROM_SQL} "
            f"WHERE r.agent_id = $1 AND r.created_at >= $2 AND r.created_at < $3 AND {scope} "
            "GROUP BY 1",
            proposal.agent_id, proposal.ab_started_at, now, proposal.share,
            self.settings.ask_value, *args)
        arm, control = Tally(), Tally()
        for row in rows:
            (arm if row["in_arm"] else control).add(float(row["n"]), float(row["v"]))
        return arm, control

    async def ab(self, db: asyncpg.Connection, clock: Clock) -> dict[str, Any]:
        """Each A/B with enough requests in its arm: promoted when the arm is not worse
        than the rest of the agent's traffic in the same period (`ab_verdict`), else
        rejected; an A/B that gets too few requests in `ab_max_days` is rejected."""
        now, s = clock(), self.settings
        counts = {"running": 0, "promoted": 0, "rejected": 0}
        decided: list[dict[str, Any]] = []
        for proposal in await store.with_status(db, Status.AB):
            assert proposal.ab_started_at is not None
            assert proposal.share is not None
            arm, control = await self._arms(db, proposal, now)
            if min(arm.n, control.n) < s.ab_min_requests:
                if now - proposal.ab_started_at < timedelta(days=s.ab_max_days):
                    counts["running"] += 1
                    await store.update_figures(db, proposal.id, {
                        **proposal.figures, "ab": {"arm_n": arm.n, "control_n": control.n,
                                                   "needed": s.ab_min_requests}})
                    continue
                reason = (f"A/B: {arm.n:.0f} requests in the arm after {s.ab_max_days:g} "
                          f"days (needs {s.ab_min_requests})")
                figures = {**proposal.figures, "ab": {"arm_n": arm.n, "control_n": control.n}}
                await store.decide(db, proposal.id, Status.REJECTED, figures=figures,
                                   reason=reason, now=now)
                counts["rejected"] += 1
                decided.append({"id": proposal.id, "agent_id": proposal.agent_id,
                                "status": "rejected", "reason": reason})
                continue
            verdict = ab_verdict(arm, control, margin=s.ab_margin)
            figures = {**proposal.figures, "ab": verdict.figures(arm, control, s.ab_margin)}
            status = Status.PROMOTED if verdict.promote else Status.REJECTED
            async with db.transaction():
                if verdict.promote:
                    current = await load_policy(db, proposal.agent_id)
                    await save_policy(db, proposal.agent_id,
                                      apply_proposal(current, proposal.key, proposal.value))
                await store.decide(db, proposal.id, status, figures=figures,
                                   reason="A/B: " + verdict.reason, now=now)
            counts[status.value] += 1
            decided.append({"id": proposal.id, "agent_id": proposal.agent_id,
                            "key": proposal.key, "value": proposal.value,
                            "status": status.value, **figures["ab"]})
            log.info("learning: agent %s: %s=%s %s: %s %s", proposal.agent_id, proposal.key,
                     json.dumps(proposal.value), status.value, verdict.reason,
                     json.dumps(figures["ab"]))
        return {**counts, "decided": decided}


def _threshold(policy: AgentPolicy) -> float:
    return policy.clarity_threshold if policy.clarity_threshold is not None \
        else CONFIRM_THRESHOLD


def _asks(policy: AgentPolicy, agent: AgentSlice) -> bool:
    """The agent's clarity policy is `ask`: set in its policy, or (unset there, so the
    classifier's global setting applies) seen in its log."""
    if policy.clarity_policy is not None:
        return policy.clarity_policy is ClarityPolicy.ASK
    return agent.asked


def _not_worse(old: Replay, new: Replay, scope: str) -> tuple[bool, dict[str, Any]]:
    figures = {"scope": scope, "current": old.figures(), "proposed": new.figures()}
    return new.rate >= old.rate - 1e-9, figures
