"""Fair queues: a standard queue whose messages name tenants hands out quiet
tenants' messages before a noisy tenant's backlog.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04

A queue becomes fair with the first message that names a tenant
(`leaseq.make_fair`); from then on its messages that name none are stored with
the tenant '' (each its own tenant, never noisy), so that every message of a
fair queue is in `messages_tenant_claim` and the fair claim can reach a quiet
tenant's messages without walking past a noisy tenant's backlog in
`messages_claim`. A queue whose messages name no tenant never becomes fair and
pays nothing: the partial index holds none of its rows.

`leaseq.tenants` keeps, per fair queue and tenant, what the claim needs to
choose: messages in flight (counted by the claims and acknowledgements of the
service, counted again each second by its fairness round), processing time
(claim to acknowledgement, decayed over a minute), and whether the tenant is
noisy now. docs/decisions.md says why it is kept this way and what it costs.
"""

from collections.abc import Sequence

from alembic import op
from app.db.function_edits import Edit, edit_functions

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SEND = "leaseq.send(text, text, jsonb, integer, text, text)"
_SEND_BATCH = "leaseq.send_batch(text, text[], jsonb[], integer[], text[], text[])"

_CREATE = [
    """
    ALTER TABLE leaseq.queues
        ADD COLUMN fair boolean NOT NULL DEFAULT false,
        ADD COLUMN fair_in_flight_share double precision NOT NULL DEFAULT 0.1
            CONSTRAINT queues_fair_in_flight_share
            CHECK (fair_in_flight_share > 0 AND fair_in_flight_share <= 1),
        ADD COLUMN fair_in_flight_min integer NOT NULL DEFAULT 30
            CONSTRAINT queues_fair_in_flight_min
            CHECK (fair_in_flight_min BETWEEN 1 AND 120000),
        ADD COLUMN fair_processing_share double precision NOT NULL DEFAULT 0.1
            CONSTRAINT queues_fair_processing_share
            CHECK (fair_processing_share > 0 AND fair_processing_share <= 1)
    """,
    """
    CREATE INDEX messages_tenant_claim ON leaseq.messages (queue_id, tenant, visible_at)
    WHERE tenant IS NOT NULL
    """,
    # Updated by every claim and acknowledgement of a fair queue, never by a
    # send: room on each page for HOT updates (no indexed column changes).
    """
    CREATE TABLE leaseq.tenants (
        queue_id  bigint NOT NULL REFERENCES leaseq.queues (id) ON DELETE CASCADE,
        tenant    text NOT NULL,
        in_flight integer NOT NULL DEFAULT 0,
        busy      double precision NOT NULL DEFAULT 0,
        busy_at   timestamptz NOT NULL DEFAULT statement_timestamp(),
        noisy     boolean NOT NULL DEFAULT false,
        sending   boolean NOT NULL DEFAULT true,
        PRIMARY KEY (queue_id, tenant)
    ) WITH (fillfactor = 50)
    """,
    # The one way a queue becomes fair, for the service and the SQL API alike:
    # the queue marked, its messages that named no tenant given the tenant '',
    # and every process told to read the queue again. Concurrent callers
    # queue on the queue's row; the second finds it fair already.
    """
    CREATE FUNCTION leaseq.make_fair(queue bigint) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
    BEGIN
        UPDATE leaseq.queues AS q
        SET fair = true, updated_at = statement_timestamp()
        WHERE q.id = queue AND NOT q.fair AND NOT q.fifo;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        UPDATE leaseq.messages AS m SET tenant = ''
        WHERE m.queue_id = queue AND m.tenant IS NULL;
        PERFORM pg_notify('leaseq', format('%s:%s', queue, 'changed'));
        RETURN true;
    END
    $$
    """,
    "REVOKE EXECUTE ON FUNCTION leaseq.make_fair(bigint) FROM PUBLIC",
]

# (function, text of 0014, text of this revision): each found exactly once.
_CHANGES: list[Edit] = [
    (
        _SEND,
        "INSERT INTO leaseq.messages AS m (queue_id, body, attributes, tenant, visible_at)",
        "IF send.\"group\" IS NOT NULL AND NOT q.fair THEN\n"
        "            PERFORM leaseq.make_fair(q.id);\n"
        "            q.fair := true;\n"
        "        END IF;\n"
        "        INSERT INTO leaseq.messages AS m (queue_id, body, attributes, tenant, visible_at)",
    ),
    (
        _SEND,
        "send.\"group\",",
        "CASE WHEN q.fair THEN coalesce(send.\"group\", '') END,",
    ),
    (
        _SEND_BATCH,
        "RETURN QUERY",
        "IF NOT q.fair AND EXISTS (SELECT 1 FROM unnest(groups) AS g WHERE g IS NOT NULL) THEN\n"
        "            PERFORM leaseq.make_fair(q.id);\n"
        "            q.fair := true;\n"
        "        END IF;\n"
        "        RETURN QUERY",
    ),
    (
        _SEND_BATCH,
        "m.tenant,",
        "CASE WHEN q.fair THEN coalesce(m.tenant, '') END,",
    ),
]


def upgrade() -> None:
    for statement in _CREATE:
        op.execute(statement)
    edit_functions(op.get_bind(), _CHANGES)


def downgrade() -> None:
    edit_functions(op.get_bind(), _CHANGES, forward=False)
    op.execute("DROP FUNCTION leaseq.make_fair(bigint)")
    op.execute("DROP TABLE leaseq.tenants")
    op.execute("DROP INDEX leaseq.messages_tenant_claim")
    op.execute("UPDATE leaseq.messages SET tenant = NULL WHERE tenant = ''")
    op.execute(
        "ALTER TABLE leaseq.queues DROP COLUMN fair, DROP COLUMN fair_in_flight_share, "
        "DROP COLUMN fair_in_flight_min, DROP COLUMN fair_processing_share"
    )
