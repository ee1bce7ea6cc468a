"""Messages past their queue's retention are never delivered, whatever their
receive count, and the background task deletes them."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
from conftest import AppClient
from support import make_queue, receive, send

AGE = ("UPDATE leaseq.messages SET sent_at = sent_at - make_interval(secs => $2) "
       "WHERE message_id = $1")


async def test_expired_messages_are_never_delivered(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, message_retention=60, visibility_timeout=0)
    old = await send(client, queue, "old")
    fresh = await send(client, queue, "fresh")
    # Receive the old one a few times (visibility_timeout 0: visible again at once).
    for _ in range(3):
        await receive(client, queue, max=10)
    # Age it past the retention on the database clock.
    await db.execute(AGE, old, 61)
    got = await receive(client, queue, max=10)
    assert [m["message_id"] for m in got] == [fresh]
    stats = (await client.get(f"/v1/queues/{queue}")).json()["stats"]
    assert stats["visible"] == 1
    assert stats["oldest_age_seconds"] < 60


async def test_the_background_sweeper_deletes_expired_messages(
    app_factory: AppClient, db: asyncpg.Connection
) -> None:
    client = await app_factory(retention_sweep_seconds=0.05)
    queue = await make_queue(client, message_retention=60, visibility_timeout=600)
    kept = await send(client, queue, "kept")
    in_flight = await send(client, queue, "in flight")
    plain = await send(client, queue, "plain")
    await receive(client, queue, max=10)  # all three in flight now
    await db.execute(AGE, in_flight, 3600)
    await db.execute(AGE, plain, 61)
    await db.execute("UPDATE leaseq.messages SET receive_count = 50 WHERE message_id = $1",
                     in_flight)

    swept: asyncio.Event = client.app.state.swept  # type: ignore[attr-defined]
    async with asyncio.timeout(10):
        while await db.fetchval("SELECT count(*) FROM leaseq.messages") > 1:
            swept.clear()
            await swept.wait()
    remaining = await db.fetchval("SELECT message_id::text FROM leaseq.messages")
    assert remaining == kept
