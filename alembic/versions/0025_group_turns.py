"""FIFO queues find their groups through turns and read each group from its
last head seen: no row rewritten by every send, claim and acknowledgement.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07

Why (issue 44, step four). Each FIFO group had a row in `message_groups`
(0007), which every send, claim, acknowledgement, release and shorter lease of
the group rewrote (its hint and version), and each group's messages were read
from the start of the group's range. While a transaction holds the cleanup
horizon, both walk history: the row's every version (a read by key, and the
claims' index of hints), and every settled message of the group. A FIFO queue
of 100 groups fell to a ninth of its rate in three minutes held
(docs/performance.md).

What replaces the row (docs/decisions.md, "History costs nothing, step four"):
- the group's advisory lock, which sends (and moves into the group) take
  before they number its messages and hold until they commit: a group's
  messages commit in the order of their numbers, and every message entering a
  group takes a number above all the group holds;
- turns, as a fair queue's tenants have (0024), the group's id as the tenant;
- `group_heads`: the first message of a group a claim saw (its sequence
  number), inserted, never updated. Numbers only grow within a group, so no
  message of it lies below a head once seen; a claim reads the group from its
  newest head.

The groups get their turns here, from their rows' hints and from each deadline
to come of their messages (a claim reads no deadline to come: each has a turn
of its own), and their heads from their first messages. The SQL API's FIFO
send takes the group's lock and gives a turn; its delete and its visibility
change give turns. `message_groups` goes: a process of an earlier version fails
on a FIFO queue's statements until it is upgraded, rather than writing
messages no turn leads to.
"""

from collections.abc import Sequence

from alembic import op
from app.db.function_edits import Edit, edit_functions, functions_owner

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SEND_FIFO = "leaseq.send_fifo(leaseq.queues, text, jsonb, text, text)"
_DELETE = "leaseq.delete(text, text)"
_CHANGE = "leaseq.change_visibility(text, text, integer)"

_FIFO_QUEUES = "ARRAY(SELECT q.id FROM leaseq.queues AS q WHERE q.fifo)"

_CREATE = [
    """
    CREATE TABLE leaseq.group_heads (
        queue_id bigint NOT NULL REFERENCES leaseq.queues (id) ON DELETE CASCADE,
        group_id text NOT NULL,
        since bigint NOT NULL,
        learned_at timestamptz NOT NULL DEFAULT now()
    )
    """,
    # A claim reads a group's newest head from the top; the superseded ones,
    # and whatever a held horizon keeps of them, lie below.
    "CREATE INDEX group_heads_newest ON leaseq.group_heads (queue_id, group_id, since DESC)",
    # Inserted by claims and swept, it turns over as the messages do (0004).
    """
    ALTER TABLE leaseq.group_heads SET (
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_threshold = 2000,
        autovacuum_vacuum_insert_scale_factor = 0.05,
        autovacuum_analyze_scale_factor = 0.05,
        autovacuum_vacuum_cost_delay = 0
    )
    """,
    f"""
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT g.queue_id, g.group_id, g.visible_at
    FROM leaseq.message_groups AS g
    UNION
    SELECT m.queue_id, m.group_id, m.visible_at
    FROM leaseq.messages AS m
    WHERE m.queue_id = ANY ({_FIFO_QUEUES})
      AND m.group_id IS NOT NULL AND m.visible_at > statement_timestamp()
    """,
    f"""
    INSERT INTO leaseq.group_heads (queue_id, group_id, since)
    SELECT m.queue_id, m.group_id, min(m.sequence_number)
    FROM leaseq.messages AS m
    WHERE m.queue_id = ANY ({_FIFO_QUEUES}) AND m.group_id IS NOT NULL
    GROUP BY m.queue_id, m.group_id
    """,
]

_GROUP_ROW = (
    "        WITH grouped AS (\n"
    "            INSERT INTO leaseq.message_groups AS g (queue_id, group_id, visible_at)\n"
    "            VALUES (q.id, message_group, statement_timestamp() + q.delay * interval '1 second')\n"
    "            ON CONFLICT (queue_id, group_id) DO UPDATE\n"
    "            SET visible_at = least(g.visible_at, EXCLUDED.visible_at),\n"
    "                version    = g.version + 1\n"
    "            RETURNING g.group_id\n"
    "        ),\n"
)
_GROUP_LOCK = (
    "        WITH grouped AS MATERIALIZED (\n"
    "            SELECT pg_advisory_xact_lock(hashtextextended(message_group, q.id)) AS locked\n"
    "        ),\n"
)
_BUMP = (
    "            UPDATE leaseq.message_groups AS g\n"
    "            SET visible_at = least(g.visible_at, statement_timestamp()),\n"
    "                version    = g.version + 1\n"
    "            WHERE g.queue_id = q.id AND g.group_id = message_group;\n"
)

# (function, text of 0024, text of this revision): each found exactly once.
_CHANGES: list[Edit] = [
    (_SEND_FIFO, "        stored boolean;\n",
     "        stored boolean;\n"
     "        written timestamptz;\n"),
    (_SEND_FIFO, _GROUP_ROW, _GROUP_LOCK),
    (
        _SEND_FIFO,
        "        IF stored THEN\n",
        "        IF stored THEN\n"
        "            written := CASE WHEN pg_current_xact_id() IS NOT NULL\n"
        "                            THEN clock_timestamp() END;\n"
        "            INSERT INTO leaseq.turns (queue_id, tenant, at)\n"
        "            VALUES (q.id, message_group, written + q.delay * interval '1 second');\n",
    ),
    (
        _DELETE,
        "        IF message_group IS NOT NULL THEN\n" + _BUMP,
        "        IF message_group IS NOT NULL THEN\n"
        "            INSERT INTO leaseq.turns (queue_id, tenant, at)\n"
        "            VALUES (q.id, message_group,\n"
        "                    CASE WHEN pg_current_xact_id() IS NOT NULL\n"
        "                         THEN clock_timestamp() END);\n",
    ),
    (
        _CHANGE,
        "        IF message_tenant IS NOT NULL AND q.fair THEN\n"
        "            INSERT INTO leaseq.turns (queue_id, tenant, at)\n"
        "            VALUES (q.id, message_tenant, deadline);\n"
        "        END IF;\n",
        "        IF (message_tenant IS NOT NULL AND q.fair) OR message_group IS NOT NULL THEN\n"
        "            INSERT INTO leaseq.turns (queue_id, tenant, at)\n"
        "            VALUES (q.id, coalesce(message_tenant, message_group), deadline);\n"
        "        END IF;\n",
    ),
    (
        _CHANGE,
        "            IF message_group IS NOT NULL THEN\n"
        "    " + _BUMP.replace("\n            ", "\n                ")
        + "            END IF;\n"
        "            PERFORM leaseq.announce(",
        "            PERFORM leaseq.announce(",
    ),
]


def upgrade() -> None:
    for statement in _CREATE:
        op.execute(statement)
    edit_functions(op.get_bind(), _CHANGES)
    op.execute("DROP TABLE leaseq.message_groups")


def downgrade() -> None:
    op.execute("""
        CREATE TABLE leaseq.message_groups (
            queue_id bigint NOT NULL REFERENCES leaseq.queues (id) ON DELETE CASCADE,
            group_id text NOT NULL,
            visible_at timestamptz NOT NULL,
            version bigint NOT NULL DEFAULT 0,
            PRIMARY KEY (queue_id, group_id)
        )
    """)
    op.execute(
        "CREATE INDEX message_groups_claim ON leaseq.message_groups (queue_id, visible_at)")
    # Each group's hint back from its earliest turn (now for a group with
    # messages and none: it is looked at once and corrected).
    op.execute(f"""
        INSERT INTO leaseq.message_groups (queue_id, group_id, visible_at)
        SELECT m.queue_id, m.group_id,
               coalesce((SELECT min(u.at) FROM leaseq.turns AS u
                         WHERE u.queue_id = m.queue_id AND u.tenant = m.group_id),
                        statement_timestamp())
        FROM (SELECT DISTINCT queue_id, group_id FROM leaseq.messages
              WHERE queue_id = ANY ({_FIFO_QUEUES}) AND group_id IS NOT NULL) AS m
    """)
    op.execute(f"DELETE FROM leaseq.turns WHERE queue_id = ANY ({_FIFO_QUEUES})")
    edit_functions(op.get_bind(), _CHANGES, forward=False)
    owner = functions_owner(op.get_bind(), _SEND_FIFO)
    if owner is not None:
        op.execute(f"GRANT SELECT, INSERT ON leaseq.message_groups TO {owner}")
        op.execute(f"GRANT UPDATE (visible_at, version) ON leaseq.message_groups TO {owner}")
    op.execute("DROP TABLE leaseq.group_heads")
