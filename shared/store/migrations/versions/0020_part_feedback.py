"""a verdict on one part of a message answered part by part (issue 34): a part's id,
`<request_id>#<place from 1>`, fits the id columns that hold it; its verdicts are found
without reading the others

Revision ID: 0020
Revises: 0019

A part of a split message is stored under its message's request id and its place:
its classify_history entry (since issue 34) and an agent's verdict on it (`feedback`).
A request id may be 128 characters, so a part's is up to 12 more: both request_id
columns widen to 140 (a longer varchar is a catalogue change, no rewrite). Before, a
part's id was cut to 128 characters, and the parts of a message whose id was 127 or
128 long collided (one history entry kept). The learning job and the score refresh
fold a request's part verdicts into its outcome; `ix_feedback_parts` holds those rows
only (a `#` is in no request id), so that costs a read of them, not of every verdict.

No grant changes: the gateway, which records verdicts, reads classify_history's
(agent_id, request_id) already (0009), which is all a part's check needs.

Names are written out here, not imported: a migration keeps doing what it did.
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

TABLES = ("classify_history", "feedback")
WIDE, NARROW = 140, 128


def upgrade() -> None:
    for table in TABLES:
        op.alter_column(table, "request_id", type_=sa.String(WIDE),
                        existing_type=sa.String(NARROW), existing_nullable=False)
    op.execute("CREATE INDEX ix_feedback_parts ON feedback (agent_id, request_id) "
               "WHERE strpos(request_id, '#') > 0")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_feedback_parts")
    for table in TABLES:
        # Only a part's id can be longer; the parts of such a message collide again.
        op.execute(f"DELETE FROM {table} WHERE length(request_id) > {NARROW}")
        op.alter_column(table, "request_id", type_=sa.String(NARROW),
                        existing_type=sa.String(WIDE), existing_nullable=False)
