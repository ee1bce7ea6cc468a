"""Alembic environment: runs migrations over asyncpg, URL from leaseq's settings."""

import asyncio

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from alembic import context
from app.config import Settings
from app.db.engine import engine_for
from app.db.migrate import LOCK_NOT_AVAILABLE, MIGRATION_LOCK

SCHEMA = "leaseq"

# A database migrated before 0011 keeps its version table in `public`, beside
# leaseq's tables; from 0011 on it lives in the `leaseq` schema with them. It
# moves there first, so Alembic finds the revision the database is at; only
# leaseq's own (the messages table with its fencing tokens beside it), never
# an application's `public.alembic_version`.
_ADOPT_VERSION_TABLE = """
DO $$
BEGIN
    IF to_regclass('leaseq.alembic_version') IS NULL
       AND to_regclass('public.alembic_version') IS NOT NULL
       AND EXISTS (SELECT 1 FROM information_schema.columns
                   WHERE table_schema = 'public' AND table_name = 'messages'
                     AND column_name = 'fencing_token') THEN
        ALTER TABLE public.alembic_version SET SCHEMA leaseq;
    END IF;
END
$$
"""


def _prepare(connection: Connection) -> None:
    """The schema, the version table in it, and a search_path for the
    migrations: what they create unqualified lands in `leaseq`, and the migrations
    before 0011 still find the tables of a database that has them in `public`."""
    # Looked up first: CREATE SCHEMA IF NOT EXISTS needs CREATE on the database
    # even when the schema is there (one an administrator made for leaseq).
    if not connection.execute(text(f"SELECT to_regnamespace('{SCHEMA}') IS NOT NULL")).scalar():
        connection.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    connection.execute(text(_ADOPT_VERSION_TABLE))
    connection.execute(text(f"SET search_path = {SCHEMA}, public"))


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection, target_metadata=None, transaction_per_migration=True,
        version_table_schema=SCHEMA,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _take_lock(connection: AsyncConnection, lock: dict[str, int]) -> None:
    """The migration lock, waited for half a second at a time. A migration that
    builds an index CONCURRENTLY (0021) waits for every transaction running when
    it starts to end, and one waiting for this lock all along would wait for it
    in turn: a deadlock. Between two tries, nothing of this session runs."""
    while True:
        try:
            await connection.execute(text("SET LOCAL lock_timeout = '500ms'"))
            await connection.execute(text("SELECT pg_advisory_lock(:key)"), lock)
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
            await connection.rollback()
            continue
        await connection.commit()
        return


async def _run_async(settings: Settings, url: str) -> None:
    engine = engine_for(settings, pool_size=1, url=url)
    try:
        async with engine.connect() as connection:
            # Session-level, and committed before the migrations start: each
            # still runs in its own transaction, all of them under the lock.
            lock = {"key": MIGRATION_LOCK}
            await _take_lock(connection, lock)
            try:
                # Committed, so the search_path is the session's for every migration.
                await connection.run_sync(_prepare)
                await connection.commit()
                await connection.run_sync(_run)
                await connection.commit()
            finally:
                # A failed migration leaves its transaction aborted: end it first.
                await connection.rollback()
                await connection.execute(text("SELECT pg_advisory_unlock(:key)"), lock)
                await connection.commit()
    finally:
        await engine.dispose()


def main() -> None:
    # An entry point of its own (the `alembic` command, or app/db/migrate.py
    # through Alembic's API): it reads the settings, as app/main.py does.
    settings = Settings()
    url = context.config.attributes.get("database_url") or settings.database_url
    if url is None:
        raise RuntimeError("no DATABASE_URL: run through `leaseq serve` or set DATABASE_URL")
    if context.is_offline_mode():
        context.configure(url=url, literal_binds=True, version_table_schema=SCHEMA)
        with context.begin_transaction():
            context.run_migrations()
        return
    asyncio.run(_run_async(settings, url))


main()
