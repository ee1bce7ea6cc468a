"""Alembic environment: runs migrations over asyncpg, URL from leaseq's settings."""

import asyncio

from sqlalchemy import text
from sqlalchemy.engine import Connection

from alembic import context
from app.config import Settings
from app.db.engine import engine_for
from app.db.migrate import MIGRATION_LOCK


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=None, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


async def _run_async(settings: Settings, url: str) -> None:
    engine = engine_for(settings, pool_size=1, url=url)
    try:
        async with engine.connect() as connection:
            # Session-level, and committed before the migrations start: each
            # still runs in its own transaction, all of them under the lock.
            lock = {"key": MIGRATION_LOCK}
            await connection.execute(text("SELECT pg_advisory_lock(:key)"), lock)
            await connection.commit()
            try:
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
        context.configure(url=url, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    asyncio.run(_run_async(settings, url))


main()
