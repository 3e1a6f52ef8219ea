from __future__ import annotations

from collections.abc import Mapping

import msgspec

from shared.settings import CommonSettings, env_float, env_int, env_str


class ClassifierSettings(msgspec.Struct, frozen=True, kw_only=True):
    common: CommonSettings
    # Agents whose caller-declared query_type is taken as is ("*" = every caller).
    trusted_agents: tuple[str, ...] = ("*",)
    # Messages fetched per pull request; they are handled concurrently.
    batch_size: int = 32

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClassifierSettings:
        trusted = env_str("CLASSIFIER_TRUSTED_AGENTS", "*", environ)
        return cls(
            common=CommonSettings.from_env(environ),
            trusted_agents=tuple(a.strip() for a in trusted.split(",") if a.strip()),
            batch_size=env_int("CLASSIFIER_BATCH", 32, environ),
        )


__all__ = ["ClassifierSettings", "env_float"]
