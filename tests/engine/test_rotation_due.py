"""When the rotation of the messages' generations is due (app/queue/rotation.py):
once the live generation has left behind LEASEQ_ROTATE_AFTER row versions that no
VACUUM may remove yet, those settled since the oldest transaction the cleanup
horizon keeps. A clean cycle past the threshold rotates nothing (VACUUM keeps its
history short, and carrying a large backlog forward would cost the cycle for
nothing); the same cycle while a transaction holds the horizon rotates."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
from conftest import AppClient
from support import eventually, make_queue, receive

from app.db.engine import plain_url
from app.queue.rotation import held_since

# -- which history is held --------------------------------------------------------

READINGS = [(100, 0), (200, 50), (300, 120), (400, 400)]
"""(next transaction ID, versions settled by then), one reading a step."""


def test_a_horizon_that_has_passed_every_reading_holds_what_was_settled_since_the_last() -> None:
    assert held_since(READINGS, 430, kept_from=400) == 30
    assert held_since(READINGS, 430, kept_from=10_000) == 30


def test_what_was_settled_before_the_last_reading_the_horizon_reached_is_removable() -> None:
    assert held_since(READINGS, 430, kept_from=299) == 430 - 50
    assert held_since(READINGS, 430, kept_from=300) == 430 - 120


def test_a_horizon_older_than_every_reading_holds_everything() -> None:
    assert held_since(READINGS, 430, kept_from=99) == 430
    assert held_since([], 430, kept_from=10_000) == 430


def test_held_history_is_never_negative() -> None:
    assert held_since(READINGS, 300, kept_from=400) == 0


# -- the service ---------------------------------------------------------------------


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json() if response.content else None


async def _cycle(client: httpx.AsyncClient, queue: str, count: int) -> None:
    """`count` messages sent, received and acknowledged: three row versions each
    left behind in the live generation."""
    for _ in range(count // 100):
        _ok(await client.post(f"/v1/queues/{queue}/messages", json={
            "messages": [{"body": "x"} for _ in range(100)]}))
        while batch := await receive(client, queue, max=10):
            for message in batch:
                _ok(await client.delete(
                    f"/v1/queues/{queue}/messages/{message['receipt_handle']}"), 204)


async def _settled(db: asyncpg.Connection) -> int:
    """The live generation's settled history, as the rotation reads it."""
    return int(await db.fetchval(
        "SELECT pg_stat_get_tuples_updated(c.oid) + pg_stat_get_tuples_deleted(c.oid) "
        "- g.settled_before FROM leaseq.rotation AS r "
        "JOIN leaseq.generations AS g ON g.generation = r.live "
        "JOIN pg_class AS c ON c.oid = to_regclass(format('leaseq.messages_g%s', r.live))"))


async def test_only_the_history_a_held_horizon_keeps_makes_a_rotation_due(
    app_factory: AppClient, db: asyncpg.Connection, database_url: str
) -> None:
    client = await app_factory(rotate_after=300)
    rotation: Any = client.app.state.rotation  # type: ignore[attr-defined]
    queue = await make_queue(client, "turnover")
    epoch = await db.fetchval("SELECT epoch FROM leaseq.rotation")

    # Clean: past the threshold, VACUUM may remove all of it; nothing rotates,
    # not even a step taken once the statistics show it all.
    await _cycle(client, queue, 300)

    async def counted() -> bool:
        return await _settled(db) >= 600

    await eventually(counted)
    for _ in range(3):
        await rotation.step()
    assert await db.fetchval("SELECT epoch FROM leaseq.rotation") == epoch
    assert await db.fetchval("SELECT draining FROM leaseq.rotation") is None

    # Held: a report's snapshot stays open while the same cycle runs again;
    # what it settles is kept whatever VACUUM does, and the rotation begins.
    holder = await asyncpg.connect(plain_url(database_url))
    try:
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT 1")
        await _cycle(client, queue, 300)

        async def rotated() -> bool:
            return bool(await db.fetchval("SELECT epoch FROM leaseq.rotation") > epoch)

        await eventually(rotated)
    finally:
        await holder.close()
