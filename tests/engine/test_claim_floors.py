"""A standard queue's claims start from floors (app/queue/floors.py): with a
transaction holding back the cleanup horizon and a long history settled, a
claim reads a bounded number of buffers, and no message is ever left below a
floor, not even one whose sending statement began long before it wrote."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import httpx
from support import eventually, make_queue, positional, queue_id_of, receive, send

from app.queue.floors import Floors

HISTORY = 200_000


def _floors(client: httpx.AsyncClient, queue: str) -> Floors:
    app: Any = client.app  # type: ignore[attr-defined]
    cached = app.state.service.queues.cached(queue)
    assert cached is not None, "the queue was read through the catalog"
    floors: Floors = cached.floors
    return floors


async def _cycle(client: httpx.AsyncClient, queue: str, n: int = 1) -> None:
    """n sends, each received and acknowledged. Each receive asks for two and
    gets one: a claim that comes back short makes the next one read both ranges
    and report (floors.py), so every claim after the first reports."""
    for i in range(n):
        await send(client, queue, f"cycle-{i}")
        (message,) = await receive(client, queue, max=2)
        deleted = await client.delete(
            f"/v1/queues/{queue}/messages/{message['receipt_handle']}")
        assert deleted.status_code == 204, deleted.text


async def _claim_buffers(db: asyncpg.Connection, queue_id: int, floors: dict[str, Any],
                         statement: str = "claim_ready_messages") -> int:
    """Shared buffers one claim reads (EXPLAIN ANALYZE runs it)."""
    sql, args = positional(statement, {
        "queue_id": queue_id, "visibility_timeout": 30, "retention": 345600, "max": 10,
        "ack_ids": [], **floors,
    })
    (plan,) = json.loads(await db.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}",
                                           *args))
    top = plan["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


async def test_a_claim_reads_no_history_while_the_horizon_is_held(
    client: httpx.AsyncClient, db: asyncpg.Connection, database_url: str,
) -> None:
    queue = await make_queue(client, "history")
    queue_id = await queue_id_of(client, queue)
    holder = await asyncpg.connect(database_url)
    try:
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT 1")
        # A settled history, written as the cycle writes it: each message sent,
        # claimed (a lease, one ended), acknowledged; every version kept.
        await db.execute(
            "INSERT INTO leaseq.messages (queue_id, body, visible_at, sent_at) "
            "SELECT $1, 'old', statement_timestamp() - interval '1 minute', "
            "       statement_timestamp() - interval '1 minute' "
            "FROM generate_series(1, $2)", queue_id, HISTORY)
        await db.execute(
            "UPDATE leaseq.messages SET leased = true, claim_token = gen_random_uuid(), "
            "fencing_token = 0, visible_at = statement_timestamp() - interval '1 second' "
            "WHERE queue_id = $1", queue_id)
        await db.execute("DELETE FROM leaseq.messages WHERE queue_id = $1", queue_id)
        dead = await db.fetchval(
            "SELECT count(*) FROM leaseq.messages WHERE queue_id = $1", queue_id)
        assert dead == 0
        # The service's claims learn where the queue's claimable messages begin.
        await _cycle(client, queue, 3)
        floors = _floors(client, queue)
        assert floors.ready is not None and floors.lease is not None
        for body in ("a", "b", "c"):
            await send(client, queue, body)
        floored = await _claim_buffers(db, queue_id, floors.params())
        waiting = await _claim_buffers(
            db, queue_id, floors.params(), "claim_ready_waiting_messages")
        from_start = await _claim_buffers(
            db, queue_id, {"ready_floor": None, "lease_floor": None})
    finally:
        await holder.close()
    # Read from the start, the claim walks the history's index entries and
    # their row versions; from the floors, a few pages whatever the history.
    assert from_start > 5_000, from_start
    assert floored < 100, (floored, from_start)
    assert waiting < 100, (waiting, from_start)


async def test_a_message_whose_statement_began_before_the_floor_is_still_claimed(
    client: httpx.AsyncClient, db: asyncpg.Connection, database_url: str,
) -> None:
    """A caller's statement that sends through the SQL API half a second after
    it began, in a transaction committed later still, while the service's claims
    move their floors past the statement's start: the message is stored with the
    moment of its write, above every floor, and the next receive gets it."""
    queue = await make_queue(client, "late")
    await _cycle(client, queue, 2)
    caller = await asyncpg.connect(database_url)
    try:
        await caller.execute("BEGIN")
        began = await caller.fetchval("SELECT now()")
        sending = asyncio.ensure_future(caller.fetchval(
            "SELECT leaseq.send($1, 'late') FROM (SELECT pg_sleep(0.6)) AS first_wait",
            queue))
        while not sending.done():
            await _cycle(client, queue)
        await sending
        await _cycle(client, queue, 3)
        floors = _floors(client, queue)
        assert floors.ready is not None and floors.ready > began, (floors.ready, began)
        await caller.execute("COMMIT")
    finally:
        await caller.close()
    got = await receive(client, queue, max=10)
    assert [m["body"] for m in got] == ["late"]


async def test_a_message_sent_in_a_transaction_open_across_claims_is_claimed_at_its_commit(
    client: httpx.AsyncClient, db: asyncpg.Connection, database_url: str,
) -> None:
    """A caller's transaction sends through the SQL API (it holds its ID from
    then on) and stays open while the service's receives find the queue empty;
    no other transaction ends meanwhile, so their snapshots' xmax stays at or
    below the caller's ID. The floors must wait for that ID to end, whatever
    the snapshots' bounds say, and the message is received once committed."""
    queue = await make_queue(client, "open-across")
    await _cycle(client, queue, 3)
    floors = _floors(client, queue)
    assert floors.ready is not None
    caller = await asyncpg.connect(database_url)
    try:
        await caller.execute("BEGIN")
        written = await caller.fetchval(
            "SELECT clock_timestamp() FROM (SELECT leaseq.send($1, 'late')) AS sent", queue)

        async def later() -> bool:
            return bool(await db.fetchval(
                "SELECT clock_timestamp() > CAST($1 AS timestamptz) + interval '20 milliseconds'",
                written))

        await eventually(later)
        for _ in range(4):
            assert await receive(client, queue) == []
        await caller.execute("COMMIT")
    finally:
        await caller.close()
    got = await receive(client, queue, max=10)
    assert [m["body"] for m in got] == ["late"]


async def test_concurrent_cycles_with_the_horizon_held_lose_and_repeat_nothing(
    client: httpx.AsyncClient, database_url: str,
) -> None:
    queue = await make_queue(client, "busy", visibility_timeout=30)
    holder = await asyncpg.connect(database_url)
    sent: list[str] = []
    got: list[str] = []
    try:
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT 1")

        async def producer(p: int) -> None:
            for i in range(60):
                body = f"{p}-{i}"
                await send(client, queue, body)
                sent.append(body)

        async def consumer() -> None:
            idle = 0
            while idle < 3:
                messages = await receive(client, queue, max=5, wait=1)
                idle = 0 if messages else idle + 1
                for message in messages:
                    got.append(message["body"])
                    deleted = await client.delete(
                        f"/v1/queues/{queue}/messages/{message['receipt_handle']}")
                    assert deleted.status_code == 204, deleted.text

        await asyncio.gather(*(producer(p) for p in range(4)),
                             *(consumer() for _ in range(4)))
    finally:
        await holder.close()
    assert sorted(got) == sorted(sent)
    assert len(set(got)) == len(got) == 240


async def test_a_message_received_with_a_visibility_timeout_of_0_is_received_again_at_once(
    client: httpx.AsyncClient,
) -> None:
    """Its lease ends as it is given, in the leases' range, which most claims do
    not read (floors.py, report_due): the claim that gave it makes the next one
    read both ranges, however soon it comes."""
    queue = await make_queue(client, "zero-lease")
    await send(client, queue, "again")
    for attempt in range(1, 11):
        (got,) = await receive(client, queue, visibility_timeout=0)
        assert got["body"] == "again" and got["receive_count"] == attempt
