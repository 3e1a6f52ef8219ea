"""The gateway's admission, carried by every envelope and checked by every stage.

Stage subjects are closed to agents by permissions, but a JetStream push consumer's
deliver subject is not subject to them: an agent that creates a consumer on its own
responses could point its deliveries at a stage subject. So permissions alone are not
the proof: every hand-off is stamped with an HMAC of the request's identity (agent,
request and session ids, acceptance time, and the trust the gateway read from the
agents table) under a key only the workers hold, and a stage drops, acknowledged and
reported, an envelope whose stamp does not verify.
"""

from __future__ import annotations

import hashlib
import hmac

from shared.contracts.pipeline import Admitted, Routed

_SEP = "\x1f"


class Admission:
    """Mints and checks envelope stamps under one shared key (`INTENTROUTE_ADMISSION_KEY`)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, env: Admitted | Routed) -> str:
        req = env.request
        fields = [req.agent_id, req.request_id, req.session_id, repr(env.accepted_at)]
        if isinstance(env, Admitted):  # the classifier acts on it: it is part of the proof
            fields.append("trusted" if env.trusted else "untrusted")
        return hmac.new(self._key, _SEP.join(fields).encode(), hashlib.sha256).hexdigest()

    def stamp(self, env: Admitted | Routed) -> None:
        env.admission = self._mac(env)

    def admits(self, env: Admitted | Routed) -> bool:
        # As bytes: compare_digest raises TypeError on a str with non-ASCII characters,
        # which a forged stamp may hold.
        return hmac.compare_digest(env.admission.encode(), self._mac(env).encode())
