"""SQS door, part two: a queue's policy and encryption settings, a message's
AWSTraceHeader.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Stored as given and returned as given (the SQS door's Policy, Kms* and
    # SqsManagedSseEnabled attributes). SQS turns SqsManagedSseEnabled on for
    # every new queue, and so does the default here.
    op.execute(
        """
        ALTER TABLE queues
            ADD COLUMN policy text,
            ADD COLUMN kms_master_key_id text,
            ADD COLUMN kms_data_key_reuse_period integer NOT NULL DEFAULT 300
                CHECK (kms_data_key_reuse_period BETWEEN 60 AND 86400),
            ADD COLUMN sqs_managed_sse boolean NOT NULL DEFAULT true
        """
    )
    # The one message system attribute a sender sets (SQS's AWSTraceHeader);
    # NULL for nearly every message, so it costs a row nothing.
    op.execute("ALTER TABLE messages ADD COLUMN trace_header text")


def downgrade() -> None:
    op.execute("ALTER TABLE messages DROP COLUMN trace_header")
    op.execute(
        """
        ALTER TABLE queues
            DROP COLUMN sqs_managed_sse,
            DROP COLUMN kms_data_key_reuse_period,
            DROP COLUMN kms_master_key_id,
            DROP COLUMN policy
        """
    )
