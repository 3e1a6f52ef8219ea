"""learning job (ADR-0006 phases 4-5): proposals with their observe / A/B evidence,
and the job's runs

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "learning_proposals",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("agent_id", sa.String(128), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("value", JSONB, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("origin", sa.String(16), nullable=False, server_default="learn"),
        sa.Column("baseline", JSONB, nullable=False, server_default=sa.text("'null'::jsonb")),
        sa.Column("figures", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("share", sa.Float, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ab_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
    )
    op.create_index("ix_learning_proposals_agent", "learning_proposals",
                    ["agent_id", "status"])
    op.create_table(
        "learning_runs",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seconds", sa.Float, nullable=False),
        sa.Column("ok", sa.Boolean, nullable=False),
        sa.Column("summary", JSONB, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("learning_runs")
    op.drop_table("learning_proposals")
