"""A FIFO queue deduplicates by the scope it was created with.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04

SQS lets DeduplicationScope be changed after a queue is created, and returns the
new value, but goes on deduplicating as the queue was created (recorded against
AWS: a queue created with the scope `queue` and switched to high throughput still
refuses an id used in another group). `deduplicates_by` keeps that scope: set
when a queue is created, never changed; sends, the service's and the SQL API's
`leaseq.send_fifo`, read it.
"""

from collections.abc import Sequence

from alembic import op
from app.db.function_edits import Edit, edit_functions

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CHANGES: list[Edit] = [(
    "leaseq.send_fifo(leaseq.queues, text, jsonb, text, text)",
    "CASE WHEN q.deduplication_scope = 'message_group'",
    "CASE WHEN q.deduplicates_by = 'message_group'",
)]


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE leaseq.queues
            ADD COLUMN deduplicates_by text NOT NULL DEFAULT 'queue'
                CONSTRAINT queues_deduplicates_by
                CHECK (deduplicates_by IN ('queue', 'message_group'))
        """
    )
    op.execute("UPDATE leaseq.queues SET deduplicates_by = deduplication_scope")
    edit_functions(op.get_bind(), _CHANGES)


def downgrade() -> None:
    edit_functions(op.get_bind(), _CHANGES, forward=False)
    op.execute("ALTER TABLE leaseq.queues DROP COLUMN deduplicates_by")
