"""Alembic owns the schema: it upgrades an empty database, downgrades to nothing,
and upgrades again."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from alembic.script import ScriptDirectory
from conftest import with_database
from processes import LEASEQ, service_env
from support import eventually

from alembic import command
from app.db.engine import plain_url
from app.db.migrate import MIGRATION_LOCK, alembic_config, upgrade


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


SCHEMA = {
    "alembic_version", "queues", "messages", "redrive_tasks", "api_keys", "receipt_keys",
    "message_groups", "message_deduplication", "receive_attempts",
}


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


@pytest.mark.e2e
async def test_replicas_migrating_together_take_turns_on_the_advisory_lock(
    empty_database: str,
) -> None:
    # The test holds the lock while three replicas start migrating: all three
    # queue on it, then race for it the moment it is released.
    holder = await asyncpg.connect(plain_url(empty_database))
    replicas: list[asyncio.subprocess.Process] = []
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
        for _ in range(3):
            replicas.append(await asyncio.create_subprocess_exec(
                LEASEQ, "migrate", env=service_env(empty_database),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            ))

        async def all_queued() -> bool:
            exited = [r.returncode for r in replicas if r.returncode is not None]
            assert not exited, "a replica finished without waiting for the lock"
            waiting = await holder.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 1",
                MIGRATION_LOCK >> 32, MIGRATION_LOCK & 0xFFFF_FFFF,
            )
            return bool(waiting == len(replicas))

        await eventually(all_queued, seconds=60)
        assert await _tables(empty_database) == set()
        await holder.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)
        outputs = await asyncio.wait_for(
            asyncio.gather(*(r.communicate() for r in replicas)), timeout=120
        )
    finally:
        for replica in replicas:
            if replica.returncode is None:
                replica.kill()
                await replica.wait()
        await holder.close()
    assert [r.returncode for r in replicas] == [0] * len(replicas), outputs
    assert SCHEMA <= await _tables(empty_database)
    head = ScriptDirectory.from_config(alembic_config(empty_database)).get_current_head()
    conn = await asyncpg.connect(plain_url(empty_database))
    try:
        assert await conn.fetch("SELECT version_num FROM alembic_version") == [(head,)]
    finally:
        await conn.close()
