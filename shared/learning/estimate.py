"""Pure estimators of the learning job: success rates of an agent's logged traffic under
a setting it did not run with (observe mode), the proposals they lead to, and the A/B
verdict. No I/O: the job hands in tallies aggregated from the request log (`slices`).

A request's *value* is 1 for a success and 0 otherwise (the outcome of its `feedback`
row, else what the pipeline knows: an answer without fallback or error is a success); a
clarifying question without feedback is worth `ask_value`. A success rate is the mean
value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shared.policy.clarity import DECIDE_THRESHOLD, asks, clarity

# Pseudo-observations of a prior: an agent's own rate is shrunk toward the pooled one
# (all agents) with this weight, and a pooled rate needs this many observations to be
# evidence at all.
SHRINK = 20.0
# Confidence bins of the log: 0.01 wide (a threshold on the 0.01 grid splits none); the
# rate of answering is estimated on 0.05-wide bins, which have the observations.
BINS = 100
COARSE = 5
# Thresholds a proposal may choose (besides the current one).
THRESHOLD_GRID = tuple(round(0.30 + 0.05 * i, 2) for i in range(12))  # 0.30 ... 0.85
# Steps of a fallback chain that are not models (the chain's end).
CHAIN_ENDS = frozenset({"extractive", "error"})
# One-sided 5%: the arm is "significantly worse" below this z.
Z_WORSE = -1.645


@dataclass
class Tally:
    """Requests and the sum of their values."""

    n: float = 0.0
    v: float = 0.0

    def add(self, n: float, v: float) -> None:
        self.n += n
        self.v += v

    @property
    def rate(self) -> float:
        return self.v / self.n if self.n else 0.0


def shrunk(own: Tally, prior: float) -> float:
    return (own.v + SHRINK * prior) / (own.n + SHRINK)


def threshold_bin(threshold: float) -> int:
    """Decisions in bins below this one have a confidence below the threshold."""
    return round(threshold * BINS)


def conf_bin(confidence: float) -> int:
    return min(BINS - 1, max(0, math.floor(confidence * BINS)))


@dataclass
class Half:
    """One agent's tallies on one half of its requests (split by a hash of the request
    id: proposals are fitted on one half and checked in observe mode on the other)."""

    # Decisions the clarity threshold governs (Layer 3 / fallback, below the decide
    # threshold): (confidence bin, asked?) -> tally.
    gates: dict[tuple[int, bool], Tally] = field(default_factory=dict)
    # (model slot, model that answered) -> tally.
    models: dict[tuple[str, str], Tally] = field(default_factory=dict)

    def gate(self, bin_: int, asked: bool) -> Tally:
        return self.gates.setdefault((bin_, asked), Tally())

    def model(self, slot: str, model: str) -> Tally:
        return self.models.setdefault((slot, model), Tally())

    @property
    def decisions(self) -> float:
        return sum(t.n for t in self.gates.values())


def pool(halves: Iterable[Half]) -> Half:
    """All agents' tallies summed: the priors."""
    pooled = Half()
    for half in halves:
        for (b, asked), t in half.gates.items():
            pooled.gate(b, asked).add(t.n, t.v)
        for (slot, model), t in half.models.items():
            pooled.model(slot, model).add(t.n, t.v)
    return pooled


# --- clarity threshold ----------------------------------------------------------------


@dataclass(frozen=True)
class Replay:
    """A setting replayed over logged decisions: estimated rate, decisions, and how
    many of them would have been handled otherwise (their value is then estimated)."""

    rate: float
    decisions: float
    changed: float

    def figures(self) -> dict[str, float]:
        return {"rate": round(self.rate, 4), "decisions": self.decisions,
                "changed": self.changed}


def _coarse_proceed(half: Half) -> dict[int, Tally]:
    out: dict[int, Tally] = {}
    for (b, asked), t in half.gates.items():
        if not asked:
            out.setdefault(b // COARSE, Tally()).add(t.n, t.v)
    return out


def replay_threshold(agent: Half, pooled: Half, threshold: float, *,
                     ask_value: float, ask_policy: bool = True) -> Replay | None:
    """The agent's decisions replayed through the clarity gate with `threshold` under
    its clarity policy (`ask`: below the threshold it asks, at or above it answers;
    `proceed`: it always answers, `shared.policy.clarity.asks`). A decision handled as logged
    keeps its observed value. One that would now be asked gets the agent's observed
    value of its clarifying questions (shrunk toward `ask_value`); one that would now be
    answered gets the agent's observed success rate of answered decisions in its 0.05
    confidence bin, shrunk toward all agents' rate there. None when the log has no
    evidence for that bin (fewer than SHRINK answered decisions among all agents)."""
    asked = Tally()
    for (_, was_asked), t in agent.gates.items():
        if was_asked:
            asked.add(t.n, t.v)
    ask_rate = shrunk(asked, ask_value)
    own, prior = _coarse_proceed(agent), _coarse_proceed(pooled)
    cut = threshold_bin(threshold)
    total, value, changed = 0.0, 0.0, 0.0
    for (b, was_asked), t in agent.gates.items():
        would_ask = ask_policy and asks(clarity(b / BINS, confirm=cut / BINS), "ask")
        total += t.n
        if would_ask == was_asked:
            value += t.v
            continue
        changed += t.n
        if would_ask:
            value += t.n * ask_rate
            continue
        evidence = prior.get(b // COARSE)
        if evidence is None or evidence.n < SHRINK:
            return None
        value += t.n * shrunk(own.get(b // COARSE, Tally()), evidence.rate)
    if total == 0:
        return None
    return Replay(rate=value / total, decisions=total, changed=changed)


@dataclass(frozen=True)
class ThresholdChoice:
    threshold: float
    current: Replay
    best: Replay

    @property
    def gain(self) -> float:
        return self.best.rate - self.current.rate


def best_threshold(agent: Half, pooled: Half, current: float, *,
                   ask_value: float) -> ThresholdChoice | None:
    """The threshold of the grid (or the current one) with the highest replayed rate;
    ties go to the one nearest the current threshold. Thresholds the log has no
    evidence for are not considered."""
    base = replay_threshold(agent, pooled, current, ask_value=ask_value)
    if base is None:
        return None
    best_t, best = current, base
    for t in THRESHOLD_GRID:
        if t > DECIDE_THRESHOLD:
            continue
        est = replay_threshold(agent, pooled, t, ask_value=ask_value)
        if est is None:
            continue
        better = est.rate > best.rate + 1e-12
        tie = abs(est.rate - best.rate) <= 1e-12 and abs(t - current) < abs(best_t - current)
        if better or tie:
            best_t, best = t, est
    return ThresholdChoice(threshold=best_t, current=base, best=best)


# --- fallback order -------------------------------------------------------------------


def model_rates(agent: Half, pooled: Half, slot: str) -> dict[str, tuple[float, float]]:
    """Model -> (the agent's success rate with it on `slot`, shrunk toward all agents'
    rate with that model; the agent's requests it answered)."""
    rates: dict[str, tuple[float, float]] = {}
    for (s, model), t in agent.models.items():
        if s != slot or not model or model in CHAIN_ENDS:
            continue
        prior = pooled.models.get((s, model), t)
        rates[model] = (shrunk(t, prior.rate), t.n)
    return rates


def current_models(chain: list[str] | None, agent: Half, slot: str) -> list[str]:
    """The models of the agent's chain for `slot`; without a chain of its own, the
    models that answered it, most used first (the primary answers most)."""
    if chain:
        return [step for step in chain if step not in CHAIN_ENDS]
    used = [(t.n, model) for (s, model), t in agent.models.items()
            if s == slot and model and model not in CHAIN_ENDS]
    return [model for _, model in sorted(used, key=lambda item: (-item[0], item[1]))]


def propose_order(chain: list[str] | None, agent: Half, pooled: Half, slot: str, *,
                  min_requests: float) -> list[str] | None:
    """The chain with the models the agent has enough requests with ordered by their
    success rate for it (best first), the others after them in their current order, and
    the current end ("extractive" when the agent has no chain). None: nothing to order."""
    rates = model_rates(agent, pooled, slot)
    ranked = sorted((m for m, (_, n) in rates.items() if n >= min_requests),
                    key=lambda m: (-rates[m][0], m))
    if not ranked:
        return None
    rest = [m for m in current_models(chain, agent, slot) if m not in ranked]
    end = chain[-1] if chain and chain[-1] in CHAIN_ENDS else "extractive"
    return [*ranked, *rest, end]


def first_model_rate(order: list[str], agent: Half, pooled: Half,
                     slot: str) -> tuple[str, float] | None:
    """The chain's first model and the agent's estimated success rate with it (what a
    request of the slot gets while that model answers); None without evidence."""
    models = [m for m in order if m not in CHAIN_ENDS]
    if not models:
        return None
    first = models[0]
    own = agent.models.get((slot, first), Tally())
    prior = pooled.models.get((slot, first), Tally())
    if own.n + prior.n < SHRINK:
        return None
    return first, shrunk(own, prior.rate if prior.n else own.rate)


# --- A/B verdict ----------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    promote: bool
    arm_rate: float
    control_rate: float
    z: float
    reason: str

    def figures(self, arm: Tally, control: Tally, margin: float) -> dict[str, float]:
        return {"arm_n": arm.n, "arm_rate": round(self.arm_rate, 4), "control_n": control.n,
                "control_rate": round(self.control_rate, 4),
                "difference": round(self.arm_rate - self.control_rate, 4),
                "z": round(self.z, 3), "margin": margin}


def ab_verdict(arm: Tally, control: Tally, *, margin: float) -> Verdict:
    """"Not worse": the arm's rate is at least the control's minus `margin`, AND a
    one-sided two-proportion z-test does not find it worse at 5% (z >= -1.645, standard
    error from each group's own rate). Both must hold to promote."""
    pa, pc = arm.rate, control.rate
    var = pa * (1 - pa) / max(arm.n, 1.0) + pc * (1 - pc) / max(control.n, 1.0)
    se = math.sqrt(var) if var > 0 else 0.0
    diff = pa - pc
    z = diff / se if se > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
    if diff < -margin:
        return Verdict(False, pa, pc, z,
                       f"arm {pa:.3f} below control {pc:.3f} by more than {margin}")
    if z < Z_WORSE:
        return Verdict(False, pa, pc, z,
                       f"arm {pa:.3f} significantly worse than control {pc:.3f} (z={z:.2f})")
    return Verdict(True, pa, pc, z, f"arm {pa:.3f} not worse than control {pc:.3f}")


def halves_of(tallies: Mapping[str, list[Half]], index: int) -> list[Half]:
    return [pair[index] for pair in tallies.values()]
