"""a change to an agent's row is announced at once (NOTIFY intentroute_agents)

Revision ID: 0015
Revises: 0014

Revocation is pushed, not polled: every INSERT, UPDATE or DELETE of an `agents` row
sends its agent id on the channel `intentroute_agents` when its transaction commits.
The doors' record caches drop that agent's record (shared.auth.identity.AgentChanges)
and `intentroute up`'s auth sync rewrites the NATS users, so a revoked agent's next
request is refused within a second on every door, however it was revoked (the CLI or
SQL by hand). LISTEN needs no privilege; the trigger runs as whoever changed the row.
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

CHANNEL = "intentroute_agents"


def upgrade() -> None:
    op.execute(f"""
CREATE FUNCTION agents_notify_change() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('{CHANNEL}', OLD.agent_id);
    ELSE
        PERFORM pg_notify('{CHANNEL}', NEW.agent_id);
    END IF;
    RETURN NULL;
END
$$""")
    op.execute("""
CREATE TRIGGER agents_changed AFTER INSERT OR UPDATE OR DELETE ON agents
FOR EACH ROW EXECUTE FUNCTION agents_notify_change()""")


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS agents_changed ON agents")
    op.execute("DROP FUNCTION IF EXISTS agents_notify_change()")
