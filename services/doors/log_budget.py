"""Log lines an anonymous caller can cause, bounded.

Wrong credentials, throttled addresses and refused logins are worth a line for the
operator, but each is one call away for anyone who can reach a door: a flood would
become a flood of lines. `LogBudget` writes at most `per_key` lines per key (a client
address) and `total` lines in all (whatever the addresses) per window, and tells in the
next line it writes how many it left out. Never a traceback.
"""

from __future__ import annotations

import logging

import limits
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

# One line per address a minute, ten in all: a flood from any number of addresses
# writes at most ten lines a minute.
DEFAULT_PER_KEY = "1/minute"
DEFAULT_TOTAL = "10/minute"
_ALL = "*"
LEFT_OUT = " (%d similar lines left out)"


class LogBudget:
    def __init__(self, logger: logging.Logger, *, per_key: str = DEFAULT_PER_KEY,
                 total: str = DEFAULT_TOTAL) -> None:
        self._log = logger
        self._per_key = limits.parse(per_key)
        self._total = limits.parse(total)
        self._limiter = MovingWindowRateLimiter(MemoryStorage())
        self.suppressed = 0

    def allow(self, key: str) -> int | None:
        """May a line for `key` be written now? None: no, `key` or everyone has used up
        the window's lines (it is counted as left out); else the number of lines left out
        since the last one written, to be told in this one."""
        if not (self._limiter.test(self._per_key, key)
                and self._limiter.hit(self._total, _ALL)):
            self.suppressed += 1
            return None
        self._limiter.hit(self._per_key, key)
        left_out, self.suppressed = self.suppressed, 0
        return left_out

    def warning(self, key: str, message: str, *args: object) -> bool:
        """Log `message % args` at WARNING unless `key` or everyone has used up the
        window's lines (then count it as left out). True when written."""
        left_out = self.allow(key)
        if left_out is None:
            return False
        if left_out:
            message += LEFT_OUT
            args = (*args, left_out)
        self._log.warning(message, *args)
        return True
