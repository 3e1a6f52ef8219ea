"""`agent.replay.<agent_id>`: a late reader asks the gateway for a stored answer.

A core-NATS request (not stored by any stream) that only that agent's credential may
publish: the payload is the request id (UTF-8, nothing else), the reply subject the
caller's inbox. The gateway answers on the reply subject with the chunks stored on
`agent.response.<agent_id>.<request_id>`, in order from the first, byte for byte as they
were sent live, following an answer still in progress until its final chunk; when that
subject holds nothing, one final error chunk (`UNKNOWN_REQUEST`, which does not tell an
unknown id from another agent's). Agents create no JetStream consumer of their own.
"""

from __future__ import annotations

SUBJECT_PREFIX = "agent.replay"
# What the gateway's replay service listens on (a queue group shares it among replicas).
SUBJECTS = f"{SUBJECT_PREFIX}.*"
QUEUE = "gateway-replay"


def replay_subject(agent_id: str) -> str:
    return f"{SUBJECT_PREFIX}.{agent_id}"


def agent_of(subject: str) -> str:
    """The agent a replay subject belongs to ("" if it is not one)."""
    prefix, _, agent = subject.rpartition(".")
    return agent if prefix == SUBJECT_PREFIX else ""
