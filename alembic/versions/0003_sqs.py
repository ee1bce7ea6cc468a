"""SQS wire compatibility: typed message attributes, the sender, queue tags.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # `attributes` stays the flat {name: string} the REST API shows (every
    # String and Number attribute). `attribute_types` holds only what that
    # cannot: the data type of attributes that are not plain "String", and the
    # value of Binary ones (base64). NULL: every attribute is a plain String.
    op.execute(
        """
        ALTER TABLE messages
            ADD COLUMN attribute_types jsonb,
            ADD COLUMN sender_id text
        """
    )
    op.execute("ALTER TABLE queues ADD COLUMN tags jsonb NOT NULL DEFAULT '{}'::jsonb")


def downgrade() -> None:
    op.execute("ALTER TABLE queues DROP COLUMN tags")
    op.execute("ALTER TABLE messages DROP COLUMN sender_id, DROP COLUMN attribute_types")
