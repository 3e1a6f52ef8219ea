"""`intentroute.rows.<agent_id>.<session_id>`: a finished turn's rows waiting for Postgres.

When Postgres does not take a turn's rows within a moment (paused, down), the stage that
answers queues them here (stream `TURN_ROWS`, work queue) and sends its final chunk; the
`row-writer` consumer, run by every worker, writes them once Postgres is back, in the
order they were queued (one unacknowledged message at a time). A session's reads wait
while its subject holds rows (shared.runtime.row_queue). Workers only; agents have no
access.
"""

from __future__ import annotations

STREAM = "TURN_ROWS"
SUBJECT_PREFIX = "intentroute.rows"
SUBJECTS = f"{SUBJECT_PREFIX}.>"
DURABLE = "row-writer"
# A subject token for an id that cannot be one (input the gateway rejected).
NO_ID = "_"


def rows_subject(agent_id: str, session_id: str) -> str:
    return f"{SUBJECT_PREFIX}.{agent_id}.{session_id}"
