from __future__ import annotations

from collections.abc import Mapping

import msgspec

from shared.common.settings import CommonSettings, env_float, env_int, env_str


class ValidatorSettings(msgspec.Struct, frozen=True, kw_only=True):
    common: CommonSettings
    parser_url: str = ""
    # Seconds per parser call; 0 disables validation (no call at all).
    parser_timeout: float = 2.0
    cb_threshold: int = 3
    cb_cooldown: float = 30.0
    strict: bool = False
    batch_size: int = 16

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ValidatorSettings:
        return cls(
            common=CommonSettings.from_env(environ),
            parser_url=env_str("AVAP_PARSER_URL", "", environ),
            parser_timeout=env_float("AVAP_PARSER_TIMEOUT", 2.0, environ),
            cb_threshold=env_int("PARSER_CB_THRESHOLD", 3, environ),
            cb_cooldown=env_float("PARSER_CB_COOLDOWN", 30.0, environ),
            strict=env_str("AVAP_PARSER_STRICT", "", environ).lower() in ("1", "true", "yes"),
            batch_size=env_int("VALIDATOR_BATCH", 16, environ),
        )
