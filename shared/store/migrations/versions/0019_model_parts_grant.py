"""the group-commit writer may set `model_parts` (0017 added the column to its upsert
without the column's grant: every stage's write of the request log was refused, so every
answer on a fresh stack ended in STAGE_FAILED)

Revision ID: 0019
Revises: 0018

The writer's `ON CONFLICT ... DO UPDATE SET model_parts = EXCLUDED.model_parts` needs
UPDATE of the column and SELECT of it (Postgres checks `EXCLUDED.x` as a read of x), as
0009 grants the log's other upserted columns to every stage's role. (Branch i31 carries
the same grant as its own 0017_model_parts_grant.py, on the chain before 0016 and 0017
were renumbered; its merge keeps this one.)

Names are written out here, not imported: a migration keeps doing what it did.
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

STAGES = ("intentroute_gateway", "intentroute_classifier", "intentroute_retriever",
          "intentroute_generator", "intentroute_validator")


def upgrade() -> None:
    roles = ", ".join(STAGES)
    op.execute(f"GRANT SELECT (model_parts), UPDATE (model_parts) ON request_log TO {roles}")


def downgrade() -> None:
    roles = ", ".join(STAGES)
    op.execute(f"REVOKE SELECT (model_parts), UPDATE (model_parts) ON request_log "
               f"FROM {roles}")
