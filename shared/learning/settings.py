"""The learning job's settings (LEARN_*), read from the environment in one place."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from shared.common.settings import CommonSettings, env_float, env_int
from shared.policy.confidence import ConfidenceParams


class LearnSettings(msgspec.Struct, frozen=True, kw_only=True):
    # Seconds between runs inside a worker (the gateway); 0 = never (`intentroute learn`
    # runs it by hand or from cron).
    interval: float = 0.0
    # Days of the request log the proposals and the observe replay read.
    window_days: float = 30.0
    # An agent needs this many logged requests in the window to get proposals, and this
    # many decisions the threshold affects (Layer 3 / fallback, below the decide
    # threshold) for a clarity-threshold proposal, or requests of a slot for its order.
    min_requests: int = 500
    min_decisions: int = 200
    # A proposal must promise at least this gain in success rate on the data it was
    # fitted on; observe mode then requires "not worse" on the held-out half.
    min_gain: float = 0.01
    # What a clarifying question without feedback counts as (0 = a failure, 1 = a success).
    ask_value: float = 0.5
    # Share of an agent's requests that get the candidate during A/B, the requests the
    # arm needs before a verdict, the margin of "not worse", and how long an A/B may
    # wait for them before it is rejected for lack of traffic.
    ab_share: float = 0.1
    ab_min_requests: int = 200
    ab_margin: float = 0.02
    ab_max_days: float = 14.0
    # A rejected (agent, key, value) is not proposed again for this many days.
    retry_days: float = 7.0
    # Phase 1's retention and phase 3's confidence parameters: the common settings'
    # (REQUEST_LOG_HOT_DAYS, ROLLUP_KEEP_DAYS, CONFIDENCE_*), which the reports and the
    # gateway's score refresh read too.
    log_hot_days: int = 30
    rollup_keep_days: int = 365
    confidence: ConfidenceParams = ConfidenceParams()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 common: CommonSettings | None = None) -> LearnSettings:
        common = common or CommonSettings.from_env(environ)
        settings = cls(
            interval=env_float("LEARN_INTERVAL", 0.0, environ),
            window_days=env_float("LEARN_WINDOW_DAYS", 30.0, environ),
            min_requests=env_int("LEARN_MIN_REQUESTS", 500, environ),
            min_decisions=env_int("LEARN_MIN_DECISIONS", 200, environ),
            min_gain=env_float("LEARN_MIN_GAIN", 0.01, environ),
            ask_value=env_float("LEARN_ASK_VALUE", 0.5, environ),
            ab_share=env_float("LEARN_AB_SHARE", 0.1, environ),
            ab_min_requests=env_int("LEARN_AB_MIN_REQUESTS", 200, environ),
            ab_margin=env_float("LEARN_AB_MARGIN", 0.02, environ),
            ab_max_days=env_float("LEARN_AB_MAX_DAYS", 14.0, environ),
            retry_days=env_float("LEARN_RETRY_DAYS", 7.0, environ),
            log_hot_days=common.log_hot_days,
            rollup_keep_days=common.rollup_keep_days,
            confidence=common.confidence,
        )
        settings.check()
        return settings

    def check(self) -> None:
        if self.interval < 0:
            raise ValueError(f"LEARN_INTERVAL={self.interval}: must be >= 0 (0 = off)")
        if not 0.0 < self.ab_share < 1.0:
            raise ValueError(f"LEARN_AB_SHARE={self.ab_share}: must be in (0, 1)")
        if not 0.0 <= self.ask_value <= 1.0:
            raise ValueError(f"LEARN_ASK_VALUE={self.ask_value}: must be in [0, 1]")
