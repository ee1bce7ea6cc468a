"""Sends in callers' own transactions announce themselves only while a service
has a long poll waiting on the queue (app/queue/watches.py, migration 0013):
nothing a waiting receiver needs is ever left unannounced."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from support import (
    make_queue,
    notices_heard,
    parked,
    queue_id_of,
    receive,
    sql_send,
    wait_until,
)

from app.db.engine import plain_url


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """The application's own connections: the caller's transactions."""
    async with asyncpg.create_pool(plain_url(database_url), min_size=1, max_size=4) as made:
        yield made


async def notices_for(db: asyncpg.Connection) -> list[str]:
    """Every notice on the `leaseq` channel from now on, as it arrives."""
    heard: list[str] = []
    await db.add_listener("leaseq", lambda *args: heard.append(args[3]))
    return heard


def about(notices: list[str], queue_id: int) -> list[str]:
    return [n for n in notices if n.startswith(f"{queue_id}:")]


def hub_of(client: httpx.AsyncClient) -> Any:
    return client.app.state.hub  # type: ignore[attr-defined]


async def watch_rows(db: asyncpg.Connection, queue_id: int) -> int:
    return int(await db.fetchval(
        "SELECT count(*) FROM leaseq.watches WHERE queue_id = $1", queue_id))


async def test_a_send_is_announced_only_while_a_receiver_waits(
    client: httpx.AsyncClient, pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client)
    queue_id = await queue_id_of(client, queue)
    notices = await notices_for(db)
    async with pool.acquire() as conn:
        await sql_send(conn, queue, "unannounced")
    await notices_heard(pool)
    assert about(notices, queue_id) == []
    # A long poll that finds a message takes it without watching the queue.
    assert [m["body"] for m in await receive(client, queue, wait=1)] == ["unannounced"]
    assert await watch_rows(db, queue_id) == 0

    waiter = asyncio.create_task(receive(client, queue, wait=20))
    await parked(client, queue)
    assert await watch_rows(db, queue_id) == 1
    metrics = (await client.get("/metrics")).text
    assert "leaseq_watch_fences_total 1.0" in metrics.splitlines()
    async with pool.acquire() as conn:
        await sql_send(conn, queue, "announced")
    assert [m["body"] for m in await asyncio.wait_for(waiter, 20)] == ["announced"]
    await notices_heard(pool)
    assert len(about(notices, queue_id)) == 1


async def test_a_sender_in_repeatable_read_announces_even_unwatched(
    client: httpx.AsyncClient, pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    """Its snapshot may be older than a watch committed before its send."""
    queue = await make_queue(client)
    queue_id = await queue_id_of(client, queue)
    notices = await notices_for(db)
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
        await sql_send(conn, queue, "announced")
    await notices_heard(pool)
    assert len(about(notices, queue_id)) == 1


async def test_a_receiver_arriving_while_a_send_is_uncommitted_gets_it_on_commit(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """The sender looked for a watch before there was one, so its commit
    announces nothing; the watch's fence cannot pass its open transaction, and
    is retried until it can, a receiver looking again each time."""
    queue = await make_queue(client)
    queue_id = await queue_id_of(client, queue)
    hub = hub_of(client)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await sql_send(conn, queue, "late")
        waiter = asyncio.create_task(receive(client, queue, wait=15))
        await parked(client, queue)
        assert queue_id not in hub.watches.watching()
        await tx.commit()
    messages = await asyncio.wait_for(waiter, 15)
    assert [m["body"] for m in messages] == ["late"]
    await wait_until(lambda: queue_id in hub.watches.watching())


async def test_a_lapsed_watch_leaves_no_queue_taken_for_empty(
    client: httpx.AsyncClient, pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    """Once a watch is dropped, sends go unannounced: a long poll must look
    again rather than trust the empty look it made while watching."""
    queue = await make_queue(client)
    queue_id = await queue_id_of(client, queue)
    hub = hub_of(client)
    await db.execute(
        "INSERT INTO leaseq.watches (queue_id, watcher, until) "
        "VALUES ($1, 'a process that died', clock_timestamp() - interval '1 second')",
        queue_id)
    assert await receive(client, queue, wait=1) == []  # looks, watches, finds it empty
    assert queue_id in hub.watches.watching()
    assert hub.quiet_for(queue_id) is not None

    hub.watches.linger_seconds = 0.0
    await hub.watches.sweep()
    assert queue_id not in hub.watches.watching()
    assert hub.quiet_for(queue_id) is None
    assert await watch_rows(db, queue_id) == 0, "the dead process's row stayed"

    notices = await notices_for(db)
    async with pool.acquire() as conn:
        await sql_send(conn, queue, "unannounced")
    await notices_heard(pool)
    assert about(notices, queue_id) == []
    messages = await asyncio.wait_for(receive(client, queue, wait=10), 5)
    assert [m["body"] for m in messages] == ["unannounced"]


async def test_a_watch_in_use_outlives_a_sweep(
    client: httpx.AsyncClient, pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client)
    queue_id = await queue_id_of(client, queue)
    hub = hub_of(client)
    waiter = asyncio.create_task(receive(client, queue, wait=20))
    await parked(client, queue)
    hub.watches.linger_seconds = 0.0
    await hub.watches.sweep()
    assert queue_id in hub.watches.watching()
    assert await watch_rows(db, queue_id) == 1
    async with pool.acquire() as conn:
        await sql_send(conn, queue, "announced")
    assert [m["body"] for m in await asyncio.wait_for(waiter, 20)] == ["announced"]
