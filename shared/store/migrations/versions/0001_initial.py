"""sessions, messages, classify_history, request_log

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("agent_id", sa.String(128), primary_key=True),
        sa.Column("session_id", sa.String(128), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    )
    op.create_table(
        "messages",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("agent_id", sa.String(128), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("query_type", sa.String(32), nullable=False, server_default=""),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.ForeignKeyConstraint(
            ["agent_id", "session_id"], ["sessions.agent_id", "sessions.session_id"]
        ),
        sa.UniqueConstraint("request_id", "role", name="uq_messages_request_role"),
    )
    op.create_index("ix_messages_session", "messages", ["agent_id", "session_id", "id"])
    op.create_table(
        "classify_history",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("agent_id", sa.String(128), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=False, unique=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("topic", sa.String(60), nullable=False),
        sa.Column("layer", sa.String(16), nullable=False),
        sa.Column("confidence", sa.Float, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    )
    op.create_index(
        "ix_classify_history_session", "classify_history", ["agent_id", "session_id", "id"]
    )
    op.create_table(
        "request_log",
        sa.Column("request_id", sa.String(128), primary_key=True),
        sa.Column("agent_id", sa.String(128), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("query_type", sa.String(32), nullable=False, server_default=""),
        sa.Column("layer", sa.String(16), nullable=False, server_default=""),
        sa.Column("confidence", sa.Float, nullable=True),
        sa.Column("model_slot", sa.String(32), nullable=False, server_default=""),
        sa.Column("answered_by", sa.String(64), nullable=False, server_default=""),
        sa.Column("stage_ms", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("total_ms", sa.Float, nullable=True),
        sa.Column("outcome", sa.String(64), nullable=False),
        sa.Column("validation_status", sa.String(32), nullable=False, server_default=""),
        sa.Column("retried", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    )
    op.create_index("ix_request_log_agent_time", "request_log", ["agent_id", "created_at"])


def downgrade() -> None:
    op.drop_table("request_log")
    op.drop_table("classify_history")
    op.drop_table("messages")
    op.drop_table("sessions")
