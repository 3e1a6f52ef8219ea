"""The learner's settings, read from the environment here only."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from shared.common.settings import CommonSettings, SettingError
from shared.learning.settings import LearnSettings


class LearnerSettings(msgspec.Struct, frozen=True, kw_only=True):
    common: CommonSettings
    # The job's own (LEARN_*): LEARN_INTERVAL seconds between runs, > 0 here.
    learn: LearnSettings

    @property
    def database_url(self) -> str:
        """LEARN_DATABASE_URL, else DATABASE_URL (the learner's role under `up`)."""
        return self.learn.database_url or self.common.database_url

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LearnerSettings:
        common = CommonSettings.from_env(environ)
        learn = LearnSettings.from_env(environ, common)
        if learn.interval <= 0:
            raise SettingError("LEARN_INTERVAL: the learner worker runs the job every "
                               "LEARN_INTERVAL seconds (> 0); to run it once, "
                               "`intentroute learn`")
        return cls(common=common, learn=learn)
