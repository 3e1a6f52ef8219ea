"""the group-commit writer may set `model_parts` (0017 added the column to its upsert
without the column's grant: every stage's write of the request log was refused, so every
answer on a fresh stack ended in STAGE_FAILED); the two price functions 0017 added are
the gateway's alone (created without a REVOKE, PUBLIC could execute them)

Revision ID: 0018
Revises: 0017

The writer's `ON CONFLICT ... DO UPDATE SET model_parts = EXCLUDED.model_parts` needs
UPDATE of the column and SELECT of it (Postgres checks `EXCLUDED.x` as a read of x), as
0009 grants the log's other upserted columns to every stage's role.

Names are written out here, not imported: a migration keeps doing what it did.
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

STAGES = ("intentroute_gateway", "intentroute_classifier", "intentroute_retriever",
          "intentroute_generator", "intentroute_validator")


GATEWAY = "intentroute_gateway"
# The gateway's limits read them (its spend query, and intentroute_lease run as it).
FUNCTIONS = ("intentroute_price(jsonb, text)", "intentroute_parts_cost(jsonb, jsonb)")


def upgrade() -> None:
    roles = ", ".join(STAGES)
    op.execute(f"GRANT SELECT (model_parts), UPDATE (model_parts) ON request_log TO {roles}")
    for fn in FUNCTIONS:
        op.execute(f"REVOKE ALL ON FUNCTION {fn} FROM PUBLIC")
        op.execute(f"GRANT EXECUTE ON FUNCTION {fn} TO {GATEWAY}")


def downgrade() -> None:
    for fn in FUNCTIONS:
        op.execute(f"GRANT EXECUTE ON FUNCTION {fn} TO PUBLIC")
    roles = ", ".join(STAGES)
    op.execute(f"REVOKE SELECT (model_parts), UPDATE (model_parts) ON request_log "
               f"FROM {roles}")
