"""daily_outcomes: requests per UTC day, agent and outcome (`ok`, `error:<CODE>`, ...), so
refusals by code (RATE_LIMITED, CONCURRENCY_LIMITED, QUOTA_EXCEEDED, BUDGET_EXCEEDED) and
errors by code outlive the request log's hot window, as the rollups do

Revision ID: 0013
Revises: 0012

Written by the accounting's rollup refresh (the learner), read by the cost report and
the dashboard (the gateway). Names are written out here, not imported.
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

GATEWAY = "intentroute_gateway"
LEARNER = "intentroute_learner"


def upgrade() -> None:
    op.create_table(
        "daily_outcomes",
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("agent_id", sa.String(128), primary_key=True),
        sa.Column("outcome", sa.String(64), primary_key=True),
        sa.Column("requests", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    )
    op.execute(f"GRANT SELECT ON daily_outcomes TO {GATEWAY}")
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON daily_outcomes TO {LEARNER}")


def downgrade() -> None:
    op.drop_table("daily_outcomes")
