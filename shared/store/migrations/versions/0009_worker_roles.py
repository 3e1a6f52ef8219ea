"""least privilege: one Postgres role per worker type, granted only what its stage runs;
the request log's partition maintenance through two SECURITY DEFINER functions

Revision ID: 0009
Revises: 0008

The roles (`shared.store.roles`) are cluster-wide: the stack's init creates them with
their passwords (`intentroute db-init`, as the superuser) before the migrations run as
the owning role. A database migrated without that init (a test's own database, as a
superuser) gets them here as NOLOGIN roles, so the grants still apply.

What each role may do, from the SQL each worker runs:
- every stage writes through the group-commit writer (shared/store/writer.py), one
  statement inserting into sessions, classify_history, messages, feedback and
  request_log whatever the batch holds: INSERT on those, the columns its ON CONFLICT
  updates, and SELECT on the request log's key columns only (the writer looks up an
  existing row's time);
- the gateway checks agents' tokens (the agents' record columns), records and reads
  feedback, refreshes agent_scores, reads the policies and their A/B candidates (fair
  share weights, limits), and serves the dashboard (rollups, latency, feedback);
- the classifier reads its history, the retriever and generator the session's
  messages, the classifier and generator the policies and their A/B candidates;
- the learner (the learning job, run by the gateway with LEARN_INTERVAL, or by cron)
  reads the log and feedback and writes the rollups, scores, proposals, runs and
  policies; it creates and drops request-log partitions only through the functions
  below, which run as their owner: no worker role may CREATE or DROP anything.
No worker role reads messages' or the log's rows of other stages it does not need,
the agents' secret hashes (only the gateway), nor pg_authid (superuser only).

Names are written out here, not imported: a migration keeps doing what it did.
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

OWNER = "intentroute_owner"
GATEWAY = "intentroute_gateway"
CLASSIFIER = "intentroute_classifier"
RETRIEVER = "intentroute_retriever"
GENERATOR = "intentroute_generator"
VALIDATOR = "intentroute_validator"
LEARNER = "intentroute_learner"
STAGES = (GATEWAY, CLASSIFIER, RETRIEVER, GENERATOR, VALIDATOR)
ROLES = (*STAGES, LEARNER)

_LOG_UPSERT = ("query_type, layer, confidence, model_slot, answered_by, stage_ms, total_ms, "
               "outcome, validation_status, retried, model, tokens_in, tokens_out, "
               "tokens_note, first_chunk_ms, compute_ms, fallback, fallback_reason")
_FEEDBACK_UPSERT = ("outcome, source, completion_quality, latency_ms, token_count, "
                    "updated_at")

# The group-commit writer's statement, granted to every stage. An upsert reads the
# conflict key and the columns it sets (Postgres checks EXCLUDED.x as SELECT of x).
_WRITER = (
    "INSERT ON sessions, classify_history, messages, feedback, request_log",
    "UPDATE (updated_at) ON sessions",
    f"UPDATE ({_LOG_UPSERT}) ON request_log",
    "SELECT (agent_id, session_id, updated_at) ON sessions",
    "SELECT (agent_id, request_id) ON classify_history, feedback",
    "SELECT (agent_id, request_id, role) ON messages",
    f"SELECT (agent_id, request_id, created_at, {_LOG_UPSERT}) ON request_log",
)
_POLICIES = ("SELECT ON agent_policies, learning_proposals",)

GRANTS: dict[str, tuple[str, ...]] = {
    GATEWAY: (
        *_WRITER,
        "SELECT (agent_id, secret_hash, secret_digest, trusted, revoked_at) ON agents",
        # The token digest it stores after a bcrypt check (migration 0008).
        "UPDATE (secret_digest) ON agents",
        f"SELECT, UPDATE ({_FEEDBACK_UPSERT}) ON feedback",
        *_POLICIES,  # its fair share's weights and limits follow the policies
        "SELECT ON request_log, daily_rollups, daily_agent_latency",
        "SELECT, INSERT, UPDATE, DELETE ON agent_scores",
    ),
    CLASSIFIER: (*_WRITER, *_POLICIES, "SELECT ON classify_history"),
    RETRIEVER: (*_WRITER, "SELECT ON messages"),
    GENERATOR: (*_WRITER, *_POLICIES, "SELECT ON messages"),
    VALIDATOR: _WRITER,
    LEARNER: (
        "SELECT ON request_log, feedback, agent_policies",
        "SELECT, DELETE ON request_log_default",
        "SELECT, INSERT, UPDATE, DELETE ON daily_rollups, daily_agent_latency, agent_scores",
        "SELECT, INSERT, UPDATE ON learning_proposals, agent_policies",
        "SELECT, INSERT ON learning_runs",
    ),
}

_CREATE_PARTITION = """
CREATE OR REPLACE FUNCTION request_log_create_partition(day date) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    name text := 'request_log_p' || to_char(day, 'YYYYMMDD');
    low text := to_char(day, 'YYYY-MM-DD') || ' 00:00:00+00';
    high text := to_char(day + 1, 'YYYY-MM-DD') || ' 00:00:00+00';
    moved bigint;
BEGIN
    EXECUTE format('CREATE TABLE public.%I (LIKE public.request_log INCLUDING DEFAULTS)',
                   name);
    EXECUTE format('WITH moved AS (DELETE FROM public.request_log_default '
                   'WHERE created_at >= %L AND created_at < %L RETURNING *) '
                   'INSERT INTO public.%I SELECT * FROM moved', low, high, name);
    GET DIAGNOSTICS moved = ROW_COUNT;
    EXECUTE format('ALTER TABLE public.request_log ATTACH PARTITION public.%I '
                   'FOR VALUES FROM (%L) TO (%L)', name, low, high);
    RETURN moved;
END
$fn$
"""
_DROP_PARTITION = """
CREATE OR REPLACE FUNCTION request_log_drop_partition(day date) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    EXECUTE format('DROP TABLE public.%I', 'request_log_p' || to_char(day, 'YYYYMMDD'));
END
$fn$
"""
_FUNCTIONS = ("request_log_create_partition(date)", "request_log_drop_partition(date)")


def _ensure_roles() -> None:
    """The roles as NOLOGIN when the init did not make them (needs CREATEROLE); a
    migrating user that may not create them gets a sentence saying what to run."""
    names = ", ".join(f"'{role}'" for role in ROLES)
    op.execute(f"""
DO $$
DECLARE
    missing text[] := ARRAY(SELECT r FROM unnest(ARRAY[{names}]) AS r
                            WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r));
    r text;
BEGIN
    IF cardinality(missing) = 0 THEN
        RETURN;
    END IF;
    IF NOT (SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user)
    THEN
        RAISE EXCEPTION 'roles % do not exist: run `intentroute db-init` first', missing;
    END IF;
    FOREACH r IN ARRAY missing LOOP
        EXECUTE format('CREATE ROLE %I NOLOGIN', r);
    END LOOP;
END
$$""")


def upgrade() -> None:
    _ensure_roles()
    op.execute(f"GRANT USAGE ON SCHEMA public TO {', '.join(ROLES)}")
    for role, grants in GRANTS.items():
        for grant in grants:
            op.execute(f"GRANT {grant} TO {role}")
    op.execute(_CREATE_PARTITION)
    op.execute(_DROP_PARTITION)
    for function in _FUNCTIONS:
        # Functions are executable by PUBLIC unless revoked.
        op.execute(f"REVOKE ALL ON FUNCTION {function} FROM PUBLIC")
        op.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {LEARNER}")


def downgrade() -> None:
    for function in _FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {function}")
    tables = ("sessions, messages, classify_history, request_log, request_log_default, "
              "agents, agent_policies, feedback, agent_scores, daily_rollups, "
              "daily_agent_latency, learning_proposals, learning_runs")
    op.execute(f"REVOKE ALL ON {tables} FROM {', '.join(ROLES)}")
    op.execute(f"REVOKE ALL ON SCHEMA public FROM {', '.join(ROLES)}")
