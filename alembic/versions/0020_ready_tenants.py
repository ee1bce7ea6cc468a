"""Fair queues keep each tenant's next claimable time, so that a fair claim reads
the tenants that may have a message for it in that order, not every tenant.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07

0015's fair claim found the tenants by a loose index scan of
`messages_tenant_claim`: one probe per tenant with a message, on every receive
(128 ms a receive and delete at 20,000 tenants, issue 44). `leaseq.tenants`
now holds, per tenant, `ready_at`: a lower bound of when one of its messages may
next be claimed (NULL when it has none), indexed with `noisy` so that a claim
walks the quiet tenants that are ready in that order and the few noisy ones
apart. It is what FIFO's `message_groups.visible_at` is to a group (0007): never
later than the truth, lowered by every write that can make one of the tenant's
messages claimable sooner, raised only by a statement that read the tenant's
messages in a snapshot no such write has changed since; `version` tells it, moved
on by every lowering write. docs/decisions.md says why and what else was weighed.

A new row's version starts at its statement's time in microseconds rather than
at 0, so that a row forgotten and made again (the fairness round forgets a
tenant with nothing stored) never shows a claim that read the old one the
version it read.

The SQL API's sends and visibility changes lower the bound too, as does
`leaseq.make_fair`, which now gives the tenants of a queue turning fair their
rows; the role that owns them (0018) may write those two columns. The rows of
the fair queues' tenants get their bounds here from their messages, one index
probe per tenant.
"""

from collections.abc import Sequence

from alembic import op
from app.db.function_edits import Edit, edit_functions, functions_owner

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SEND = "leaseq.send(text, text, jsonb, integer, text, text)"
_SEND_BATCH = "leaseq.send_batch(text, text[], jsonb[], integer[], text[], text[])"
_CHANGE = "leaseq.change_visibility(text, text, integer)"
_MAKE_FAIR = "leaseq.make_fair(bigint)"

_CREATE = [
    # Both columns added without a rewrite of the table (a default that is no
    # volatile function is stored once, in the catalog).
    """
    ALTER TABLE leaseq.tenants
        ADD COLUMN ready_at timestamptz,
        ADD COLUMN version bigint NOT NULL
            DEFAULT CAST(extract(epoch FROM statement_timestamp()) * 1000000 AS bigint)
    """,
    # The claim's walk: a queue's quiet tenants that are ready, by their bound,
    # and its noisy ones apart. Tenants with nothing stored are left out.
    """
    CREATE INDEX tenants_ready ON leaseq.tenants (queue_id, noisy, ready_at)
    WHERE ready_at IS NOT NULL
    """,
    # Every tenant with a message on a fair queue gets its row and its bound
    # (its earliest message's), found tenant by tenant through
    # messages_tenant_claim (a loose index scan) rather than by reading every
    # message.
    """
    WITH RECURSIVE seen (queue_id, tenant) AS (
        SELECT q.id,
               (SELECT m.tenant FROM leaseq.messages AS m
                WHERE m.queue_id = q.id AND m.tenant IS NOT NULL
                ORDER BY m.tenant LIMIT 1)
        FROM leaseq.queues AS q
        WHERE q.fair
        UNION ALL
        SELECT s.queue_id,
               (SELECT m.tenant FROM leaseq.messages AS m
                WHERE m.queue_id = s.queue_id AND m.tenant > s.tenant
                ORDER BY m.tenant LIMIT 1)
        FROM seen AS s
        WHERE s.tenant IS NOT NULL
    )
    INSERT INTO leaseq.tenants AS t (queue_id, tenant, ready_at)
    SELECT s.queue_id, s.tenant,
           (SELECT m.visible_at FROM leaseq.messages AS m
            WHERE m.queue_id = s.queue_id AND m.tenant = s.tenant
            ORDER BY m.visible_at LIMIT 1)
    FROM seen AS s
    WHERE s.tenant IS NOT NULL
    ORDER BY s.queue_id, s.tenant
    ON CONFLICT (queue_id, tenant) DO UPDATE SET ready_at = EXCLUDED.ready_at
    """,
]

# The SQL API's writes of a fair queue's messages lower their tenant's bound in
# the caller's transaction, as the service's statements do (queries.sql).
_LOWER = (
    "ON CONFLICT (queue_id, tenant) DO UPDATE\n"
    "            SET ready_at = least(t.ready_at, EXCLUDED.ready_at),\n"
    "                version  = t.version + 1;\n"
)

# (function, text of 0015, text of this revision): each found exactly once.
_CHANGES: list[Edit] = [
    (
        _SEND,
        "RETURNING m.message_id INTO answer.message_id;\n",
        "RETURNING m.message_id INTO answer.message_id;\n"
        "        IF q.fair THEN\n"
        "            INSERT INTO leaseq.tenants AS t (queue_id, tenant, ready_at)\n"
        "            VALUES (q.id, coalesce(send.\"group\", ''),\n"
        "                    statement_timestamp() + wait * interval '1 second')\n"
        "            " + _LOWER
        + "        END IF;\n",
    ),
    (
        _SEND_BATCH,
        "        SELECT count(*) FILTER (WHERE w = 0), min(w) FILTER (WHERE w > 0)\n",
        "        IF q.fair THEN\n"
        "            INSERT INTO leaseq.tenants AS t (queue_id, tenant, ready_at)\n"
        "            SELECT q.id, coalesce(m.tenant, ''),\n"
        "                   statement_timestamp() + min(m.wait) * interval '1 second'\n"
        "            FROM unnest(groups, waits) AS m(tenant, wait)\n"
        "            GROUP BY coalesce(m.tenant, '')\n"
        "            ORDER BY coalesce(m.tenant, '')\n"
        "            " + _LOWER
        + "        END IF;\n"
        "        SELECT count(*) FILTER (WHERE w = 0), min(w) FILTER (WHERE w > 0)\n",
    ),
    (
        _CHANGE,
        "message_group text;\n",
        "message_group text;\n"
        "        message_tenant text;\n",
    ),
    (
        _CHANGE,
        "RETURNING m.visible_at, prior.visible_at, m.group_id\n"
        "        INTO deadline, previous, message_group;\n",
        "RETURNING m.visible_at, prior.visible_at, m.group_id, m.tenant\n"
        "        INTO deadline, previous, message_group, message_tenant;\n",
    ),
    (
        _CHANGE,
        "        IF deadline < previous THEN\n",
        "        IF deadline < previous THEN\n"
        "            IF message_tenant IS NOT NULL AND q.fair THEN\n"
        "                INSERT INTO leaseq.tenants AS t (queue_id, tenant, ready_at)\n"
        "                VALUES (q.id, message_tenant, deadline)\n"
        "                " + _LOWER.replace("\n            ", "\n                ")
        + "            END IF;\n",
    ),
    (
        _MAKE_FAIR,
        "WHERE m.queue_id = queue AND m.tenant IS NULL;\n",
        "WHERE m.queue_id = queue AND m.tenant IS NULL;\n"
        "        INSERT INTO leaseq.tenants AS t (queue_id, tenant, ready_at)\n"
        "        SELECT queue, m.tenant, min(m.visible_at)\n"
        "        FROM leaseq.messages AS m\n"
        "        WHERE m.queue_id = queue AND m.tenant IS NOT NULL\n"
        "        GROUP BY m.tenant\n"
        "        ORDER BY m.tenant\n"
        "        " + _LOWER.replace("\n            ", "\n        "),
    ),
]

# What the functions' owner (0018's role) needs for those writes; nothing when
# the migrating role owns them still (it owns the table).
_GRANTS = (
    "GRANT SELECT, INSERT ON leaseq.tenants TO {role}",
    "GRANT UPDATE (ready_at, version) ON leaseq.tenants TO {role}",
)


def _functions_owner() -> str | None:
    """The role owning the SQL API's functions, when it is not the migrating one."""
    return functions_owner(op.get_bind(), _SEND)


def upgrade() -> None:
    for statement in _CREATE:
        op.execute(statement)
    edit_functions(op.get_bind(), _CHANGES)
    owner = _functions_owner()
    if owner is not None:
        for grant in _GRANTS:
            op.execute(grant.format(role=owner))


def downgrade() -> None:
    owner = _functions_owner()
    if owner is not None:
        for grant in reversed(_GRANTS):
            op.execute(grant.replace("GRANT ", "REVOKE ", 1).replace(" TO ", " FROM ")
                       .format(role=owner))
    edit_functions(op.get_bind(), _CHANGES, forward=False)
    op.execute("DROP INDEX leaseq.tenants_ready")
    op.execute("ALTER TABLE leaseq.tenants DROP COLUMN ready_at, DROP COLUMN version")
