"""request ids are scoped by agent: (agent_id, request_id) keys

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_constraint("classify_history_request_id_key", "classify_history", type_="unique")
    op.create_unique_constraint("uq_classify_history_agent_request", "classify_history",
                                ["agent_id", "request_id"])
    op.drop_constraint("uq_messages_request_role", "messages", type_="unique")
    op.create_unique_constraint("uq_messages_agent_request_role", "messages",
                                ["agent_id", "request_id", "role"])
    op.drop_constraint("request_log_pkey", "request_log", type_="primary")
    op.create_primary_key("request_log_pkey", "request_log", ["agent_id", "request_id"])


def downgrade() -> None:
    op.drop_constraint("request_log_pkey", "request_log", type_="primary")
    op.create_primary_key("request_log_pkey", "request_log", ["request_id"])
    op.drop_constraint("uq_messages_agent_request_role", "messages", type_="unique")
    op.create_unique_constraint("uq_messages_request_role", "messages", ["request_id", "role"])
    op.drop_constraint("uq_classify_history_agent_request", "classify_history", type_="unique")
    op.create_unique_constraint("classify_history_request_id_key", "classify_history",
                                ["request_id"])
