"""The generations' ring: which generation is live, which one is being drained,
the epoch every service process acts by, and a second generation to rotate into.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07

Why (issue 44, part 4). 0022 laid the messages out as partitions of
`leaseq.messages`, all of them in generation 0. The rotation (app/queue/rotation.py)
moves what is left of the live generation into another one and empties the old
one by TRUNCATE, which frees its storage whatever the cleanup horizon. It needs:
- `leaseq.rotation`, one row: the epoch, the live generation, the one being
  drained (none between rotations). Each service process holds a shared advisory
  lock on the epoch it acts by (app/db/epochs.py); the rotation moves no row
  before the previous epoch's lock is free.
- `leaseq.generations`: each generation's state (live, draining, used: drained
  but not emptied yet, spare: empty) and the settled count it started from.
- The live generation in a sequence, `leaseq.live_generation_seq`, read by the
  parent's default for `generation`: what inserts through the parent (the SQL
  API's sends, in their callers' transactions) goes into the live generation as
  it is when the row is written, not as the caller's snapshot saw it (a
  REPEATABLE READ transaction begun before a rotation would otherwise write
  into the generation being emptied). A sequence is read outside MVCC.
- `leaseq.make_generation(n)`: a table like generation 0 (columns, defaults,
  constraints, indexes, storage settings, privileges, foreign keys), created
  apart and then attached. ATTACH PARTITION takes SHARE UPDATE EXCLUSIVE on the
  parent, which neither the cycle's statements nor a pg_dump's ACCESS SHARE
  conflicts with, so a rotation may make a generation while a dump runs.
Online: the parent's default is a catalog change under a lock waited for at most
200 ms and tried again (app/db/migrate.py, as 0022).
"""

from collections.abc import Sequence

from alembic import op
from app.db.migrate import retried

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LOCK_WAIT = "200ms"

_TABLES = """
CREATE TABLE IF NOT EXISTS leaseq.generations (
    generation smallint PRIMARY KEY CHECK (generation >= 0),
    state text NOT NULL CHECK (state IN ('live', 'draining', 'used', 'spare')),
    -- The row versions its table had left behind (updated or deleted, pg_stat)
    -- when it became live: what it left since is the rotation's measure.
    settled_before bigint NOT NULL DEFAULT 0
);

CREATE TABLE IF NOT EXISTS leaseq.rotation (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    epoch bigint NOT NULL,
    live smallint NOT NULL,
    draining smallint,
    since timestamptz NOT NULL DEFAULT statement_timestamp()
);

CREATE SEQUENCE IF NOT EXISTS leaseq.live_generation_seq AS smallint MINVALUE 0 START 0;

CREATE OR REPLACE FUNCTION leaseq.live_generation() RETURNS smallint
LANGUAGE sql VOLATILE
AS $$ SELECT last_value FROM leaseq.live_generation_seq $$;

-- Whoever may insert through the parent (the SQL API's owner) reads the sequence
-- its default reads.
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC'
                             ELSE quote_ident(g.grantee) END
        FROM information_schema.role_table_grants AS g
        WHERE g.table_schema = 'leaseq' AND g.table_name = 'messages'
          AND g.privilege_type = 'INSERT' AND g.grantee <> g.grantor
    LOOP
        EXECUTE format('GRANT SELECT ON SEQUENCE leaseq.live_generation_seq TO %s', grantee);
    END LOOP;
END
$$;

INSERT INTO leaseq.generations (generation, state, settled_before)
SELECT 0, 'live', pg_stat_get_tuples_updated('leaseq.messages_g0'::regclass)
                  + pg_stat_get_tuples_deleted('leaseq.messages_g0'::regclass)
ON CONFLICT DO NOTHING;

INSERT INTO leaseq.rotation (epoch, live) VALUES (1, 0) ON CONFLICT DO NOTHING;
"""

# The privileges granted on generation 0, granted on the new one: the SQL API's
# owner and an application's readers reach it through the parent, but an
# operator's SQL may name it.
_MAKE_GENERATION = """
CREATE OR REPLACE FUNCTION leaseq.make_generation(n smallint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t text := format('leaseq.messages_g%s', n);
    tuning text;
    grant_sql text;
BEGIN
    EXECUTE format('CREATE TABLE %s (LIKE leaseq.messages_g0 INCLUDING DEFAULTS '
                   'INCLUDING CONSTRAINTS INCLUDING INDEXES INCLUDING STORAGE)', t);
    SELECT string_agg(o, ', ') INTO tuning
    FROM pg_class AS c, unnest(c.reloptions) AS o
    WHERE c.oid = 'leaseq.messages_g0'::regclass AND o NOT LIKE 'autovacuum_enabled=%';
    IF tuning IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %s SET (%s)', t, tuning);
    END IF;
    EXECUTE format('ALTER TABLE %s ALTER COLUMN generation SET DEFAULT %s', t, n);
    EXECUTE format('ALTER TABLE %s ADD FOREIGN KEY (queue_id) '
                   'REFERENCES leaseq.queues (id) ON DELETE CASCADE', t);
    EXECUTE format('ALTER TABLE %s ADD FOREIGN KEY (dead_letter_source_id) '
                   'REFERENCES leaseq.queues (id) ON DELETE SET NULL', t);
    FOR grant_sql IN
        SELECT format('GRANT %s ON %s TO %s', g.privilege_type, t,
                      CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC'
                           ELSE quote_ident(g.grantee) END)
        FROM information_schema.role_table_grants AS g
        WHERE g.table_schema = 'leaseq' AND g.table_name = 'messages_g0'
          AND g.grantee <> g.grantor
    LOOP
        EXECUTE grant_sql;
    END LOOP;
    EXECUTE format('ALTER TABLE leaseq.messages ATTACH PARTITION %s FOR VALUES IN (%s)', t, n);
    INSERT INTO leaseq.generations (generation, state) VALUES (n, 'spare');
END
$$
"""

_PARENT_DEFAULT = f"""
DO $$
BEGIN
    SET LOCAL lock_timeout = '{LOCK_WAIT}';
    ALTER TABLE ONLY leaseq.messages
        ALTER COLUMN generation SET DEFAULT leaseq.live_generation();
END
$$
"""

_SECOND = f"""
DO $$
BEGIN
    SET LOCAL lock_timeout = '{LOCK_WAIT}';
    IF to_regclass('leaseq.messages_g1') IS NULL THEN
        PERFORM leaseq.make_generation(CAST(1 AS smallint));
    END IF;
END
$$
"""

# Every message back into generation 0, every other generation detached and
# dropped, under one lock on the parent.
_DOWN = f"""
DO $$
DECLARE
    g smallint;
    columns text;
BEGIN
    SET LOCAL lock_timeout = '{LOCK_WAIT}';
    LOCK TABLE leaseq.messages IN ACCESS EXCLUSIVE MODE;
    SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) INTO columns
    FROM pg_attribute
    WHERE attrelid = 'leaseq.messages'::regclass AND attnum > 0 AND NOT attisdropped
      AND attname <> 'generation';
    EXECUTE format('WITH gone AS (DELETE FROM leaseq.messages WHERE generation <> 0 '
                   'RETURNING %1$s) INSERT INTO leaseq.messages_g0 (%1$s) '
                   'SELECT %1$s FROM gone', columns);
    FOR g IN SELECT generation FROM leaseq.generations WHERE generation <> 0 LOOP
        EXECUTE format('ALTER TABLE leaseq.messages DETACH PARTITION leaseq.messages_g%s', g);
        EXECUTE format('DROP TABLE leaseq.messages_g%s', g);
    END LOOP;
    ALTER TABLE ONLY leaseq.messages ALTER COLUMN generation SET DEFAULT 0;
    ALTER TABLE leaseq.messages_g0 RESET (autovacuum_enabled);
END
$$
"""


def _retried(sql: str) -> None:
    retried(op.get_bind(), sql, table="leaseq.messages", revision=revision)


def upgrade() -> None:
    with op.get_context().autocommit_block():
        # One statement at a time (the driver prepares each): they end a line
        # with ";" and are followed by a blank one.
        for statement in _TABLES.split(";\n\n"):
            if statement.strip():
                op.execute(statement)
        op.execute(_MAKE_GENERATION)
        _retried(_PARENT_DEFAULT)
        _retried(_SECOND)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        _retried(_DOWN)
        op.execute("DROP FUNCTION leaseq.make_generation(smallint)")
        op.execute("DROP FUNCTION leaseq.live_generation()")
        op.execute("DROP SEQUENCE leaseq.live_generation_seq")
        op.execute("DROP TABLE leaseq.rotation, leaseq.generations")
