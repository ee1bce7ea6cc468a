"""The named statements of queries.sql: every one is used, and the claim uses its index."""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg
import httpx
from support import make_queue, positional

from app.queue.sql import SOURCE


def test_every_named_query_is_used() -> None:
    code = "\n".join(p.read_text() for p in Path("app").rglob("*.py"))
    used = set(re.findall(r"\bQ\.(\w+)", code))
    used |= set(re.findall(r"\bfetch\(\s*conn,\s*\"(\w+)\"", code))  # the driver path
    assert set(SOURCE) == used


async def test_the_claim_uses_the_claim_index_on_a_large_queue(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    await make_queue(client, "big")
    queue_id = await db.fetchval("SELECT id FROM queues WHERE name = 'big'")
    await db.execute(
        "INSERT INTO messages (queue_id, body, visible_at) "
        "SELECT $1, 'x', now() + (g % 100) * interval '1 second' FROM generate_series(1, 20000) g",
        queue_id,
    )
    await db.execute("ANALYZE messages")
    sql, args = positional("claim_messages", {
        "queue_id": queue_id, "visibility_timeout": 30, "retention": 345600, "max": 10,
        "dead_letter_queue_id": None, "max_receive_count": None,
    })
    async with db.transaction():
        plan = await db.fetch(f"EXPLAIN {sql}", *args)
    text = "\n".join(row[0] for row in plan)
    assert "messages_claim" in text, text
    assert "Seq Scan on messages" not in text, text
