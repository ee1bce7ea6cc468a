"""Dead-letter queues, retry ladders and redrive tasks.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Redrive policy (SQS): a message received max_receive_count times is moved
    # to the dead-letter queue instead of being delivered again. RESTRICT: a
    # queue named as someone's dead-letter queue cannot be deleted.
    op.execute(
        """
        ALTER TABLE queues
            ADD COLUMN dead_letter_queue_id bigint REFERENCES queues (id) ON DELETE RESTRICT,
            ADD COLUMN max_receive_count integer CHECK (max_receive_count BETWEEN 1 AND 1000),
            ADD CONSTRAINT queues_redrive_policy_whole
                CHECK ((dead_letter_queue_id IS NULL) = (max_receive_count IS NULL)),
            ADD CONSTRAINT queues_not_own_dead_letter_queue
                CHECK (dead_letter_queue_id <> id),
            -- Retry ladder (beyond SQS): the delay of a release without one.
            ADD COLUMN retry_initial double precision CHECK (retry_initial BETWEEN 0 AND 43200),
            ADD COLUMN retry_multiplier double precision
                CHECK (retry_multiplier BETWEEN 1 AND 100),
            ADD COLUMN retry_max double precision CHECK (retry_max BETWEEN 0 AND 43200),
            ADD COLUMN retry_jitter double precision CHECK (retry_jitter BETWEEN 0 AND 1),
            ADD CONSTRAINT queues_retry_backoff_whole CHECK (
                num_nulls(retry_initial, retry_multiplier, retry_max, retry_jitter) IN (0, 4)
            )
        """
    )
    op.execute(
        "CREATE INDEX queues_dead_letter_queue ON queues (dead_letter_queue_id) "
        "WHERE dead_letter_queue_id IS NOT NULL"
    )
    # Where a dead-lettered message came from; a redrive sends it back there.
    op.execute(
        """
        ALTER TABLE messages
            ADD COLUMN dead_letter_source_id bigint REFERENCES queues (id) ON DELETE SET NULL
        """
    )
    op.execute("CREATE TYPE redrive_status AS ENUM ('running', 'completed', 'cancelled', 'failed')")
    op.execute(
        """
        CREATE TABLE redrive_tasks (
            id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
            source_queue_id     bigint NOT NULL REFERENCES queues (id) ON DELETE CASCADE,
            -- NULL: every message goes back to the queue it was dead-lettered from.
            destination_queue_id bigint REFERENCES queues (id) ON DELETE CASCADE,
            max_per_second      integer CHECK (max_per_second BETWEEN 1 AND 100000),
            status              redrive_status NOT NULL DEFAULT 'running',
            moved               bigint NOT NULL DEFAULT 0 CHECK (moved >= 0),
            to_move_at_start    bigint NOT NULL CHECK (to_move_at_start >= 0),
            failure             text,
            -- The process running the task holds it until then (a lease, like a
            -- message's): after a crash another process takes it over.
            runner_until        timestamptz NOT NULL DEFAULT statement_timestamp(),
            created_at          timestamptz NOT NULL DEFAULT statement_timestamp(),
            updated_at          timestamptz NOT NULL DEFAULT statement_timestamp()
        )
        """
    )
    # One running task per dead-letter queue, as SQS allows.
    op.execute(
        "CREATE UNIQUE INDEX redrive_tasks_one_running ON redrive_tasks (source_queue_id) "
        "WHERE status = 'running'"
    )


def downgrade() -> None:
    op.execute("DROP TABLE redrive_tasks")
    op.execute("DROP TYPE redrive_status")
    op.execute("ALTER TABLE messages DROP COLUMN dead_letter_source_id")
    op.execute("DROP INDEX queues_dead_letter_queue")
    op.execute(
        """
        ALTER TABLE queues
            DROP CONSTRAINT queues_retry_backoff_whole,
            DROP COLUMN retry_jitter,
            DROP COLUMN retry_max,
            DROP COLUMN retry_multiplier,
            DROP COLUMN retry_initial,
            DROP CONSTRAINT queues_not_own_dead_letter_queue,
            DROP CONSTRAINT queues_redrive_policy_whole,
            DROP COLUMN max_receive_count,
            DROP COLUMN dead_letter_queue_id
        """
    )
