"""sessions per agent are capped: a statement that creates an agent's sessions expires
that agent's least recently used ones past the cap (their messages with them)

Revision ID: 0011
Revises: 0010

The cap is the connection's `intentroute.max_sessions_per_agent` (MAX_SESSIONS_PER_AGENT,
set by shared.store.stores.Store.connect; 0 = no cap), 10000 on a connection that sets
none, so the bound holds for every writer. A statement-level trigger on INSERT sees only
the sessions rows that were created (a session written again is an UPDATE of
updated_at under ON CONFLICT), so a turn of an existing conversation costs nothing;
a new one costs one walk of the agent's sessions by (agent_id, updated_at). The function
runs as its owner (SECURITY DEFINER): no worker role is granted DELETE. classify_history
and the request log keep their rows (they are logs, with their own retention).
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

DEFAULT_CAP = 10_000

_FUNCTION = f"""
CREATE OR REPLACE FUNCTION sessions_expire_oldest() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    cap integer := COALESCE(
        NULLIF(current_setting('intentroute.max_sessions_per_agent', true), '')::integer,
        {DEFAULT_CAP});
BEGIN
    IF cap <= 0 THEN
        RETURN NULL;
    END IF;
    WITH expired AS (
        SELECT stale.agent_id, stale.session_id
        FROM (SELECT DISTINCT agent_id FROM created) AS a
        CROSS JOIN LATERAL (
            SELECT s.agent_id, s.session_id FROM public.sessions AS s
            WHERE s.agent_id = a.agent_id
            ORDER BY s.updated_at DESC, s.created_at DESC, s.session_id DESC
            OFFSET cap
        ) AS stale
    ), gone AS (
        DELETE FROM public.messages AS m USING expired AS e
        WHERE m.agent_id = e.agent_id AND m.session_id = e.session_id
    )
    DELETE FROM public.sessions AS s USING expired AS e
    WHERE s.agent_id = e.agent_id AND s.session_id = e.session_id;
    RETURN NULL;
END
$fn$
"""


def upgrade() -> None:
    op.create_index("ix_sessions_agent_updated", "sessions", ["agent_id", "updated_at"])
    op.execute(_FUNCTION)
    op.execute("REVOKE ALL ON FUNCTION sessions_expire_oldest() FROM PUBLIC")
    op.execute("""
CREATE TRIGGER sessions_cap AFTER INSERT ON sessions
REFERENCING NEW TABLE AS created
FOR EACH STATEMENT EXECUTE FUNCTION sessions_expire_oldest()
""")


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS sessions_cap ON sessions")
    op.execute("DROP FUNCTION IF EXISTS sessions_expire_oldest()")
    op.drop_index("ix_sessions_agent_updated", table_name="sessions")
