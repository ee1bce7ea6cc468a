"""Invariant 1: every deadline comes from the database clock. Skewing the
service's own clock by days, either way, changes nothing it stores or answers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest
import time_machine
from support import make_queue, receive, send


@pytest.mark.parametrize("skew", [timedelta(days=3), timedelta(days=-3)])
async def test_python_clock_skew_changes_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection, skew: timedelta
) -> None:
    queue = await make_queue(client, visibility_timeout=20)
    with time_machine.travel(datetime.now(UTC) + skew, tick=True):
        before = await db.fetchval("SELECT clock_timestamp()")
        await send(client, queue, "now")
        await send(client, queue, "later", delay=1)
        (message,) = await receive(client, queue)
        after = await db.fetchval("SELECT clock_timestamp()")

        sent_at = datetime.fromisoformat(message["sent_at"])
        received_at = datetime.fromisoformat(message["first_received_at"])
        expires = datetime.fromisoformat(message["lease_expires_at"])
        assert before <= sent_at <= received_at <= after
        assert expires - received_at == timedelta(seconds=20)

        beat = await client.patch(
            f"/v1/queues/{queue}/messages/{message['receipt_handle']}/visibility",
            json={"timeout": 90},
        )
        beat_after = await db.fetchval("SELECT clock_timestamp()")
        new_deadline = datetime.fromisoformat(beat.json()["lease_expires_at"])
        assert beat_after < new_deadline <= beat_after + timedelta(seconds=90)

        # The delayed message becomes visible by the database's clock: not at
        # once, and (through a long poll) within a few seconds, whatever the
        # skew says.
        assert [m["body"] for m in await receive(client, queue)] == []
        (later,) = await receive(client, queue, wait=10)
        assert later["body"] == "later"
        later_sent = datetime.fromisoformat(later["sent_at"])
        later_received = datetime.fromisoformat(later["first_received_at"])
        assert later_received - later_sent >= timedelta(seconds=1)

        stats = (await client.get(f"/v1/queues/{queue}")).json()["stats"]
        assert 0 <= stats["oldest_age_seconds"] < 30

    stored = await db.fetch("SELECT sent_at, visible_at FROM leaseq.messages")
    db_now = await db.fetchval("SELECT clock_timestamp()")
    for row in stored:
        assert abs(row["sent_at"] - db_now) < timedelta(minutes=1)
        assert abs(row["visible_at"] - db_now) < timedelta(minutes=2)
