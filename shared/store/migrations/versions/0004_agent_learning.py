"""per-agent learning and accounting (ADR-0006): request-log accounting columns,
agent policies, feedback, agent confidence scores, daily rollups

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_NOW = sa.func.now()


def upgrade() -> None:
    for column in (
        sa.Column("model", sa.String(128), nullable=False, server_default=""),
        sa.Column("tokens_in", sa.Integer, nullable=False, server_default="0"),
        sa.Column("tokens_out", sa.Integer, nullable=False, server_default="0"),
        sa.Column("tokens_note", sa.String(64), nullable=False, server_default=""),
        sa.Column("first_chunk_ms", sa.Float, nullable=True),
        sa.Column("compute_ms", sa.Float, nullable=True),
        sa.Column("fallback", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("fallback_reason", sa.String(64), nullable=False, server_default=""),
    ):
        op.add_column("request_log", column)
    op.create_table(
        "agent_policies",
        sa.Column("agent_id", sa.String(128), primary_key=True),
        sa.Column("settings", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=_NOW),
    )
    op.create_table(
        "feedback",
        sa.Column("agent_id", sa.String(128), primary_key=True),
        sa.Column("request_id", sa.String(128), primary_key=True),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("completion_quality", sa.Float, nullable=True),
        sa.Column("latency_ms", sa.Float, nullable=True),
        sa.Column("token_count", sa.Integer, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=_NOW),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=_NOW),
    )
    op.create_index("ix_feedback_agent_updated", "feedback", ["agent_id", "updated_at"])
    op.create_table(
        "agent_scores",
        sa.Column("agent_id", sa.String(128), primary_key=True),
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("query_type", sa.String(32), primary_key=True),
        sa.Column("successes", sa.Float, nullable=False, server_default="0"),
        sa.Column("trials", sa.Float, nullable=False, server_default="0"),
        sa.Column("score", sa.Float, nullable=False, server_default="0"),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=_NOW),
    )
    op.create_table(
        "daily_rollups",
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("agent_id", sa.String(128), primary_key=True),
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("query_type", sa.String(32), primary_key=True),
        sa.Column("layer", sa.String(16), primary_key=True),
        sa.Column("requests", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("errors", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("fallbacks", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("tokens_in", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("tokens_out", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("compute_s", sa.Float, nullable=False, server_default="0"),
        sa.Column("cost", sa.Float, nullable=False, server_default="0"),
        sa.Column("latency_p50_ms", sa.Float, nullable=True),
        sa.Column("latency_p95_ms", sa.Float, nullable=True),
        sa.Column("latency_p99_ms", sa.Float, nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=_NOW),
    )
    op.create_index("ix_daily_rollups_agent_day", "daily_rollups", ["agent_id", "day"])


def downgrade() -> None:
    op.drop_table("daily_rollups")
    op.drop_table("agent_scores")
    op.drop_table("feedback")
    op.drop_table("agent_policies")
    for name in ("fallback_reason", "fallback", "compute_ms", "first_chunk_ms",
                 "tokens_note", "tokens_out", "tokens_in", "model"):
        op.drop_column("request_log", name)
