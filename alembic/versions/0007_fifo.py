"""FIFO queues: message groups, sequence numbers, deduplication, receive attempts.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A queue is FIFO from creation, and only a FIFO queue's name ends in
    # ".fifo" (SQS's rule, so that one name means one queue at both doors).
    op.execute(
        """
        ALTER TABLE queues
            ADD COLUMN fifo boolean NOT NULL DEFAULT false,
            ADD COLUMN content_based_deduplication boolean NOT NULL DEFAULT false,
            ADD COLUMN deduplication_scope text NOT NULL DEFAULT 'queue'
                CHECK (deduplication_scope IN ('queue', 'message_group')),
            ADD COLUMN fifo_throughput_limit text NOT NULL DEFAULT 'per_queue'
                CHECK (fifo_throughput_limit IN ('per_queue', 'per_message_group_id')),
            DROP CONSTRAINT queues_name_check,
            ADD CONSTRAINT queues_name_check
                CHECK (name ~ '^[A-Za-z0-9_-]{1,80}$' OR name ~ '^[A-Za-z0-9_-]{1,75}\\.fifo$'),
            ADD CONSTRAINT queues_fifo_name CHECK (fifo = (name LIKE '%.fifo')),
            ADD CONSTRAINT queues_fifo_only CHECK (
                fifo OR (NOT content_based_deduplication AND deduplication_scope = 'queue'
                         AND fifo_throughput_limit = 'per_queue'))
        """
    )
    # Strictly increasing across every send: a FIFO message's SequenceNumber,
    # and its place in its group.
    op.execute("CREATE SEQUENCE message_sequence AS bigint")
    op.execute(
        """
        ALTER TABLE messages
            ADD COLUMN group_id text,
            ADD COLUMN sequence_number bigint,
            ADD COLUMN deduplication_id text,
            ADD CONSTRAINT messages_fifo_whole
                CHECK ((group_id IS NULL) = (sequence_number IS NULL))
        """
    )
    # A group's messages in send order: a FIFO claim reads the first few of a
    # group through it, never the backlog. Standard queues' rows are not in it.
    op.execute(
        """
        CREATE INDEX messages_group_order ON messages (queue_id, group_id, sequence_number)
        WHERE group_id IS NOT NULL
        """
    )
    # One row per message group that has (or just had) messages: the row a
    # FIFO claim locks, so that two receivers never take the same group.
    # `visible_at` is never later than the moment the group can next be
    # claimed (a lower bound: a claim that looks too early corrects it);
    # `version` grows with every write that may make the group claimable
    # sooner or give it a message a claim's snapshot cannot see yet.
    op.execute(
        """
        CREATE TABLE message_groups (
            queue_id    bigint NOT NULL REFERENCES queues (id) ON DELETE CASCADE,
            group_id    text NOT NULL,
            visible_at  timestamptz NOT NULL,
            version     bigint NOT NULL DEFAULT 0,
            PRIMARY KEY (queue_id, group_id)
        )
        """
    )
    op.execute("CREATE INDEX message_groups_claim ON message_groups (queue_id, visible_at)")
    # Deduplication ids accepted in the last five minutes, per queue (scope '')
    # or per message group (scope = the group), with the message they named.
    op.execute(
        """
        CREATE TABLE message_deduplication (
            queue_id          bigint NOT NULL REFERENCES queues (id) ON DELETE CASCADE,
            scope             text NOT NULL,
            deduplication_id  text NOT NULL,
            message_id        uuid NOT NULL,
            sequence_number   bigint NOT NULL,
            expires_at        timestamptz NOT NULL,
            PRIMARY KEY (queue_id, scope, deduplication_id)
        )
        """
    )
    op.execute("CREATE INDEX message_deduplication_expiry ON message_deduplication (expires_at)")
    # A FIFO receive's ReceiveRequestAttemptId: what it claimed, for five minutes.
    op.execute(
        """
        CREATE TABLE receive_attempts (
            queue_id            bigint NOT NULL REFERENCES queues (id) ON DELETE CASCADE,
            attempt_id          text NOT NULL,
            message_rows        bigint[] NOT NULL,
            claim_tokens        uuid[] NOT NULL,
            visibility_timeout  integer NOT NULL,
            expires_at          timestamptz NOT NULL,
            PRIMARY KEY (queue_id, attempt_id)
        )
        """
    )
    op.execute("CREATE INDEX receive_attempts_expiry ON receive_attempts (expires_at)")
    # These tables turn over as the messages table does (migration 0004).
    for table in ("message_groups", "message_deduplication", "receive_attempts"):
        op.execute(
            f"""
            ALTER TABLE {table} SET (
                autovacuum_vacuum_scale_factor = 0.01,
                autovacuum_vacuum_threshold = 2000,
                autovacuum_vacuum_insert_scale_factor = 0.05,
                autovacuum_analyze_scale_factor = 0.05,
                autovacuum_vacuum_cost_delay = 0
            )
            """
        )


def downgrade() -> None:
    op.execute("DROP TABLE receive_attempts")
    op.execute("DROP TABLE message_deduplication")
    op.execute("DROP TABLE message_groups")
    op.execute("DROP INDEX messages_group_order")
    op.execute(
        """
        ALTER TABLE messages
            DROP CONSTRAINT messages_fifo_whole,
            DROP COLUMN deduplication_id,
            DROP COLUMN sequence_number,
            DROP COLUMN group_id
        """
    )
    op.execute("DROP SEQUENCE message_sequence")
    op.execute(
        """
        ALTER TABLE queues
            DROP CONSTRAINT queues_fifo_only,
            DROP CONSTRAINT queues_fifo_name,
            DROP CONSTRAINT queues_name_check,
            ADD CONSTRAINT queues_name_check CHECK (name ~ '^[A-Za-z0-9_-]{1,80}$'),
            DROP COLUMN fifo_throughput_limit,
            DROP COLUMN deduplication_scope,
            DROP COLUMN content_based_deduplication,
            DROP COLUMN fifo
        """
    )
