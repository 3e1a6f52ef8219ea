from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import msgspec

from shared.common.settings import CommonSettings, env, read_env


def _strict(raw: str) -> bool:
    """AVAP_PARSER_STRICT: "1", "true" or "yes" (any case); anything else is off."""
    return raw.lower() in ("1", "true", "yes")


class ValidatorSettings(msgspec.Struct, frozen=True, kw_only=True):
    common: CommonSettings
    # The AVAP parser service's address (`up` starts one and sets it); "": no validation.
    parser_url: Annotated[str, env("AVAP_PARSER_URL")] = ""
    # Seconds per parser call; 0 disables validation (no call at all).
    parser_timeout: Annotated[float, env("AVAP_PARSER_TIMEOUT")] = 2.0
    # Circuit breaker: failures in a row that open it, seconds before a probe.
    cb_threshold: Annotated[int, env("PARSER_CB_THRESHOLD")] = 3
    cb_cooldown: Annotated[float, env("PARSER_CB_COOLDOWN")] = 30.0
    # Ask the parser to check the language spec strictly (`intentroute parse --strict`).
    strict: Annotated[bool, env("AVAP_PARSER_STRICT", parse=_strict)] = False
    # Messages one replica pulls and handles at once.
    batch_size: Annotated[int, env("VALIDATOR_BATCH")] = 16

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ValidatorSettings:
        return read_env(cls, environ, common=CommonSettings.from_env(environ))
