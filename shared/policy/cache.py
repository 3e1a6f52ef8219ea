"""An agent's answer-cache keys (`intentroute agent set NAME cache=on cache_ttl=1h
cache_group=docs`), parsed into AgentPolicy fields (shared.policy.agent applies them).

    cache=on|off        the agent's answers are stored and served again (default: off,
                        docs/guides/agents.md says why)
    cache_ttl=1h        how long an answer serves (30s, 15m, 1h, 7d or seconds; unset:
                        ANSWER_CACHE_TTL, a day)
    cache_group=NAME    share entries with the agents that join the same group (each of
                        them declares it; never by default)
"""

from __future__ import annotations

import math
import re
from typing import Any

KEYS = ("cache", "cache_ttl", "cache_group")
_ON = {"on": True, "true": True, "yes": True, "1": True,
       "off": False, "false": False, "no": False, "0": False}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|secs|m|min|mins|h|hr|hrs|d|day|days)?\s*$")
_UNIT_S = {"": 1, "s": 1, "sec": 1, "secs": 1, "m": 60, "min": 60, "mins": 60, "h": 3600,
           "hr": 3600, "hrs": 3600, "d": 86400, "day": 86400, "days": 86400}
_GROUP = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# A year: an answer older than that is not an answer the cache should give.
MAX_TTL_S = 365 * 86400.0


class CacheKeyError(ValueError):
    """A cache key's value that cannot be applied (the message says why)."""


def duration_s(key: str, value: str) -> float:
    """`30s`, `15m`, `1h`, `7d` or a number of seconds, as seconds."""
    match = _DURATION.match(value.lower())
    if match is None:
        raise CacheKeyError(f"{key}: {value!r} is not a duration (e.g. 30s, 15m, 1h, 7d)")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2) or ""]
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TTL_S):
        raise CacheKeyError(f"{key}: {value} must be more than 0 and at most 365d")
    return seconds


def cache_fields(key: str, value: str) -> dict[str, Any]:
    """The AgentPolicy fields one `key=value` sets ("" unsets the key)."""
    if key == "cache":
        if not value:
            return {"cache": None}
        if value.lower() not in _ON:
            raise CacheKeyError(f"cache: {value!r} is not one of on, off")
        return {"cache": _ON[value.lower()]}
    if key == "cache_ttl":
        return {"cache_ttl": duration_s(key, value) if value else None}
    if key == "cache_group":
        if value and not _GROUP.match(value):
            raise CacheKeyError(f"cache_group: {value!r} must be 1-64 letters, digits, "
                                "'_', '.' or '-'")
        return {"cache_group": value or None}
    raise KeyError(key)
