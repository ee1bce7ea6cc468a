"""The FIFO claim on a large backlog: one statement that reads group rows and the
first messages of a few groups, never the backlog (docs/decisions.md shows the plan)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import httpx
from support import make_queue, positional

from app.queue.grouped import Take, fifo_claim_params
from app.queue.models import Queue, QueueAttributes

MESSAGES = 100_000
GROUPS = 10_000


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", ()):
        found.extend(_nodes(child))
    return found


async def test_the_fifo_claim_reads_a_few_groups_of_a_large_backlog(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    await make_queue(client, "big.fifo", fifo=True)
    queue_id = await db.fetchval("SELECT id FROM leaseq.queues WHERE name = 'big.fifo'")
    await db.execute(
        "INSERT INTO leaseq.messages (queue_id, body, visible_at, group_id, sequence_number) "
        "SELECT $1, 'x', now(), 'g' || (n % $3), nextval('leaseq.message_sequence') "
        "FROM generate_series(1, $2) AS n",
        queue_id, MESSAGES, GROUPS,
    )
    await db.execute(
        "INSERT INTO leaseq.message_groups (queue_id, group_id, visible_at) "
        "SELECT $1, 'g' || n, now() - n * interval '1 ms' FROM generate_series(0, $2 - 1) AS n",
        queue_id, GROUPS,
    )
    await db.execute("ANALYZE leaseq.messages")
    await db.execute("ANALYZE leaseq.message_groups")
    queue = Queue(id=queue_id, name="big.fifo", attributes=QueueAttributes(
        visibility_timeout=30, message_retention=345600, delay=0, receive_wait=0,
        max_message_bytes=1048576, fifo=True,
    ), created_at=None, updated_at=None)  # type: ignore[arg-type]
    # Sixteen receivers of ten, as group commit gathers them under load.
    params = fifo_claim_params(queue, 30, [Take(10) for _ in range(16)])
    sql, args = positional("claim_fifo_messages", params)
    tx = db.transaction()
    await tx.start()
    try:
        (row,) = await db.fetch(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *args)
        text_plan = await db.fetch(f"EXPLAIN {sql}", *args)
    finally:
        await tx.rollback()
    (explained,) = json.loads(row[0])
    nodes = _nodes(explained["Plan"])
    scans = [n for n in nodes if n.get("Relation Name") in ("messages", "message_groups")]
    text = "\n".join(r[0] for r in text_plan)
    assert not any(n["Node Type"] == "Seq Scan" for n in scans), text
    assert any(n.get("Index Name") == "messages_group_order" for n in scans), text
    assert any(n.get("Index Name") == "message_groups_claim" for n in scans), text
    # What the claim read of messages: at most ten rows of each group it locked
    # (16 + 10 + 9 = 35 groups), not the 100,000 of the backlog.
    window = [n for n in scans if n.get("Index Name") == "messages_group_order"]
    read = sum(n["Actual Rows"] * n["Actual Loops"] for n in window)
    assert read <= 10 * params["lock_groups"], read
    # And what it claimed: 16 whole groups of ten (each receiver one group,
    # the last receiver's ten from its first group).
    claimed = await _claimed(db, sql, args)
    assert claimed == 16 * 10
    # Of the 10,000 groups' rows, those it locked (and looked up again by key).
    groups_read = sum(
        n["Actual Rows"] * n["Actual Loops"] for n in scans
        if n.get("Relation Name") == "message_groups"
    )
    assert groups_read <= 4 * params["lock_groups"], groups_read


async def _claimed(db: asyncpg.Connection, sql: str, args: list[Any]) -> int:
    tx = db.transaction()
    await tx.start()
    try:
        rows = await db.fetch(sql, *args)
    finally:
        await tx.rollback()
    return sum(1 for r in rows if r["id"] is not None)
