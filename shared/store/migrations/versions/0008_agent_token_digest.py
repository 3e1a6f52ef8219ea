"""agents.secret_digest: a fast, keyed digest of the agent's secret beside its bcrypt
hash, so the gateway checks a bearer token in microseconds (shared.auth.identity
token_digest). Empty for existing agents until their token is first checked with
bcrypt (the gateway, `intentroute up`) or their secret rotated.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("agents", sa.Column("secret_digest", sa.Text, nullable=False,
                                      server_default=""))


def downgrade() -> None:
    op.drop_column("agents", "secret_digest")
