"""Alembic owns the schema: it upgrades an empty database, downgrades to nothing,
and upgrades again."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from conftest import with_database

from alembic import command
from app.db.engine import plain_url
from app.db.migrate import alembic_config, upgrade


@pytest.fixture
async def empty_database(server_url: str) -> AsyncIterator[str]:
    name = f"leaseq_m_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(server_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(server_url, name)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


SCHEMA = {"alembic_version", "queues", "messages", "redrive_tasks"}


async def _tables(url: str) -> set[str]:
    conn = await asyncpg.connect(plain_url(url))
    try:
        rows = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        )
        return {row["tablename"] for row in rows}
    finally:
        await conn.close()


async def test_upgrade_downgrade_upgrade(empty_database: str) -> None:
    await asyncio.to_thread(upgrade, empty_database)
    assert await _tables(empty_database) == SCHEMA
    await asyncio.to_thread(command.downgrade, alembic_config(empty_database), "base")
    assert await _tables(empty_database) == {"alembic_version"}
    await asyncio.to_thread(upgrade, empty_database)
    assert await _tables(empty_database) == SCHEMA


async def test_the_messages_table_is_vacuumed_by_dead_tuples_not_by_its_size(
    empty_database: str,
) -> None:
    await asyncio.to_thread(upgrade, empty_database)
    conn = await asyncpg.connect(plain_url(empty_database))
    try:
        options = await conn.fetchval(
            "SELECT reloptions FROM pg_class WHERE relname = 'messages'"
        )
    finally:
        await conn.close()
    assert "autovacuum_vacuum_threshold=2000" in options
    assert "autovacuum_vacuum_cost_delay=0" in options
