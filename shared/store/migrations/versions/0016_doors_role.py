"""the doors (gRPC, HTTP feedback, the OpenAI-compatible door, the dashboard) connect as a
role of their own, granted what they read and nothing they write but a token's digest

Revision ID: 0016
Revises: 0015

The doors are a worker of their own (services/doors): a NATS client of the pipeline that
checks callers' bearer tokens and serves the operator dashboard. What its role may do,
from the SQL the doors run:
- check agents' tokens (shared.store.stores.AgentSecrets): the agents' record columns,
  and the fast digest of a secret it stores after a bcrypt check;
- the dashboard's figures (services/doors/dashboard/queries.py): the daily rollups,
  latencies and outcomes, the feedback, the agents' policies and scores, and the request
  log (the days not rolled up yet);
- nothing else: no turn's rows (they reach the pipeline as messages), no feedback
  written (the gateway's consumer records it), no limits' state.
Its readiness check is `SELECT 1`, which needs no grant.

The gateway's grants that only the doors used (the agents' secret columns and digest,
the dashboard's tables) stay until every gateway runs this version: a gateway of the
previous one, still serving its doors during a rolling upgrade, checks tokens with them.

Names are written out here, not imported: a migration keeps doing what it did.
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

DOORS = "intentroute_doors"

GRANTS = (
    "SELECT (agent_id, secret_hash, secret_digest, trusted, revoked_at) ON agents",
    "UPDATE (secret_digest) ON agents",
    "SELECT ON daily_rollups, daily_agent_latency, daily_outcomes, feedback, "
    "agent_policies, agent_scores, request_log",
)


def _ensure_role() -> None:
    """The role as NOLOGIN when the init did not make it (needs CREATEROLE), as 0009."""
    op.execute(f"""
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{DOORS}') THEN
        RETURN;
    END IF;
    IF NOT (SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user)
    THEN
        RAISE EXCEPTION 'role {DOORS} does not exist: run `intentroute db-init` first';
    END IF;
    EXECUTE format('CREATE ROLE %I NOLOGIN', '{DOORS}');
END
$$""")


def upgrade() -> None:
    _ensure_role()
    op.execute(f"GRANT USAGE ON SCHEMA public TO {DOORS}")
    for grant in GRANTS:
        op.execute(f"GRANT {grant} TO {DOORS}")


def downgrade() -> None:
    op.execute(f"REVOKE ALL ON agents, daily_rollups, daily_agent_latency, daily_outcomes, "
               f"feedback, agent_policies, agent_scores, request_log FROM {DOORS}")
    op.execute(f"REVOKE ALL ON SCHEMA public FROM {DOORS}")
