"""A standard queue's claims read two ranges of one index, each from a floor, so
that a transaction holding back the cleanup horizon does not make them walk
the queue's history.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06

`messages_claim` (queue_id, visible_at) held every message's deadlines in one
range: a claim read it from the queue's start, through the entries of every
version a claim or an acknowledgement had left behind, which VACUUM may not
remove while an older transaction runs (issue 44: the cycle 11x slower after
five minutes of one open transaction). `messages_by_state` (queue_id, leased,
visible_at) splits the range in two, messages waiting and messages leased, and
the service's claims read each from a floor below which nothing is claimable
(app/queue/floors.py). It takes the old index's place, entry for entry: a row
version is in one range of it, as it was in the old index once.

The floors rest on one rule: a deadline a claim reaches from below is measured
from the moment of its write, read once the writing transaction holds its ID.
The service's statements read it so (queries.sql, fragment `written`); here
the SQL API's `send`, `send_batch` and `change_visibility` do too.

Both indexes are built and dropped CONCURRENTLY, outside a transaction: sends
and claims go on while they are. A concurrent build waits for every transaction
older than it to end, a held horizon's too: an upgrade started while a pg_dump
runs finishes after it. A build cut short leaves an invalid index, dropped and
built again by the next try, before the functions are changed.

During a rolling upgrade, a process of an earlier version still writes
deadlines from the start of its statement: a message it sends may wait below a
new process's floor until the floors look back (30 seconds), never longer than
their backstop (10 minutes). Its claims read the new index without a range on
`leased`: correct, slower, until it is replaced.
"""

from collections.abc import Sequence

from alembic import op
from app.db.function_edits import Edit, edit_functions

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WRITTEN = "CASE WHEN pg_current_xact_id() IS NOT NULL THEN clock_timestamp() END"

# The moment of the write, read once the transaction holds its ID (queries.sql,
# fragment written); a message is sent at that moment, its delay counted from it.
_CHANGES: list[Edit] = [
    (
        "leaseq.send(text, text, jsonb, integer, text, text)",
        "INSERT INTO leaseq.messages AS m (queue_id, body, attributes, tenant, visible_at)\n"
        "        VALUES (q.id, send.body, coalesce(send.attributes, '{}'), "
        "CASE WHEN q.fair THEN coalesce(send.\"group\", '') END,\n"
        "                statement_timestamp() + wait * interval '1 second')\n",
        "INSERT INTO leaseq.messages AS m (queue_id, body, attributes, tenant, visible_at,\n"
        "                                         sent_at)\n"
        "        SELECT q.id, send.body, coalesce(send.attributes, '{}'), "
        "CASE WHEN q.fair THEN coalesce(send.\"group\", '') END,\n"
        "               w.at + wait * interval '1 second', w.at\n"
        f"        FROM (SELECT {_WRITTEN} AS at) AS w\n",
    ),
    (
        "leaseq.send_batch(text, text[], jsonb[], integer[], text[], text[])",
        "INSERT INTO leaseq.messages (queue_id, body, attributes, tenant, visible_at)\n",
        "INSERT INTO leaseq.messages (queue_id, body, attributes, tenant, visible_at, sent_at)\n",
    ),
    (
        "leaseq.send_batch(text, text[], jsonb[], integer[], text[], text[])",
        "statement_timestamp() + m.wait * interval '1 second'\n"
        "            FROM unnest(",
        "w.at + m.wait * interval '1 second', w.at\n"
        f"            FROM (SELECT {_WRITTEN} AS at) AS w, unnest(",
    ),
    (
        "leaseq.change_visibility(text, text, integer)",
        "        deadline timestamptz;\n",
        "        deadline timestamptz;\n"
        "        written timestamptz;\n",
    ),
    (
        "leaseq.change_visibility(text, text, integer)",
        "        UPDATE leaseq.messages AS m\n"
        "        SET visible_at = statement_timestamp() + seconds * interval '1 second',",
        f"        written := {_WRITTEN};\n"
        "        UPDATE leaseq.messages AS m\n"
        "        SET visible_at = written + seconds * interval '1 second',",
    ),
]


def _build(name: str, columns: str) -> None:
    if _invalid(name):
        op.execute(f"DROP INDEX CONCURRENTLY leaseq.{name}")
    op.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON leaseq.messages {columns}")


def _invalid(name: str) -> bool:
    return bool(op.get_bind().exec_driver_sql(
        "SELECT EXISTS (SELECT 1 FROM pg_index AS i "
        f"WHERE i.indexrelid = to_regclass('leaseq.{name}') AND NOT i.indisvalid)"
    ).scalar_one())


def upgrade() -> None:
    # The indexes first: each step of the block commits on its own, and a try cut
    # short in it must find the functions as this revision expects them.
    with op.get_context().autocommit_block():
        _build("messages_by_state", "(queue_id, leased, visible_at)")
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS leaseq.messages_claim")
    edit_functions(op.get_bind(), _CHANGES)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        _build("messages_claim", "(queue_id, visible_at)")
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS leaseq.messages_by_state")
    edit_functions(op.get_bind(), _CHANGES, forward=False)
