"""Schema (SQLAlchemy Core). Alembic migrations in `migrations/` create it.

The hot path reads and writes with asyncpg directly (see `stores.py`); SQLAlchemy
is the schema of record and the tool for migrations and offline exports.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

metadata = sa.MetaData()

sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("agent_id", sa.String(128), primary_key=True),
    sa.Column("session_id", sa.String(128), primary_key=True),
    sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    # An agent's least recently used sessions expire past MAX_SESSIONS_PER_AGENT
    # (trigger sessions_cap, migration 0011; the cap in owner_settings since 0014).
    sa.Index("ix_sessions_agent_updated", "agent_id", "updated_at"),
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

# Callers of the bus. The secret is stored only as its bcrypt hash (which is also the
# NATS password hash); a revoked agent keeps its row so its id is never reissued.
agents = sa.Table(
    "agents",
    metadata,
    sa.Column("agent_id", sa.String(128), primary_key=True),
    # bcrypt hash of the agent's secret; the secret itself is never stored.
    sa.Column("secret_hash", sa.Text, nullable=False),
    # HMAC-SHA256 of the secret keyed by secret_hash (shared.auth.identity.token_digest):
    # the gateway's microsecond token check. "" until the secret is first checked with
    # bcrypt (or rotated); a secret_hash changed any way voids it.
    sa.Column("secret_digest", sa.Text, nullable=False, server_default=""),
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
    # The request's id, or a part's of a message answered part by part
    # (`<request_id>#<place from 1>`, shared.contracts.ids.part_id; migration 0020).
    sa.Column("request_id", sa.String(140), nullable=False),
    sa.Column("type", sa.String(32), nullable=False),
    sa.Column("topic", sa.String(60), nullable=False),
    sa.Column("layer", sa.String(16), nullable=False),
    sa.Column("confidence", sa.Float, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    sa.Index("ix_classify_history_session", "agent_id", "session_id", "id"),
    sa.UniqueConstraint("agent_id", "request_id", name="uq_classify_history_agent_request"),
)

# Partitioned by UTC day (`request_log_pYYYYMMDD`, plus `request_log_default` for a day
# whose partition does not exist yet; see shared/store/partitions.py). A unique key
# must contain the partition key, hence created_at in the primary key: it is the
# request's admission time from its envelope, the same for every write of one request,
# so a rewrite updates the same row (migration 0005).
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
    sa.Column("created_at", sa.DateTime(timezone=True), primary_key=True, nullable=False,
              server_default=sa.func.now()),
    # Accounting (ADR-0006): the model that answered ("extractive" for the extractive
    # answerer), tokens as the backend reported them (zero with `tokens_note` saying
    # why), time to the first answer chunk, compute time, and whether a fallback
    # answered and why.
    sa.Column("model", sa.String(128), nullable=False, server_default=""),
    sa.Column("tokens_in", sa.Integer, nullable=False, server_default="0"),
    sa.Column("tokens_out", sa.Integer, nullable=False, server_default="0"),
    sa.Column("tokens_note", sa.String(64), nullable=False, server_default=""),
    sa.Column("first_chunk_ms", sa.Float, nullable=True),
    sa.Column("compute_ms", sa.Float, nullable=True),
    sa.Column("fallback", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("fallback_reason", sa.String(64), nullable=False, server_default=""),
    # [[model, tokens_in, tokens_out], ...] of an answer several models wrote (migration
    # 0016); NULL when one model wrote it all.
    sa.Column("model_parts", JSONB, nullable=True),
    sa.Index("ix_request_log_agent_time", "agent_id", "created_at"),
    postgresql_partition_by="RANGE (created_at)",
)

# Per-agent policy (`intentroute agent set`): a JSON object of `shared.policy.agent.AgentPolicy`
# fields; workers re-read it periodically.
agent_policies = sa.Table(
    "agent_policies",
    metadata,
    sa.Column("agent_id", sa.String(128), primary_key=True),
    sa.Column("settings", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
)

# One verdict per (agent, request): explicit from the agent (a repeat updates it) or
# implicit from what the pipeline itself knows (fallback, timeout, error, ...); and the
# agent's explicit verdicts on the parts of a message answered part by part, under the
# parts' ids (`<request_id>#<place from 1>`, as in classify_history; migration 0020).
feedback = sa.Table(
    "feedback",
    metadata,
    sa.Column("agent_id", sa.String(128), primary_key=True),
    sa.Column("request_id", sa.String(140), primary_key=True),
    sa.Column("outcome", sa.String(32), nullable=False),
    sa.Column("source", sa.String(16), nullable=False),  # explicit | implicit
    sa.Column("completion_quality", sa.Float, nullable=True),
    sa.Column("latency_ms", sa.Float, nullable=True),
    sa.Column("token_count", sa.Integer, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    sa.Index("ix_feedback_agent_updated", "agent_id", "updated_at"),
    # The part verdicts only (shared.store.feedback_table.PART_VERDICTS_SQL).
    sa.Index("ix_feedback_parts", "agent_id", "request_id",
             postgresql_where=sa.text("strpos(request_id, '#') > 0")),
)

# Success estimate per (agent, model, query type); agent_id "*" holds the global one.
# successes / trials are the raw counts of the evidence, score the estimate at
# updated_at (decayed and shrunk toward the global rate: shared/policy/confidence.py).
agent_scores = sa.Table(
    "agent_scores",
    metadata,
    sa.Column("agent_id", sa.String(128), primary_key=True),
    sa.Column("model", sa.String(128), primary_key=True),
    sa.Column("query_type", sa.String(32), primary_key=True),
    sa.Column("successes", sa.Float, nullable=False, server_default="0"),
    sa.Column("trials", sa.Float, nullable=False, server_default="0"),
    sa.Column("score", sa.Float, nullable=False, server_default="0"),
    sa.Column("last_seen", sa.DateTime(timezone=True), nullable=True),
    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    # score - the global rate at the last refresh; diverged: beyond the configured bound,
    # logged and shown for review (shared.policy.confidence, shared.store.scores).
    sa.Column("divergence", sa.Float, nullable=True),
    sa.Column("diverged", sa.Boolean, nullable=False, server_default=sa.false()),
)

# Daily (UTC) aggregates of the request log; they outlive its dropped partitions.
daily_rollups = sa.Table(
    "daily_rollups",
    metadata,
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
    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    sa.Index("ix_daily_rollups_agent_day", "agent_id", "day"),
)

# The learning job's proposals (shared.learning): one per-agent policy change, evaluated
# in observe mode (replay of the agent's logged decisions), then on an A/B share of its
# traffic (`share`: requests whose hash of (agent_id, request_id) is below it), then
# promoted into agent_policies or rejected; `figures` holds the evidence of each step.
learning_proposals = sa.Table(
    "learning_proposals",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("agent_id", sa.String(128), nullable=False),
    # A policy key (`clarity_threshold`, `fallback.main`, ...) and its proposed value.
    sa.Column("key", sa.String(64), nullable=False),
    sa.Column("value", JSONB, nullable=False),
    # observe | ab | promoted | rejected
    sa.Column("status", sa.String(16), nullable=False),
    # Who proposed it: `learn` (the job) or `operator` (`intentroute learn propose`).
    sa.Column("origin", sa.String(16), nullable=False, server_default="learn"),
    # The setting it would replace, and the evidence gathered (observe, A/B).
    sa.Column("baseline", JSONB, nullable=False, server_default=sa.text("'null'::jsonb")),
    sa.Column("figures", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("share", sa.Float, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("ab_started_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("reason", sa.Text, nullable=False, server_default=""),
    sa.Index("ix_learning_proposals_agent", "agent_id", "status"),
)

# One row per run of the learning job: when, and what each phase did (figures, seconds).
learning_runs = sa.Table(
    "learning_runs",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("seconds", sa.Float, nullable=False),
    sa.Column("ok", sa.Boolean, nullable=False),
    sa.Column("summary", JSONB, nullable=False),
)
# Per (UTC day, agent) latency over all its requests: percentiles of the finer
# daily_rollups groups cannot be combined into the agent's (`intentroute report slo`).
daily_agent_latency = sa.Table(
    "daily_agent_latency",
    metadata,
    sa.Column("day", sa.Date, primary_key=True),
    sa.Column("agent_id", sa.String(128), primary_key=True),
    sa.Column("requests", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("latency_p50_ms", sa.Float, nullable=True),
    sa.Column("latency_p95_ms", sa.Float, nullable=True),
    sa.Column("latency_p99_ms", sa.Float, nullable=True),
    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
)
# Requests per (UTC day, agent, outcome): refusals and errors by code (`error:<CODE>`)
# after the request log's hot window (migration 0013, shared.accounting.rollups).
daily_outcomes = sa.Table(
    "daily_outcomes",
    metadata,
    sa.Column("day", sa.Date, primary_key=True),
    sa.Column("agent_id", sa.String(128), primary_key=True),
    sa.Column("outcome", sa.String(64), primary_key=True),
    sa.Column("requests", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
)
# Per-agent limits' shared state (migration 0010, services/gateway/limits/store.py): the
# rate bucket, the tokens of this and the last minute, the spend of the UTC day and
# month, the cost estimate reserved per request and what the last admission reserved.
agent_limit_state = sa.Table(
    "agent_limit_state",
    metadata,
    sa.Column("agent_id", sa.String(128), primary_key=True),
    sa.Column("bucket", sa.Float, nullable=False),
    sa.Column("bucket_at", sa.Float, nullable=False),
    sa.Column("tokens_minute", sa.BigInteger, nullable=False),
    sa.Column("tokens_cur", sa.Float, nullable=False, server_default="0"),
    sa.Column("tokens_prev", sa.Float, nullable=False, server_default="0"),
    sa.Column("day", sa.Date, nullable=False),
    sa.Column("spent_day", sa.Float, nullable=False, server_default="0"),
    sa.Column("month", sa.Date, nullable=False),
    sa.Column("spent_month", sa.Float, nullable=False, server_default="0"),
    sa.Column("cost_estimate", sa.Float, nullable=True),
    sa.Column("reserved", sa.Float, nullable=False, server_default="0"),
    # Model tokens reserved per request (migration 0012), as cost_estimate for cost units.
    sa.Column("tokens_estimate", sa.Float, nullable=True),
)
# Requests admitted and not settled yet, keyed as their request-log rows.
agent_inflight = sa.Table(
    "agent_inflight",
    metadata,
    sa.Column("agent_id", sa.String(128), primary_key=True),
    sa.Column("request_id", sa.String(128), primary_key=True),
    sa.Column("created_at", sa.DateTime(timezone=True), primary_key=True),
    sa.Column("deadline", sa.Float, nullable=False),
    sa.Column("estimate", sa.Float, nullable=False),
)
# Each gateway replica's allowance of an agent's admissions (migration 0012,
# services/gateway/limits/lease.py): admissions it may still make or has not recorded.
agent_leases = sa.Table(
    "agent_leases",
    metadata,
    sa.Column("agent_id", sa.String(128), primary_key=True),
    sa.Column("replica", sa.String(64), primary_key=True),
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("held", sa.Integer, nullable=False),
    sa.Column("expires", sa.Float, nullable=False),
)
# The limits of the owner's SECURITY DEFINER functions (migration 0014,
# shared/store/owner_settings.py): one row, no grant, written by `migrate` only.
owner_settings = sa.Table(
    "owner_settings",
    metadata,
    sa.Column("id", sa.Boolean, primary_key=True, server_default=sa.true()),
    sa.Column("max_sessions_per_agent", sa.Integer, nullable=False, server_default="10000"),
    sa.Column("request_log_hot_days", sa.Integer, nullable=False, server_default="30"),
    # The answer cache's cap of entries per agent and default TTL (migration 0019).
    sa.Column("answer_cache_per_agent", sa.Integer, nullable=False, server_default="1000"),
    sa.Column("answer_cache_ttl_s", sa.Float, nullable=False, server_default="86400.0"),
    sa.CheckConstraint("id", name="owner_settings_one_row"),
    sa.CheckConstraint("max_sessions_per_agent >= 0", name="owner_settings_cap"),
    sa.CheckConstraint("request_log_hot_days >= 1", name="owner_settings_hot_days"),
)

# The per-agent answer cache (migration 0019, docs/explanation/answer-cache.md): one
# agent's own finished answers, written only through answer_cache_put (SECURITY
# DEFINER), read by the classifier; every insert and delete is NOTIFYed to its replicas.
answer_cache = sa.Table(
    "answer_cache",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
    sa.Column("agent_id", sa.String(128), nullable=False),
    sa.Column("request_id", sa.String(128), nullable=False),
    sa.Column("query", sa.Text, nullable=False),
    sa.Column("query_type", sa.String(32), nullable=False),
    sa.Column("lang", sa.String(8), nullable=False),
    sa.Column("model_slot", sa.String(32), nullable=False),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("answer", sa.Text, nullable=False),
    sa.Column("avap_code", sa.Text, nullable=False, server_default=""),
    sa.Column("validation_status", sa.String(32), nullable=False, server_default=""),
    # The documents its passages came from, and a hash of the passages it used of each.
    sa.Column("sources", ARRAY(sa.Text), nullable=False),
    sa.Column("versions", ARRAY(sa.Text), nullable=False),
    sa.Column("tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("tokens_estimated", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("accepted_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
              server_default=sa.func.now()),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("hits", sa.Integer, nullable=False, server_default="0"),
    sa.Column("last_hit_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("feedback_pos", sa.Integer, nullable=False, server_default="0"),
    sa.UniqueConstraint("agent_id", "request_id", name="answer_cache_request"),
    sa.Index("answer_cache_lru", "agent_id",
             sa.text("(COALESCE(last_hit_at, created_at))")),
    sa.Index("answer_cache_by_source", "sources", postgresql_using="gin"),
)
# When a document last changed (ingest's invalidation): an answer retrieved before it
# is refused by answer_cache_put.
answer_cache_sources = sa.Table(
    "answer_cache_sources",
    metadata,
    sa.Column("source", sa.Text, primary_key=True),
    sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
)
# The requests an entry answered (a later negative verdict on one evicts the entry).
answer_cache_served = sa.Table(
    "answer_cache_served",
    metadata,
    sa.Column("agent_id", sa.String(128), primary_key=True),
    sa.Column("request_id", sa.String(128), primary_key=True),
    sa.Column("entry_id", sa.BigInteger,
              sa.ForeignKey("answer_cache.id", ondelete="CASCADE"), nullable=False),
    sa.Column("served_at", sa.DateTime(timezone=True), nullable=False,
              server_default=sa.func.now()),
    sa.Index("answer_cache_served_entry", "entry_id"),
)
# Per-agent totals of the cache (`intentroute cache stats`).
answer_cache_totals = sa.Table(
    "answer_cache_totals",
    metadata,
    sa.Column("agent_id", sa.String(128), primary_key=True),
    *(sa.Column(name, sa.BigInteger, nullable=False, server_default="0")
      for name in ("stored", "hits", "tokens_saved", "evicted_cap", "evicted_ttl",
                   "evicted_feedback", "invalidated", "cleared")),
)
