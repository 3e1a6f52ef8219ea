"""The learning job's settings (LEARN_*), read from the environment in one place."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import msgspec

from shared.common.settings import (
    LOG_HOT_DAYS,
    ROLLUP_KEEP_DAYS,
    CommonSettings,
    SettingError,
    env,
    read_env,
)
from shared.policy.confidence import ConfidenceParams


class LearnSettings(msgspec.Struct, frozen=True, kw_only=True):
    # Seconds between runs of the learner worker (`intentroute worker learner`; `up` runs
    # one when it is set); 0 = never (`intentroute learn` runs it by hand or from cron).
    interval: Annotated[float, env("LEARN_INTERVAL")] = 0.0
    # The database URL the learner worker connects with, when not DATABASE_URL ("": the
    # learner's own DATABASE_URL, its role's under `up`).
    database_url: Annotated[str, env("LEARN_DATABASE_URL")] = ""
    # Days of the request log the proposals and the observe replay read.
    window_days: Annotated[float, env("LEARN_WINDOW_DAYS")] = 30.0
    # An agent needs this many logged requests in the window to get proposals, and this
    # many decisions the threshold affects (Layer 3 / fallback, below the decide
    # threshold) for a clarity-threshold proposal, or requests of a slot for its order.
    min_requests: Annotated[int, env("LEARN_MIN_REQUESTS")] = 500
    min_decisions: Annotated[int, env("LEARN_MIN_DECISIONS")] = 200
    # A proposal must promise at least this gain in success rate on the data it was
    # fitted on; observe mode then requires "not worse" on the held-out half.
    min_gain: Annotated[float, env("LEARN_MIN_GAIN")] = 0.01
    # What a clarifying question without feedback counts as (0 = a failure, 1 = a success).
    ask_value: Annotated[float, env("LEARN_ASK_VALUE")] = 0.5
    # Share of an agent's requests that get the candidate during A/B, the requests the
    # arm needs before a verdict, the margin of "not worse", and how long an A/B may
    # wait for them before it is rejected for lack of traffic.
    ab_share: Annotated[float, env("LEARN_AB_SHARE")] = 0.1
    ab_min_requests: Annotated[int, env("LEARN_AB_MIN_REQUESTS")] = 200
    ab_margin: Annotated[float, env("LEARN_AB_MARGIN")] = 0.02
    ab_max_days: Annotated[float, env("LEARN_AB_MAX_DAYS")] = 14.0
    # A rejected (agent, key, value) is not proposed again for this many days.
    retry_days: Annotated[float, env("LEARN_RETRY_DAYS")] = 7.0
    # Phase 1's retention and phase 3's confidence parameters: the common settings'
    # (REQUEST_LOG_HOT_DAYS, ROLLUP_KEEP_DAYS, CONFIDENCE_*), which the reports and the
    # gateway's score refresh read too.
    log_hot_days: int = LOG_HOT_DAYS
    rollup_keep_days: int = ROLLUP_KEEP_DAYS
    confidence: ConfidenceParams = ConfidenceParams()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 common: CommonSettings | None = None) -> LearnSettings:
        common = common or CommonSettings.from_env(environ)
        settings = read_env(cls, environ, log_hot_days=common.log_hot_days,
                            rollup_keep_days=common.rollup_keep_days,
                            confidence=common.confidence)
        settings.check()
        return settings

    def check(self) -> None:
        if self.interval < 0:
            raise SettingError(f"LEARN_INTERVAL: expected seconds >= 0 (0 = off), "
                               f"got {self.interval:g}")
        if not 0.0 < self.ab_share < 1.0:
            raise SettingError(f"LEARN_AB_SHARE: expected a share between 0 and 1 (both "
                               f"excluded), got {self.ab_share:g}")
        if not 0.0 <= self.ask_value <= 1.0:
            raise SettingError(f"LEARN_ASK_VALUE: expected a number from 0 to 1, "
                               f"got {self.ask_value:g}")
