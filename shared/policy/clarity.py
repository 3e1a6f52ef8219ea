"""ADR-018 clarity gate: the two confidence thresholds and what a confidence means.

Layer 2 decides alone at or above `DECIDE_THRESHOLD`; below it the message goes on to
Layer 3, and the decision carries how sure the classifier was:

    confidence >= 0.85         CLEAR
    0.65 <= confidence < 0.85  NEEDS_CONFIRMATION
    confidence < 0.65          NEEDS_CLARIFICATION

The confirm threshold is the one an agent's policy overrides (`clarity_threshold`).
Pure: the classifier's cascade and the learning job's replay of logged decisions
(`shared.learning`) both use it, so they cannot disagree.
"""

from __future__ import annotations

from shared.contracts.routing import Clarity

DECIDE_THRESHOLD = 0.85
CONFIRM_THRESHOLD = 0.65


def clarity(
    confidence: float,
    *,
    decide: float = DECIDE_THRESHOLD,
    confirm: float = CONFIRM_THRESHOLD,
) -> Clarity:
    """The clarity outcome of a calibrated confidence."""
    if confidence >= decide:
        return Clarity.CLEAR
    if confidence >= confirm:
        return Clarity.NEEDS_CONFIRMATION
    return Clarity.NEEDS_CLARIFICATION


def asks(gate: Clarity, policy: str) -> bool:
    """Whether the classifier asks instead of answering: under the `ask` clarity policy,
    a decision below the clarity threshold (per the per-agent policy's `clarity_threshold`
    meaning: "below it a decision NEEDS_CLARIFICATION", `clarity_policy`: "what the
    classifier does then")."""
    return policy == "ask" and gate is Clarity.NEEDS_CLARIFICATION
