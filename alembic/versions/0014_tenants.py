"""A message on a standard queue may name its tenant (its group, SQS's
MessageGroupId on a fair queue): stored with the message and returned with it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04

The tenant has a column of its own rather than FIFO's `group_id`: every
statement of a FIFO queue reads `group_id` as the key of a group row (a claim
one group at a time, a sequence number per message), none of which a standard
queue's tenant has. A NULL column costs a row nothing (the row already has a
null bitmap), so a queue whose messages name no tenant stores what it stored.

The SQL API's send checks and stores it as the REST send does: 0012's
functions are rewritten from their stored definitions, each change counted.
"""

from collections.abc import Sequence

from alembic import op
from app.db.function_edits import Edit, edit_functions

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CHECK = "leaseq.check_message(leaseq.queues, integer, text, jsonb, integer, text, text)"
_SEND = "leaseq.send(text, text, jsonb, integer, text, text)"
_SEND_BATCH = "leaseq.send_batch(text, text[], jsonb[], integer[], text[], text[])"

# (function, text of 0012, text of this revision): each found exactly once.
_CHANGES: list[Edit] = [
    (
        _CHECK,
        "IF message_group IS NOT NULL OR deduplication_id IS NOT NULL THEN",
        "IF message_group IS NOT NULL AND message_group !~ '^[!-~]{1,128}$' THEN\n"
        "                RAISE EXCEPTION USING ERRCODE = 'LQ002',\n"
        "                    MESSAGE = prefix || 'group must be 1-128 letters, digits and "
        "punctuation';\n"
        "            END IF;\n"
        "            IF deduplication_id IS NOT NULL THEN",
    ),
    (
        _CHECK,
        "'group and deduplication_id are for FIFO queues; this queue '",
        "'deduplication_id is for FIFO queues; this queue '",
    ),
    (
        _SEND,
        "(queue_id, body, attributes, visible_at)",
        "(queue_id, body, attributes, tenant, visible_at)",
    ),
    (
        _SEND,
        "coalesce(send.attributes, '{}'),",
        "coalesce(send.attributes, '{}'), send.\"group\",",
    ),
    (
        _SEND_BATCH,
        "(queue_id, body, attributes, visible_at)",
        "(queue_id, body, attributes, tenant, visible_at)",
    ),
    (
        _SEND_BATCH,
        "coalesce(m.attributes, '{}'),",
        "coalesce(m.attributes, '{}'), m.tenant,",
    ),
    (
        _SEND_BATCH,
        "unnest(bodies, send_batch.attributes, waits)",
        "unnest(bodies, send_batch.attributes, groups, waits)",
    ),
    (
        _SEND_BATCH,
        "AS m(body, attributes, wait, ord)",
        "AS m(body, attributes, tenant, wait, ord)",
    ),
]


def upgrade() -> None:
    op.execute("ALTER TABLE leaseq.messages ADD COLUMN tenant text")
    edit_functions(op.get_bind(), _CHANGES)


def downgrade() -> None:
    edit_functions(op.get_bind(), _CHANGES, forward=False)
    op.execute("ALTER TABLE leaseq.messages DROP COLUMN tenant")
