"""Schema (SQLAlchemy Core). Alembic migrations in `migrations/` create it.

The hot path reads and writes with asyncpg directly (see `stores.py`); SQLAlchemy
is the schema of record and the tool for migrations and offline exports.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

metadata = sa.MetaData()

sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("agent_id", sa.String(128), primary_key=True),
    sa.Column("session_id", sa.String(128), primary_key=True),
    sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
)

messages = sa.Table(
    "messages",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("agent_id", sa.String(128), nullable=False),
    sa.Column("session_id", sa.String(128), nullable=False),
    sa.Column("request_id", sa.String(128), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),  # user | assistant
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("query_type", sa.String(32), nullable=False, server_default=""),
    sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    sa.ForeignKeyConstraint(
        ["agent_id", "session_id"], ["sessions.agent_id", "sessions.session_id"]
    ),
    sa.UniqueConstraint("agent_id", "request_id", "role", name="uq_messages_agent_request_role"),
    sa.Index("ix_messages_session", "agent_id", "session_id", "id"),
)

agents = sa.Table(
    "agents",
    metadata,
    sa.Column("agent_id", sa.String(128), primary_key=True),
    # bcrypt hash of the agent's secret; the secret itself is never stored.
    sa.Column("secret_hash", sa.Text, nullable=False),
    # May declare query_type; its RC-01 platform prefix is honoured.
    sa.Column("trusted", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
)

classify_history = sa.Table(
    "classify_history",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("agent_id", sa.String(128), nullable=False),
    sa.Column("session_id", sa.String(128), nullable=False),
    sa.Column("request_id", sa.String(128), nullable=False),
    sa.Column("type", sa.String(32), nullable=False),
    sa.Column("topic", sa.String(60), nullable=False),
    sa.Column("layer", sa.String(16), nullable=False),
    sa.Column("confidence", sa.Float, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    sa.Index("ix_classify_history_session", "agent_id", "session_id", "id"),
    sa.UniqueConstraint("agent_id", "request_id", name="uq_classify_history_agent_request"),
)

request_log = sa.Table(
    "request_log",
    metadata,
    # Request ids are the agent's own: two agents may use the same one.
    sa.Column("agent_id", sa.String(128), primary_key=True),
    sa.Column("request_id", sa.String(128), primary_key=True),
    sa.Column("session_id", sa.String(128), nullable=False),
    sa.Column("query_type", sa.String(32), nullable=False, server_default=""),
    sa.Column("layer", sa.String(16), nullable=False, server_default=""),
    sa.Column("confidence", sa.Float, nullable=True),
    sa.Column("model_slot", sa.String(32), nullable=False, server_default=""),
    sa.Column("answered_by", sa.String(64), nullable=False, server_default=""),
    sa.Column("stage_ms", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("total_ms", sa.Float, nullable=True),
    # ok | error:<CODE> | clarification
    sa.Column("outcome", sa.String(64), nullable=False),
    sa.Column("validation_status", sa.String(32), nullable=False, server_default=""),
    sa.Column("retried", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    sa.Index("ix_request_log_agent_time", "agent_id", "created_at"),
)

# Callers of the bus. The secret is stored only as its bcrypt hash (which is also the
# NATS password hash); a revoked agent keeps its row so its id is never reissued.
