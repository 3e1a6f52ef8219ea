"""One-time login links to the dashboard: a random token, valid briefly, good once.

Whoever holds the dashboard's folder of links (`intentroute up` keeps it in its state
folder, `<state>/creds/dashboard-links`, and hands it to the process serving the
dashboard in GATEWAY_DASHBOARD_LOGIN_LINKS) mints a link: 256 random bits, of which the
folder keeps only the SHA-256 (a file named after it, holding the expiry), so reading
the folder gives no usable link. Redeeming removes the file: of two uses, in any
replica on the machine, one unlink succeeds and the other is refused, so a link opens
one session and is refused after, and after its expiry whatever happens.

The link exchanges itself for the dashboard's session cookie at first use: the token
the dashboard is configured with never appears in a URL.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path

# Seconds a link stays good: long enough to read the ready screen and click.
LINK_TTL = 600.0
# What secrets.token_urlsafe(32) makes; anything else is refused unread.
_TOKEN = re.compile(r"[A-Za-z0-9_-]{43}")


def _name(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class LoginLinks:
    """The links of one dashboard, kept in `folder` (mode 0700, files 0600)."""

    def __init__(self, folder: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.folder = folder
        self.clock = clock

    def mint(self, ttl: float = LINK_TTL) -> tuple[str, float]:
        """A new link's token and when it expires (epoch seconds); expired ones go."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.purge()
        token = secrets.token_urlsafe(32)
        expires = self.clock() + ttl
        fd = os.open(self.folder / _name(token), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(f"{expires:.3f}\n")
        return token, expires

    def redeem(self, token: str) -> bool:
        """True once for a link minted here and not expired; False for any other."""
        if not _TOKEN.fullmatch(token):
            return False
        path = self.folder / _name(token)
        try:
            expires = float(path.read_text(encoding="utf-8").strip())
            path.unlink()  # the one use: a second unlink (another replica) fails
        except (OSError, ValueError):
            return False
        return expires > self.clock()

    def purge(self) -> None:
        """Remove the expired links' files."""
        now = self.clock()
        for path in self.folder.glob("*"):
            try:
                if float(path.read_text(encoding="utf-8").strip()) <= now:
                    path.unlink()
            except (OSError, ValueError):
                continue
