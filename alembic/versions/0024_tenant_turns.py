"""Fair queues find their tenants through turns: rows inserted and deleted, never
updated, in place of the bound each tenant's row held.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07

Why (issue 44, step three). 0020 kept each tenant's bound (`tenants.ready_at`)
in its row, rewritten by every send, claim and acknowledgement that named the
tenant. While a transaction holds the cleanup horizon, a row rewritten that
often keeps every version, and each read or write of it by its key visits them
all: a fair claim of ten read some 30,000 buffers after a few minutes, against
about 620 on a clean database (docs/decisions.md, "History costs nothing, step
three").

`leaseq.turns` holds a tenant's turns: from a turn's time on, the tenant may
have a message claimable. Every write that makes a message claimable sooner (a
send, a release, a give-back, a move to a fair dead-letter queue, a redrive)
inserts one at or below the message's deadline; a claim deletes the turns it
read and inserts the tenant's next. No unique key (a tenant may hold several,
a claim collapses them), no update: a claim deletes only turns its snapshot
sees, each locked with SKIP LOCKED, so a send it missed keeps its own turn,
and nothing it did not see is lost. Read from a floor (app/queue/floors.py)
through `turns_walk`, the claims pass only the turns deleted since.

The fair queues' messages get their turns here, read from the messages (a turn
per tenant at its earliest message due, and one at each deadline to come: a
claim reads no message whose deadline is to come). The SQL API's sends, its
visibility change and `leaseq.make_fair` insert turns instead of writing the
tenants' rows; the role that owns them (0018) may read and insert turns.

`tenants.ready_at` and `version` stay, unread by this version's claims: a
process of an earlier version still writes them during a rolling upgrade. Its
sends, claims and heartbeats give no turns, so its tenants' messages wait for the
fairness round's repair (every thirty seconds), and its own claims, which walk
`ready_at`, miss what this version sends: upgrade every process. `tenants_ready`
goes; `tenants_noisy` lets a claim read the few noisy tenants alone.
"""

from collections.abc import Sequence

from alembic import op
from app.db.function_edits import Edit, edit_functions, functions_owner

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SEND = "leaseq.send(text, text, jsonb, integer, text, text)"
_SEND_BATCH = "leaseq.send_batch(text, text[], jsonb[], integer[], text[], text[])"
_CHANGE = "leaseq.change_visibility(text, text, integer)"
_MAKE_FAIR = "leaseq.make_fair(bigint)"

_CREATE = [
    """
    CREATE TABLE leaseq.turns (
        queue_id bigint NOT NULL REFERENCES leaseq.queues (id) ON DELETE CASCADE,
        tenant text NOT NULL,
        at timestamptz NOT NULL
    )
    """,
    # The claims' walk, from their floor; and a tenant's own turns (a noisy
    # tenant's, the repair's look, an acknowledgement's of its lease's end).
    "CREATE INDEX turns_walk ON leaseq.turns (queue_id, at)",
    "CREATE INDEX turns_tenant ON leaseq.turns (queue_id, tenant, at)",
    "CREATE INDEX tenants_noisy ON leaseq.tenants (queue_id) WHERE noisy",
    """
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT m.queue_id, m.tenant, min(m.visible_at)
    FROM leaseq.messages AS m
    WHERE m.queue_id = ANY (ARRAY(SELECT q.id FROM leaseq.queues AS q WHERE q.fair))
      AND m.tenant IS NOT NULL
    GROUP BY m.queue_id, m.tenant,
             CASE WHEN m.visible_at > statement_timestamp() THEN m.visible_at END
    """,
    "DROP INDEX leaseq.tenants_ready",
]

_UPSERT_TAIL = (
    "ON CONFLICT (queue_id, tenant) DO UPDATE\n"
    "            SET ready_at = least(t.ready_at, EXCLUDED.ready_at),\n"
    "                version  = t.version + 1;\n"
)

# (function, text of 0020, text of this revision): each found exactly once.
_CHANGES: list[Edit] = [
    (
        _SEND,
        "answer leaseq.sent;\n",
        "answer leaseq.sent;\n"
        "        due timestamptz;\n",
    ),
    (
        _SEND,
        "RETURNING m.message_id INTO answer.message_id;\n",
        "RETURNING m.message_id, m.visible_at INTO answer.message_id, due;\n",
    ),
    (
        _SEND,
        "            INSERT INTO leaseq.tenants AS t (queue_id, tenant, ready_at)\n"
        "            VALUES (q.id, coalesce(send.\"group\", ''),\n"
        "                    statement_timestamp() + wait * interval '1 second')\n"
        "            " + _UPSERT_TAIL,
        "            INSERT INTO leaseq.turns (queue_id, tenant, at)\n"
        "            VALUES (q.id, coalesce(send.\"group\", ''), due);\n",
    ),
    (
        _SEND_BATCH,
        "            RETURNING id, message_id\n"
        "        )\n",
        "            RETURNING id, message_id, tenant, visible_at\n"
        "        ),\n"
        "        turned AS (\n"
        "            INSERT INTO leaseq.turns (queue_id, tenant, at)\n"
        "            SELECT DISTINCT q.id, kept.tenant, kept.visible_at\n"
        "            FROM kept\n"
        "            WHERE kept.tenant IS NOT NULL\n"
        "        )\n",
    ),
    (
        _SEND_BATCH,
        "        IF q.fair THEN\n"
        "            INSERT INTO leaseq.tenants AS t (queue_id, tenant, ready_at)\n"
        "            SELECT q.id, coalesce(m.tenant, ''),\n"
        "                   statement_timestamp() + min(m.wait) * interval '1 second'\n"
        "            FROM unnest(groups, waits) AS m(tenant, wait)\n"
        "            GROUP BY coalesce(m.tenant, '')\n"
        "            ORDER BY coalesce(m.tenant, '')\n"
        "            " + _UPSERT_TAIL
        + "        END IF;\n"
        "        SELECT count(*) FILTER (WHERE w = 0), min(w) FILTER (WHERE w > 0)\n",
        "        SELECT count(*) FILTER (WHERE w = 0), min(w) FILTER (WHERE w > 0)\n",
    ),
    (
        _CHANGE,
        "        IF deadline < previous THEN\n"
        "            IF message_tenant IS NOT NULL AND q.fair THEN\n"
        "                INSERT INTO leaseq.tenants AS t (queue_id, tenant, ready_at)\n"
        "                VALUES (q.id, message_tenant, deadline)\n"
        "                " + _UPSERT_TAIL.replace("\n            ", "\n                ")
        + "            END IF;\n",
        "        IF message_tenant IS NOT NULL AND q.fair THEN\n"
        "            INSERT INTO leaseq.turns (queue_id, tenant, at)\n"
        "            VALUES (q.id, message_tenant, deadline);\n"
        "        END IF;\n"
        "        IF deadline < previous THEN\n",
    ),
    (
        _MAKE_FAIR,
        "        INSERT INTO leaseq.tenants AS t (queue_id, tenant, ready_at)\n"
        "        SELECT queue, m.tenant, min(m.visible_at)\n"
        "        FROM leaseq.messages AS m\n"
        "        WHERE m.queue_id = queue AND m.tenant IS NOT NULL\n"
        "        GROUP BY m.tenant\n"
        "        ORDER BY m.tenant\n"
        "        " + _UPSERT_TAIL.replace("\n            ", "\n        "),
        "        INSERT INTO leaseq.turns (queue_id, tenant, at)\n"
        "        SELECT queue, m.tenant, min(m.visible_at)\n"
        "        FROM leaseq.messages AS m\n"
        "        WHERE m.queue_id = queue AND m.tenant IS NOT NULL\n"
        "        GROUP BY m.tenant, CASE WHEN m.visible_at > statement_timestamp()\n"
        "                                THEN m.visible_at END;\n",
    ),
]

# What the functions' owner (0018's role) needs for those writes; nothing when
# the migrating role owns them still (it owns the table).
_GRANTS = ("GRANT SELECT, INSERT ON leaseq.turns TO {role}",)


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
    edit_functions(op.get_bind(), _CHANGES, forward=False)
    op.execute("""
        CREATE INDEX tenants_ready ON leaseq.tenants (queue_id, noisy, ready_at)
        WHERE ready_at IS NOT NULL
    """)
    # Each tenant's bound back from its earliest turn (a tenant without one
    # has nothing claimable it knows of).
    op.execute("""
        UPDATE leaseq.tenants AS t
        SET ready_at = (SELECT min(u.at) FROM leaseq.turns AS u
                        WHERE u.queue_id = t.queue_id AND u.tenant = t.tenant),
            version  = t.version + 1
    """)
    op.execute("""
        INSERT INTO leaseq.tenants (queue_id, tenant, ready_at)
        SELECT u.queue_id, u.tenant, min(u.at)
        FROM leaseq.turns AS u
        GROUP BY u.queue_id, u.tenant
        ON CONFLICT (queue_id, tenant) DO NOTHING
    """)
    op.execute("DROP INDEX leaseq.tenants_noisy")
    op.execute("DROP TABLE leaseq.turns")
