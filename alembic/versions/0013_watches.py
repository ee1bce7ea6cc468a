"""The SQL API announces a send only while a service has a receiver waiting on
the queue, and costs PostgreSQL less a call.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03

A NOTIFY serialises the commits of every transaction that issued one (each
holds a database-wide lock from just before its commit record until its WAL
flush is done), so in callers' own transactions, a commit each, it halved the
SQL API's send rate (docs/performance.md, issue 28). Nobody needs the notice
unless a long poll is parked on the queue, and a parked long poll's process
says so: a row in `leaseq.watches` (app/queue/watches.py).

A sender takes a shared advisory lock on the queue, then looks for a watch; a
process that registers a watch commits the row, then takes the same lock
exclusively once (a fence) before its receiver looks at the queue. A sender
that looked before the row existed therefore ended before that look, and its
message is seen by it; every later sender sees the row and notifies. Under
REPEATABLE READ or SERIALIZABLE a sender's snapshot may predate the row, so
such a sender always notifies.

The functions of 0012 are kept as they are, with every `pg_notify(` in them
made `leaseq.announce(` (same arguments): this migration rewrites them from
their stored definitions, and downgrade() turns them back.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WATCH_LOCK = 1819375457
"""The advisory lock class of watches (pg_advisory_xact_lock(WATCH_LOCK, queue));
app/queue/watches.py takes it too."""

# The functions of 0012 that announce, and how many times each does.
_ANNOUNCING = {
    "leaseq.send_fifo(leaseq.queues, text, jsonb, text, text)": 1,
    "leaseq.send_batch(text, text[], jsonb[], integer[], text[], text[])": 1,
    "leaseq.send(text, text, jsonb, integer, text, text)": 1,
    "leaseq.delete(text, text)": 1,
    "leaseq.change_visibility(text, text, integer)": 1,
}

_CREATE = [
    # Unlogged: a watch lives as long as the process that holds it, and after a
    # crash or a failover the services register theirs again when their LISTEN
    # connections come back. `until` lapses a watch whose process died.
    """
    CREATE UNLOGGED TABLE leaseq.watches (
        queue_id bigint NOT NULL,
        watcher  text NOT NULL,
        until    timestamptz NOT NULL,
        PRIMARY KEY (queue_id, watcher)
    )
    """,
    f"""
    CREATE FUNCTION leaseq.announce(channel text, payload text) RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
    DECLARE
        queue bigint := split_part(payload, ':', 1)::bigint;
    BEGIN
        IF current_setting('transaction_isolation') = 'read committed' THEN
            PERFORM pg_advisory_xact_lock_shared({WATCH_LOCK}, (queue % 2147483648)::integer);
            IF NOT EXISTS (SELECT 1 FROM leaseq.watches AS w
                           WHERE w.queue_id = queue
                             AND w.until > statement_timestamp()) THEN
                RETURN;
            END IF;
        END IF;
        PERFORM pg_notify(channel, payload);
    END
    $$
    """,
    "REVOKE EXECUTE ON FUNCTION leaseq.announce(text, text) FROM PUBLIC",
    # format() is STABLE, and a SQL function declared IMMUTABLE around a
    # STABLE body is never inlined: each call of the notice was parsed and
    # planned again, about 50 µs of PostgreSQL CPU a send in a caller's
    # transaction (pgbench, 4 clients, PostgreSQL 15).
    "ALTER FUNCTION leaseq.notice(bigint, bigint, double precision) STABLE",
    # 0012's rule, cheaper: the owner's members and superusers (one
    # pg_has_role, which holds for superusers) before any table is read, where
    # 0012 joined pg_roles first; about 20 µs less a call. It runs inside the
    # SECURITY DEFINER functions, where current_user is their owner: the role
    # that ran the migrations, which leaseq runs as. A grant to a role that no
    # longer exists holds for no one (to_regrole gives NULL).
    """
    CREATE OR REPLACE FUNCTION leaseq.allowed(action text, queue text) RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $$
    DECLARE
        who text := leaseq.caller();
    BEGIN
        IF pg_catalog.pg_has_role(who, current_user, 'USAGE') THEN
            RETURN true;
        END IF;
        RETURN EXISTS (
            SELECT 1
            FROM leaseq.grants AS g
            WHERE (g.action = allowed.action OR g.action = 'admin')
              AND allowed.queue LIKE g.like_pattern
              AND pg_catalog.pg_has_role(
                      who, pg_catalog.to_regrole(pg_catalog.quote_ident(g.role)), 'USAGE'));
    END
    $$
    """,
]


def _rewrite(old: str, new: str) -> None:
    """Each announcing function, recreated from its stored definition with
    `old` made `new`; CREATE OR REPLACE keeps its owner and grants."""
    bind = op.get_bind()
    for function, expected in _ANNOUNCING.items():
        definition = bind.exec_driver_sql(
            f"SELECT pg_get_functiondef('{function}'::regprocedure)").scalar_one()
        found = definition.count(old)
        if found != expected:
            raise RuntimeError(
                f"{function}: expected {expected} {old!r} in its definition, found {found}; "
                f"was it changed outside the migrations?")
        bind.exec_driver_sql(definition.replace(old, new))


def upgrade() -> None:
    for statement in _CREATE:
        op.execute(statement)
    _rewrite("pg_notify(", "leaseq.announce(")


def downgrade() -> None:
    # leaseq.allowed keeps this revision's body: it answers as 0012's does.
    op.execute("ALTER FUNCTION leaseq.notice(bigint, bigint, double precision) IMMUTABLE")
    _rewrite("leaseq.announce(", "pg_notify(")
    op.execute("DROP FUNCTION leaseq.announce(text, text)")
    op.execute("DROP TABLE leaseq.watches")
