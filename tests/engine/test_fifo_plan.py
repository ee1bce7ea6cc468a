"""The FIFO claim on a large backlog: one statement that reads the groups' turns
due and the first messages of a few groups, never the backlog (docs/decisions.md
shows the plan)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import httpx
from support import make_queue, positional

from app.queue.grouped import Take
from app.queue.grouped_fifo import fifo_claim_params
from app.queue.models import Queue, QueueAttributes

MESSAGES = 100_000
GROUPS = 10_000


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", ()):
        found.extend(_nodes(child))
    return found


def _fifo(queue_id: int, name: str) -> Queue:
    """The queue as the claim's parameters need it: FIFO, no delay, no redrive."""
    return Queue(id=queue_id, name=name, attributes=QueueAttributes(
        visibility_timeout=30, message_retention=345600, delay=0, receive_wait=0,
        max_message_bytes=1048576, fifo=True,
    ), created_at=None, updated_at=None)  # type: ignore[arg-type]


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
        "INSERT INTO leaseq.turns (queue_id, tenant, at) "
        "SELECT $1, 'g' || n, now() - n * interval '1 ms' FROM generate_series(0, $2 - 1) AS n",
        queue_id, GROUPS,
    )
    # Each group's head, as the claims that read the groups before learnt them.
    await db.execute(
        "INSERT INTO leaseq.group_heads (queue_id, group_id, since) "
        "SELECT $1, group_id, min(sequence_number) FROM leaseq.messages "
        "WHERE queue_id = $1 GROUP BY group_id", queue_id)
    await db.execute("ANALYZE leaseq.messages")
    await db.execute("ANALYZE leaseq.turns")
    await db.execute("ANALYZE leaseq.group_heads")
    queue = _fifo(queue_id, "big.fifo")
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
    scans = [n for n in nodes
             if n.get("Relation Name") in ("messages_g0", "turns", "group_heads")]
    text = "\n".join(r[0] for r in text_plan)
    assert not any(n["Node Type"] == "Seq Scan" for n in scans), text
    assert any(n.get("Index Name") == "messages_group_order" for n in scans), text
    assert any(n.get("Index Name") == "turns_walk" for n in scans), text
    # What the claim read of messages: at most ten rows of each group it locked
    # (sixteen tens and ten more: 170 groups), not the 100,000 of the backlog.
    window = [n for n in scans if n.get("Index Name") == "messages_group_order"]
    read = sum(n["Actual Rows"] * n["Actual Loops"] for n in window)
    assert read <= 10 * params["lock_groups"], read
    # And what it claimed: 16 whole groups of ten (each receiver's first
    # group fills its batch).
    claimed = await _claimed(db, sql, args)
    assert claimed == 16 * 10
    # Of the 10,000 groups' turns, those due first (twice as many turns as
    # groups it may look at), each read again to be deleted, and the
    # floor's first.
    groups_read = sum(
        n["Actual Rows"] * n["Actual Loops"] for n in scans
        if n.get("Relation Name") in ("turns", "group_heads")
    )
    assert groups_read <= 6 * params["lock_groups"], (groups_read, [
        (n["Node Type"], n.get("Index Name"), n["Actual Rows"], n["Actual Loops"])
        for n in scans if n.get("Relation Name") in ("turns", "group_heads")])


async def _claimed(db: asyncpg.Connection, sql: str, args: list[Any]) -> int:
    tx = db.transaction()
    await tx.start()
    try:
        rows = await db.fetch(sql, *args)
    finally:
        await tx.rollback()
    return sum(1 for r in rows if r["id"] is not None)


async def _fifo_backlog(client: httpx.AsyncClient, db: asyncpg.Connection, name: str,
                        groups: int, per_group: int) -> Queue:
    """A FIFO queue of `groups` groups of `per_group` visible messages each,
    group gN older than gN+1, written straight into the tables."""
    await make_queue(client, name, fifo=True)
    queue_id = await db.fetchval("SELECT id FROM leaseq.queues WHERE name = $1", name)
    await db.execute(
        "INSERT INTO leaseq.messages (queue_id, body, visible_at, group_id, sequence_number) "
        "SELECT $1, 'g' || g || '-' || n, now(), 'g' || g, nextval('leaseq.message_sequence') "
        "FROM generate_series(1, $2) AS g, generate_series(1, $3) AS n ORDER BY g, n",
        queue_id, groups, per_group,
    )
    await db.execute(
        "INSERT INTO leaseq.turns (queue_id, tenant, at) "
        "SELECT $1, 'g' || g, now() - interval '1 minute' + g * interval '1 ms' "
        "FROM generate_series(1, $2) AS g",
        queue_id, groups,
    )
    return _fifo(queue_id, name)


async def _dealt(db: asyncpg.Connection, queue: Queue, wants: list[int]) -> list[list[str]]:
    """The bodies each receiver of one claim statement got, in the order given."""
    params = fifo_claim_params(queue, 30, [Take(n) for n in wants])
    sql, args = positional("claim_fifo_messages", params)
    rows = await db.fetch(sql, *args)
    ids = [r["id"] for r in rows if r["id"] is not None]
    bodies = dict(await db.fetch(
        "SELECT id, body FROM leaseq.messages WHERE id = ANY($1)", ids))
    ordered = sorted((r for r in rows if r["id"] is not None),
                     key=lambda r: (r["group_rank"], r["sequence_number"]))
    return [[bodies[r["id"]] for r in ordered if r["receiver"] == n]
            for n in range(1, len(wants) + 1)]


async def test_one_statement_deals_many_small_groups_to_every_receiver(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """Receivers gathered into one claim each fill their batch from several
    groups, dealt oldest first in turn, as a lone receive does: with 40 groups
    of one message, three receivers of 3, 10 and 10 take 23 messages."""
    queue = await _fifo_backlog(client, db, "small.fifo", groups=40, per_group=1)
    first, second, third = await _dealt(db, queue, [3, 10, 10])
    assert first == ["g1-1", "g4-1", "g7-1"]
    assert second == [f"g{g}-1" for g in range(2, 31, 3)]
    assert third == [f"g{g}-1" for g in range(3, 31, 3)]
    # The groups left over are claimable by the next statement, oldest first.
    (rest,) = await _dealt(db, queue, [10])
    assert rest == ["g10-1", "g13-1", "g16-1", "g19-1", "g22-1", "g25-1", "g28-1",
                    "g31-1", "g32-1", "g33-1"]


async def test_a_group_dealt_to_a_receiver_is_taken_from_its_head_and_never_split(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """Groups of four to two receivers of ten: each takes two whole groups and
    the head of a third; no group is split between them, and what is left of a
    group partly taken stays behind its messages in flight."""
    queue = await _fifo_backlog(client, db, "big-groups.fifo", groups=8, per_group=4)
    first, second = await _dealt(db, queue, [10, 10])
    assert first == [f"g{g}-{n}" for g in (1, 3) for n in range(1, 5)] + ["g5-1", "g5-2"]
    assert second == [f"g{g}-{n}" for g in (2, 4) for n in range(1, 5)] + ["g6-1", "g6-2"]
    (rest,) = await _dealt(db, queue, [10])
    assert rest == [f"g{g}-{n}" for g in (7, 8) for n in range(1, 5)]
