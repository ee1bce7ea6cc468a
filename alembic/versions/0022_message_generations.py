"""The messages table becomes a table partitioned by generation, today's table
its generation 0, online: no lock on the messages held longer than a catalog
change, none waited for longer than a fifth of a second.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07

Why (issue 44, part 4). While a transaction holds PostgreSQL's cleanup horizon,
VACUUM may not remove a settled message's row versions: the claims no longer
walk them (0021's floors), but the table and its indexes grow for as long as the
horizon is held. TRUNCATE frees a table's storage whatever the horizon; a
table of messages that can be emptied whole has to be one generation among
others. This revision lays the tables out for that: `leaseq.messages` is a table
partitioned by LIST (generation) and the table as it was is its partition
`leaseq.messages_g0`, with every row, index, constraint, privilege and storage
setting it had. The rotation of generations is the next step; until then every
message lives in generation 0.

The service's statements on one message or one claim name the partition
(`leaseq.messages_g0`): planned against the parent, a claim took 1.9x the time to
plan and 2.3x the time to run with four partitions (docs/decisions.md). What reads a
queue whole (stats, peek, purge, redrive, the SQL API's functions, the
operators' own SQL) reads the parent.

How, online. Each step is its own transaction, retried until it gets its
locks, none of which waits longer than 200 ms (so that sends, claims and
acknowledgements queued behind it wait no longer either), and none tried while
a transaction older than a second holds a lock on the table (a pg_dump holds
ACCESS SHARE on it until it ends: the migration waits for it, not the cycle):
1. the column `generation` (a constant default: no rewrite) and a CHECK
   (generation = 0) NOT VALID, brief ACCESS EXCLUSIVE;
2. that CHECK validated: a scan under SHARE UPDATE EXCLUSIVE, which sends,
   claims and deletes do not wait for; it lets the attachment skip its own scan;
3. the sequence `leaseq.message_ids` and the partitioned table, beside;
4. the swap, brief ACCESS EXCLUSIVE: the identity's counter carried to the
   sequence (a partitioned table's partition may not own an identity), the
   table renamed `messages_g0` and attached, the parent renamed `messages`,
   the privileges granted on the table granted on the parent too.
A try cut short anywhere is taken up by the next one where it stopped.

During a rolling upgrade, a process of an earlier version names
`leaseq.messages`, now the parent: its statements reach generation 0 through it,
correctly and a little slower, until it is replaced.
"""

from collections.abc import Sequence

from alembic import op
from app.db.migrate import retried

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LOCK_WAIT = "200ms"

_COLUMN = f"""
DO $$
BEGIN
    SET LOCAL lock_timeout = '{LOCK_WAIT}';
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'leaseq.messages'::regclass
                     AND attname = 'generation' AND NOT attisdropped) THEN
        ALTER TABLE leaseq.messages ADD COLUMN generation smallint NOT NULL DEFAULT 0,
            ADD CONSTRAINT messages_generation_0 CHECK (generation = 0) NOT VALID;
    END IF;
END
$$
"""

_VALIDATE = "ALTER TABLE leaseq.messages VALIDATE CONSTRAINT messages_generation_0"

# The columns as the table has them, in its order; the defaults the SQL API's
# inserts (through the parent) take.
_PARENT = """
CREATE TABLE IF NOT EXISTS leaseq.messages_parted (
    id bigint NOT NULL DEFAULT nextval('leaseq.message_ids'),
    queue_id bigint NOT NULL,
    message_id uuid NOT NULL DEFAULT gen_random_uuid(),
    body text NOT NULL,
    attributes jsonb NOT NULL DEFAULT '{}',
    sent_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    visible_at timestamptz NOT NULL,
    receive_count integer NOT NULL DEFAULT 0,
    claim_token uuid,
    fencing_token bigint,
    leased boolean NOT NULL DEFAULT false,
    first_received_at timestamptz,
    checkpoint jsonb,
    dead_letter_source_id bigint,
    attribute_types jsonb,
    sender_id text,
    group_id text,
    sequence_number bigint,
    deduplication_id text,
    trace_header text,
    claimed_at timestamptz,
    tenant text,
    generation smallint NOT NULL DEFAULT 0
) PARTITION BY LIST (generation)
"""

# Every privilege granted on the table, granted on the parent too (the SQL API's
# owner role, an application's reader): through the parent, PostgreSQL checks the
# parent's privileges alone.
_COPY_GRANTS = """
    FOR grant_sql IN
        WITH table_grants AS (
            SELECT g.grantee AS role, g.privilege_type,
                   CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC'
                        ELSE quote_ident(g.grantee) END AS grantee
            FROM information_schema.role_table_grants AS g
            WHERE g.table_schema = 'leaseq' AND g.table_name = 'messages_g0'
              AND g.grantee <> g.grantor
        )
        SELECT format('GRANT %s ON leaseq.messages TO %s', t.privilege_type, t.grantee)
        FROM table_grants AS t
        UNION ALL
        SELECT format('GRANT %s (%I) ON leaseq.messages TO %s', c.privilege_type,
                      c.column_name, CASE WHEN c.grantee = 'PUBLIC' THEN 'PUBLIC'
                                          ELSE quote_ident(c.grantee) END)
        FROM information_schema.column_privileges AS c
        WHERE c.table_schema = 'leaseq' AND c.table_name = 'messages_g0'
          AND c.grantee <> c.grantor
          AND NOT EXISTS (SELECT 1 FROM table_grants AS t
                          WHERE t.role = c.grantee AND t.privilege_type = c.privilege_type)
        UNION ALL
        -- An identity needs no privilege on its counter; a default's sequence does.
        SELECT format('GRANT USAGE ON SEQUENCE leaseq.message_ids TO %s', t.grantee)
        FROM table_grants AS t
        WHERE t.privilege_type = 'INSERT'
    LOOP
        EXECUTE grant_sql;
    END LOOP;
"""

_SWAP = f"""
DO $$
DECLARE
    counter text;
    last bigint;
    called boolean;
    grant_sql text;
BEGIN
    SET LOCAL lock_timeout = '{LOCK_WAIT}';
    LOCK TABLE leaseq.messages IN ACCESS EXCLUSIVE MODE;
    counter := pg_get_serial_sequence('leaseq.messages', 'id');
    EXECUTE format('SELECT last_value, is_called FROM %s', counter) INTO last, called;
    PERFORM setval('leaseq.message_ids', last, called);
    ALTER TABLE leaseq.messages ALTER COLUMN id DROP IDENTITY;
    ALTER TABLE leaseq.messages ALTER COLUMN id SET DEFAULT nextval('leaseq.message_ids');
    ALTER TABLE leaseq.messages RENAME TO messages_g0;
    ALTER TABLE leaseq.messages_parted ATTACH PARTITION leaseq.messages_g0 FOR VALUES IN (0);
    ALTER TABLE leaseq.messages_g0 DROP CONSTRAINT messages_generation_0;
    ALTER TABLE leaseq.messages_parted RENAME TO messages;
    {_COPY_GRANTS}
END
$$
"""

_UNSWAP = f"""
DO $$
DECLARE
    next bigint;
BEGIN
    SET LOCAL lock_timeout = '{LOCK_WAIT}';
    LOCK TABLE leaseq.messages, leaseq.messages_g0 IN ACCESS EXCLUSIVE MODE;
    IF EXISTS (SELECT 1 FROM pg_inherits
               WHERE inhparent = 'leaseq.messages'::regclass
                 AND inhrelid <> 'leaseq.messages_g0'::regclass) THEN
        RAISE EXCEPTION 'leaseq.messages has generations other than 0: downgrade past 0022 '
                        'only from this revision''s layout';
    END IF;
    ALTER TABLE leaseq.messages DETACH PARTITION leaseq.messages_g0;
    DROP TABLE leaseq.messages;
    ALTER TABLE leaseq.messages_g0 RENAME TO messages;
    ALTER TABLE leaseq.messages DROP COLUMN generation;
    ALTER TABLE leaseq.messages ALTER COLUMN id DROP DEFAULT;
    next := nextval('leaseq.message_ids');
    EXECUTE format('ALTER TABLE leaseq.messages ALTER COLUMN id '
                   'ADD GENERATED ALWAYS AS IDENTITY (START WITH %s)', next);
    DROP SEQUENCE leaseq.message_ids;
END
$$
"""


def _retried(sql: str) -> None:
    retried(op.get_bind(), sql, table="leaseq.messages", revision=revision)


def _swapped() -> bool:
    return bool(op.get_bind().exec_driver_sql(
        "SELECT to_regclass('leaseq.messages_g0') IS NOT NULL").scalar_one())


def upgrade() -> None:
    with op.get_context().autocommit_block():
        if _swapped():
            return
        _retried(_COLUMN)
        _retried(_VALIDATE)
        op.execute("CREATE SEQUENCE IF NOT EXISTS leaseq.message_ids AS bigint")
        op.execute(_PARENT)
        _retried(_SWAP)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        if _swapped():
            _retried(_UNSWAP)
