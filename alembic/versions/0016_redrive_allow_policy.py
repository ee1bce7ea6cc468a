"""SQS's RedriveAllowPolicy: which queues may name a queue as their dead-letter
queue.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04

Kept twice, written together by the one door that sets it: the policy's text as
the SQS client gave it (a Get returns that very text), and what the engine
enforces, `redrive_sources`: NULL lets every queue name this one, an empty array
none, otherwise the names of the queues allowed. The check reads the array in
the transaction that resolves a redrive policy's target, so it needs neither
JSON nor ARNs.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE leaseq.queues
            ADD COLUMN redrive_allow_policy text,
            ADD COLUMN redrive_sources text[]
        """
    )


def downgrade() -> None:
    op.execute(
        "ALTER TABLE leaseq.queues DROP COLUMN redrive_sources, DROP COLUMN redrive_allow_policy"
    )
