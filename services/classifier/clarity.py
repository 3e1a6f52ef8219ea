"""ADR-018 clarity gate; the pure mapping lives in `shared.policy.clarity` (the learning job
replays logged decisions through it) and is re-exported here for the classifier."""

from __future__ import annotations

from shared.policy.clarity import CONFIRM_THRESHOLD, DECIDE_THRESHOLD, asks, clarity

__all__ = ["CONFIRM_THRESHOLD", "DECIDE_THRESHOLD", "asks", "clarity"]
