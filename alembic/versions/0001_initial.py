"""Queues, messages and the fencing-token sequence.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE queues (
            id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            name                text NOT NULL UNIQUE
                                CHECK (name ~ '^[A-Za-z0-9_-]{1,80}$'),
            visibility_timeout  integer NOT NULL DEFAULT 30
                                CHECK (visibility_timeout BETWEEN 0 AND 43200),
            message_retention   integer NOT NULL DEFAULT 345600
                                CHECK (message_retention BETWEEN 60 AND 1209600),
            delay               integer NOT NULL DEFAULT 0 CHECK (delay BETWEEN 0 AND 900),
            receive_wait        integer NOT NULL DEFAULT 0 CHECK (receive_wait BETWEEN 0 AND 20),
            max_message_bytes   integer NOT NULL DEFAULT 1048576
                                CHECK (max_message_bytes BETWEEN 1024 AND 1048576),
            created_at          timestamptz NOT NULL DEFAULT statement_timestamp(),
            updated_at          timestamptz NOT NULL DEFAULT statement_timestamp()
        )
        """
    )
    # Strictly increasing across every claim of every message: a sequence
    # never hands out the same value twice, even across rollbacks and crashes.
    op.execute("CREATE SEQUENCE fencing_tokens AS bigint")
    op.execute(
        """
        CREATE TABLE messages (
            id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            queue_id            bigint NOT NULL REFERENCES queues (id) ON DELETE CASCADE,
            message_id          uuid NOT NULL DEFAULT gen_random_uuid(),
            body                text NOT NULL,
            attributes          jsonb NOT NULL DEFAULT '{}'::jsonb,
            sent_at             timestamptz NOT NULL DEFAULT statement_timestamp(),
            -- The one deadline: claimable once visible_at <= now. A delay, a
            -- lease and a release all just move it.
            visible_at          timestamptz NOT NULL,
            receive_count       integer NOT NULL DEFAULT 0 CHECK (receive_count >= 0),
            claim_token         uuid,
            fencing_token       bigint,
            -- True while a receive holds the message (a lease, live or lapsed);
            -- false when never received or released. Tells in-flight from delayed.
            leased              boolean NOT NULL DEFAULT false,
            first_received_at   timestamptz,
            checkpoint          jsonb,
            CHECK ((claim_token IS NULL) = (fencing_token IS NULL)),
            CHECK (NOT leased OR claim_token IS NOT NULL)
        )
        """
    )
    # Matches the claim predicate: one queue, ordered by the deadline.
    op.execute("CREATE INDEX messages_claim ON messages (queue_id, visible_at)")


def downgrade() -> None:
    op.execute("DROP TABLE messages")
    op.execute("DROP SEQUENCE fencing_tokens")
    op.execute("DROP TABLE queues")
