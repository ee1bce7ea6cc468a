"""A move task outlives its destination queue: deleting the destination fails the
task (SQS's FAILED, "AWS.SimpleQueueService.NonExistentQueue") instead of deleting it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The destination's name, kept for the listing once the queue is gone; and a
    # deleted destination now leaves the task (its id NULL) for the runner to fail.
    op.execute("ALTER TABLE redrive_tasks ADD COLUMN destination_name text")
    op.execute(
        """
        UPDATE redrive_tasks AS t SET destination_name = q.name
        FROM queues AS q WHERE q.id = t.destination_queue_id
        """
    )
    op.execute(
        """
        ALTER TABLE redrive_tasks
            DROP CONSTRAINT redrive_tasks_destination_queue_id_fkey,
            ADD CONSTRAINT redrive_tasks_destination_queue_id_fkey
                FOREIGN KEY (destination_queue_id) REFERENCES queues (id) ON DELETE SET NULL
        """
    )


def downgrade() -> None:
    # Tasks whose destination is gone cannot be kept under the old constraint.
    op.execute(
        "DELETE FROM redrive_tasks "
        "WHERE destination_name IS NOT NULL AND destination_queue_id IS NULL"
    )
    op.execute(
        """
        ALTER TABLE redrive_tasks
            DROP CONSTRAINT redrive_tasks_destination_queue_id_fkey,
            ADD CONSTRAINT redrive_tasks_destination_queue_id_fkey
                FOREIGN KEY (destination_queue_id) REFERENCES queues (id) ON DELETE CASCADE
        """
    )
    op.execute("ALTER TABLE redrive_tasks DROP COLUMN destination_name")
