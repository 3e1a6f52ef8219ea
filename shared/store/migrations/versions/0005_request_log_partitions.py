"""request_log partitioned by UTC day; per-agent daily latency

Revision ID: 0005
Revises: 0004

`request_log` becomes `PARTITION BY RANGE (created_at)` with one partition per UTC day
(`request_log_pYYYYMMDD`) and a DEFAULT partition as the safety net: a row whose day
has no partition yet lands there instead of failing the write, and
`shared.store.partitions.ensure_partitions` moves it into its day's partition
when it creates that day. Existing rows are moved into their days' partitions; the
days from today to `AHEAD_DAYS` ahead are created too.

A unique key of a partitioned table must contain the partition key, so the primary
key becomes (agent_id, request_id, created_at). `created_at` is the request's
admission time carried in its envelope (`accepted_at`), the same for every write of
one request, so the group commit's upsert (`ON CONFLICT (agent_id, request_id,
created_at)`) still turns a rewrite (an error row after an answer attempt, a
redelivery) into an update of the same row in the same partition.

The DDL is written out here rather than imported: a migration must keep doing what it
did when the shared code changes.
"""

from datetime import UTC, date, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

AHEAD_DAYS = 7
_NOW = sa.func.now()

_COLUMNS = (
    "agent_id, request_id, session_id, query_type, layer, confidence, model_slot, "
    "answered_by, stage_ms, total_ms, outcome, validation_status, retried, created_at, "
    "model, tokens_in, tokens_out, tokens_note, first_chunk_ms, compute_ms, fallback, "
    "fallback_reason"
)


def _columns(*, partitioned: bool) -> list[sa.Column[Any]]:
    created_at = (
        sa.Column("created_at", sa.DateTime(timezone=True), primary_key=True,
                  nullable=False, server_default=_NOW)
        if partitioned else
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=_NOW)
    )
    return [
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
        sa.Column("outcome", sa.String(64), nullable=False),
        sa.Column("validation_status", sa.String(32), nullable=False, server_default=""),
        sa.Column("retried", sa.Boolean, nullable=False, server_default=sa.false()),
        created_at,
        sa.Column("model", sa.String(128), nullable=False, server_default=""),
        sa.Column("tokens_in", sa.Integer, nullable=False, server_default="0"),
        sa.Column("tokens_out", sa.Integer, nullable=False, server_default="0"),
        sa.Column("tokens_note", sa.String(64), nullable=False, server_default=""),
        sa.Column("first_chunk_ms", sa.Float, nullable=True),
        sa.Column("compute_ms", sa.Float, nullable=True),
        sa.Column("fallback", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("fallback_reason", sa.String(64), nullable=False, server_default=""),
    ]


def _create_day(day: date) -> None:
    nxt = day + timedelta(days=1)
    op.execute(
        f"CREATE TABLE request_log_p{day:%Y%m%d} PARTITION OF request_log "
        f"FOR VALUES FROM ('{day.isoformat()} 00:00:00+00') TO ('{nxt.isoformat()} 00:00:00+00')"
    )


def upgrade() -> None:
    op.execute("ALTER TABLE request_log RENAME TO request_log_unpartitioned")
    op.execute("ALTER TABLE request_log_unpartitioned "
               "RENAME CONSTRAINT request_log_pkey TO request_log_unpartitioned_pkey")
    op.execute("ALTER INDEX ix_request_log_agent_time "
               "RENAME TO ix_request_log_unpartitioned_agent_time")
    op.create_table("request_log", *_columns(partitioned=True),
                    postgresql_partition_by="RANGE (created_at)")
    op.create_index("ix_request_log_agent_time", "request_log", ["agent_id", "created_at"])
    op.execute("CREATE TABLE request_log_default PARTITION OF request_log DEFAULT")
    bind = op.get_bind()
    days = {row[0] for row in bind.execute(sa.text(
        "SELECT DISTINCT (created_at AT TIME ZONE 'UTC')::date FROM request_log_unpartitioned "
        "WHERE created_at IS NOT NULL"))}
    today = datetime.now(UTC).date()
    days |= {today + timedelta(days=n) for n in range(AHEAD_DAYS + 1)}
    for day in sorted(days):
        _create_day(day)
    # A row written without a time (none should be) gets the migration's.
    op.execute(f"INSERT INTO request_log ({_COLUMNS}) "
               f"SELECT {_COLUMNS.replace('created_at', 'COALESCE(created_at, now())')} "
               "FROM request_log_unpartitioned")
    op.drop_table("request_log_unpartitioned")
    op.create_table(
        "daily_agent_latency",
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("agent_id", sa.String(128), primary_key=True),
        sa.Column("requests", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("latency_p50_ms", sa.Float, nullable=True),
        sa.Column("latency_p95_ms", sa.Float, nullable=True),
        sa.Column("latency_p99_ms", sa.Float, nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=_NOW),
    )


def downgrade() -> None:
    op.drop_table("daily_agent_latency")
    op.execute("ALTER TABLE request_log RENAME TO request_log_partitioned")
    op.execute("ALTER INDEX ix_request_log_agent_time "
               "RENAME TO ix_request_log_partitioned_agent_time")
    op.execute("ALTER TABLE request_log_partitioned "
               "RENAME CONSTRAINT request_log_pkey TO request_log_partitioned_pkey")
    op.create_table("request_log", *_columns(partitioned=False))
    op.create_index("ix_request_log_agent_time", "request_log", ["agent_id", "created_at"])
    # The old key is (agent_id, request_id): keep each request's latest row.
    op.execute(f"INSERT INTO request_log ({_COLUMNS}) "
               f"SELECT DISTINCT ON (agent_id, request_id) {_COLUMNS} "
               "FROM request_log_partitioned ORDER BY agent_id, request_id, created_at DESC")
    op.execute("DROP TABLE request_log_partitioned CASCADE")
