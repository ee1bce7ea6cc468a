"""The named statements of queries.sql: every one is used, and the claim uses its index."""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg
import httpx
from support import make_queue

from app.queue.sql import SOURCE


def test_every_named_query_is_used() -> None:
    code = "\n".join(p.read_text() for p in Path("app").rglob("*.py"))
    used = set(re.findall(r"\bQ\.(\w+)", code))
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
    claim = SOURCE["claim_messages"]
    sql = re.sub(r":(\w+)", lambda m: {"queue_id": "$1", "visibility_timeout": "$2",
                                        "retention": "$3", "max": "$4"}[m.group(1)], claim)
    async with db.transaction():
        plan = await db.fetch(f"EXPLAIN {sql}", queue_id, 30, 345600, 10)
    text = "\n".join(row[0] for row in plan)
    assert "messages_claim" in text, text
    assert "Seq Scan on messages" not in text, text
