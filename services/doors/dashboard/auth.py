"""Operator access to the dashboard: the configured token, presented as a bearer token
(scripts) or once in the login form, which sets a signed, expiring session cookie
(browsers). Pure functions; the handlers apply them.

The cookie holds `<expiry>.<HMAC-SHA256(token, expiry)>`, never the token itself:
changing the token logs every browser out."""

from __future__ import annotations

import hashlib
import hmac

COOKIE = "intentroute_dashboard"


def token_matches(token: str, given: str) -> bool:
    """Constant-time comparison (an empty configured token matches nothing)."""
    return bool(token) and hmac.compare_digest(given.encode(), token.encode())


def _signature(token: str, expires: int) -> str:
    message = f"intentroute-dashboard-session:{expires}".encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def session_cookie(token: str, *, now: float, ttl: float) -> str:
    expires = int(now + ttl)
    return f"{expires}.{_signature(token, expires)}"


def session_valid(token: str, value: str, *, now: float) -> bool:
    expires_text, _, signature = value.partition(".")
    if not token or not expires_text.isdigit() or not signature:
        return False
    expires = int(expires_text)
    if expires <= now:
        return False
    return hmac.compare_digest(signature.encode(), _signature(token, expires).encode())
