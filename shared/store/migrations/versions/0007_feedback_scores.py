"""agent confidence divergence: agent_scores.divergence and .diverged, flagged for
review (the dashboard shows them)

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # score - the global rate at the last refresh, and whether it is beyond the bound.
    op.add_column("agent_scores", sa.Column("divergence", sa.Float, nullable=True))
    op.add_column("agent_scores", sa.Column("diverged", sa.Boolean, nullable=False,
                                            server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("agent_scores", "diverged")
    op.drop_column("agent_scores", "divergence")
