"""The rotation of the messages' generations (app/queue/rotation.py): every kind
of message left in the old generation is carried into the new one whole (its
lease, its receipt, its place in a FIFO group, its dead-letter queue), the old
one is emptied by TRUNCATE whatever the horizon, a reader holding it (a
pg_dump) makes the emptying wait, never the cycle, and a send of the SQL API in
a transaction begun before the rotation is moved once it is committed.

The service under test never rotates by itself (rotate_after=0); each test
begins a rotation, and the service's own maintenance round carries it through."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
from conftest import AppClient
from support import eventually, make_queue, receive, send, sql_send

from app.db.engine import plain_url
from app.queue.generations import EPOCH_LOCKS


async def _rotation(db: asyncpg.Connection) -> asyncpg.Record:
    return await db.fetchrow("SELECT epoch, live, draining FROM leaseq.rotation")


async def _states(db: asyncpg.Connection) -> dict[int, str]:
    rows = await db.fetch("SELECT generation, state FROM leaseq.generations")
    return {row["generation"]: row["state"] for row in rows}


async def _count(db: asyncpg.Connection, generation: int) -> int:
    return int(await db.fetchval(f"SELECT count(*) FROM leaseq.messages_g{generation}"))


async def _begin(client: httpx.AsyncClient, db: asyncpg.Connection) -> tuple[int, int]:
    """A rotation begun: (the generation drained, the one live now)."""
    before = await _rotation(db)
    assert await client.app.state.rotation.start()  # type: ignore[attr-defined]
    after = await _rotation(db)
    assert after["draining"] == before["live"] and after["live"] != before["live"]
    return before["live"], after["live"]


async def _rotated(client: httpx.AsyncClient, db: asyncpg.Connection,
                   state: str = "spare") -> tuple[int, int]:
    """A whole rotation, until the old generation is `state` (spare: emptied)."""
    old, new = await _begin(client, db)

    async def done() -> bool:
        return (await _rotation(db))["draining"] is None and (await _states(db))[old] == state

    await eventually(done)
    return old, new


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json() if response.content else None


async def test_every_kind_of_message_is_carried_whole_and_the_old_generation_emptied(
    app_factory: AppClient, db: asyncpg.Connection
) -> None:
    client = await app_factory(rotate_after=0)
    dlq = await make_queue(client, "dlq")
    work = await make_queue(client, "work", dead_letter_queue=dlq, max_receive_count=1)
    plain = await make_queue(client, "plain")
    fifo = await make_queue(client, "steps.fifo", fifo=True)
    fair = await make_queue(client, "fair")
    await send(client, plain, "leased")
    (leased,) = await receive(client, plain, visibility_timeout=600)
    waiting = await send(client, plain, "waiting")
    delayed = await send(client, plain, "delayed", delay=600)
    lease = f"/v1/queues/{plain}/messages/{leased['receipt_handle']}"
    _ok(await client.put(f"{lease}/checkpoint", json={"cursor": {"step": 2}}))
    for n in range(3):
        _ok(await client.post(f"/v1/queues/{fifo}/messages", json={
            "body": f"step-{n}", "group": "order-1", "deduplication_id": f"d{n}"}), 201)
    (head,) = await receive(client, fifo, max=1, visibility_timeout=600)
    assert head["body"] == "step-0"
    await send(client, work, "poison")
    (poison,) = await receive(client, work, visibility_timeout=0)
    assert await receive(client, work) == []  # past max_receive_count: to the DLQ
    _ok(await client.post(f"/v1/queues/{fair}/messages", json={
        "messages": [{"body": "tenant-a", "group": "a"}, {"body": "tenant-b", "group": "b"}]}))
    standing = await db.fetchval("SELECT count(*) FROM leaseq.messages")

    old, new = await _rotated(client, db)

    assert await _count(db, old) == 0
    assert await db.fetchval(f"SELECT pg_relation_size('leaseq.messages_g{old}')") == 0
    assert await _count(db, new) == standing
    # The lease held across the rotation, by its receipt: a heartbeat, an
    # acknowledgement; the waiting message is there at once, the delayed one
    # keeps its delay.
    _ok(await client.patch(f"{lease}/visibility", json={"timeout": 600}))
    assert [m["message_id"] for m in await receive(client, plain, max=10)] == [waiting]
    stats = _ok(await client.get(f"/v1/queues/{plain}"))["stats"]
    assert stats["delayed"] == 1 and stats["in_flight"] == 2
    _ok(await client.patch(f"{lease}/visibility", json={"timeout": 0}))
    (again,) = await receive(client, plain)
    assert again["message_id"] == leased["message_id"] and again["checkpoint"] == {"step": 2}
    _ok(await client.delete(f"/v1/queues/{plain}/messages/{again['receipt_handle']}"), 204)
    assert delayed not in {m["message_id"] for m in await receive(client, plain, max=10)}
    # The FIFO group is still behind its head in flight, and in order after it.
    assert await receive(client, fifo, max=10) == []
    _ok(await client.delete(f"/v1/queues/{fifo}/messages/{head['receipt_handle']}"), 204)
    assert [m["body"] for m in await receive(client, fifo, max=10)] == ["step-1", "step-2"]
    # The dead-lettered message, with where it came from.
    (dead,) = _ok(await client.get(f"/v1/queues/{dlq}/messages"))["messages"]
    assert dead["message_id"] == poison["message_id"] and dead["dead_letter_source"] == work
    assert sorted(m["body"] for m in await receive(client, fair, max=10)) == [
        "tenant-a", "tenant-b"]


async def test_the_cycle_under_load_loses_and_repeats_nothing_across_rotations(
    app_factory: AppClient, db: asyncpg.Connection
) -> None:
    client = await app_factory(rotate_after=0)
    queue = await make_queue(client, "load", visibility_timeout=120)
    fifo = await make_queue(client, "load.fifo", fifo=True, visibility_timeout=120)
    sent: set[str] = set()
    settled: list[str] = []
    fifo_seen: dict[str, list[int]] = {}
    stop = asyncio.Event()

    async def producer(p: int) -> None:
        n = 0
        while not stop.is_set():
            body = _ok(await client.post(f"/v1/queues/{queue}/messages", json={
                "messages": [{"body": f"p{p}-{n + i}"} for i in range(5)]}))
            sent.update(r["message_id"] for r in body["results"])
            _ok(await client.post(f"/v1/queues/{fifo}/messages", json={
                "body": str(n), "group": f"g{p}", "deduplication_id": f"{p}-{n}"}), 201)
            n += 5

    async def consumer() -> None:
        while not stop.is_set() or await _has(queue):
            for message in await receive(client, queue, max=10, wait=1):
                _ok(await client.delete(
                    f"/v1/queues/{queue}/messages/{message['receipt_handle']}"), 204)
                settled.append(message["message_id"])

    async def fifo_consumer() -> None:
        while not stop.is_set() or await _has(fifo):
            for message in await receive(client, fifo, max=10, wait=1):
                fifo_seen.setdefault(message["group"], []).append(int(message["body"]))
                _ok(await client.delete(
                    f"/v1/queues/{fifo}/messages/{message['receipt_handle']}"), 204)

    async def _has(name: str) -> bool:
        stats = _ok(await client.get(f"/v1/queues/{name}"))["stats"]
        return bool(stats["visible"] + stats["in_flight"] + stats["delayed"])

    workers = [asyncio.create_task(producer(p)) for p in range(3)]
    workers += [asyncio.create_task(consumer()) for _ in range(3)]
    workers.append(asyncio.create_task(fifo_consumer()))
    generations = []
    for _ in range(3):
        target = len(settled) + 100

        async def enough(target: int = target) -> bool:
            return len(settled) >= target

        await eventually(enough)
        generations.append(await _rotated(client, db))
    stop.set()
    await asyncio.gather(*workers)

    assert len(settled) == len(set(settled)), "a message was delivered twice"
    assert set(settled) == sent
    for group, bodies in fifo_seen.items():
        assert bodies == sorted(bodies) and len(bodies) == len(set(bodies)), group
    assert [old for old, _ in generations] == [0, 1, 0]


async def test_a_reader_holding_the_old_generation_holds_up_its_emptying_not_the_cycle(
    app_factory: AppClient, db: asyncpg.Connection, database_url: str
) -> None:
    client = await app_factory(rotate_after=0)
    queue = await make_queue(client)
    await send(client, queue, "before")
    # As a pg_dump does: ACCESS SHARE on every table, held until it ends.
    dump = await asyncpg.connect(plain_url(database_url))
    try:
        await dump.execute("BEGIN ISOLATION LEVEL REPEATABLE READ; "
                           "LOCK TABLE leaseq.messages IN ACCESS SHARE MODE; "
                           "SELECT count(*) FROM leaseq.messages")
        old, new = await _rotated(client, db, state="used")
        # The cycle goes on in the new generation while the old cannot be emptied.
        await send(client, queue, "during")
        bodies = sorted(m["body"] for m in await receive(client, queue, max=10))
        assert bodies == ["before", "during"]
        # A second rotation cannot reuse the old generation: it makes another.
        second_old, third = await _rotated(client, db, state="used")
        assert second_old == new and third not in (old, new)
        assert (await _states(db))[old] == "used"
    finally:
        await dump.close()

    async def emptied() -> bool:
        states = await _states(db)
        return states[old] == "spare" and states[new] == "spare"

    await eventually(emptied)


async def test_a_send_of_the_sql_api_in_an_open_transaction_is_moved_once_committed(
    app_factory: AppClient, db: asyncpg.Connection, database_url: str
) -> None:
    client = await app_factory(rotate_after=0)
    queue = await make_queue(client)
    caller = await asyncpg.connect(plain_url(database_url))
    try:
        await caller.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await sql_send(caller, queue, "outbox")
        old, _new = await _begin(client, db)

        async def left() -> bool:  # every process acts by the new epoch
            return not await db.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND objsubid = 2 AND classid = $1 AND objid < $2",
                EPOCH_LOCKS, (await _rotation(db))["epoch"])

        await eventually(left)
        # Nothing else is left in the old generation, but the caller may still
        # commit a row into it: the drain waits for it.
        await client.app.state.rotation.step()  # type: ignore[attr-defined]
        assert (await _rotation(db))["draining"] == old
        await caller.execute("COMMIT")
    finally:
        await caller.close()

    async def moved() -> bool:
        return (await _rotation(db))["draining"] is None and await _count(db, old) == 0

    await eventually(moved)
    assert [m["body"] for m in await receive(client, queue)] == ["outbox"]


async def test_the_old_generation_is_emptied_while_a_transaction_holds_the_horizon(
    app_factory: AppClient, db: asyncpg.Connection, database_url: str
) -> None:
    client = await app_factory(rotate_after=0)
    queue = await make_queue(client)
    holder = await asyncpg.connect(plain_url(database_url))
    try:
        # A report's snapshot, on no table of leaseq's: no VACUUM removes a row
        # version settled after it began.
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT 1")
        for _ in range(6):
            _ok(await client.post(f"/v1/queues/{queue}/messages", json={
                "messages": [{"body": "x" * 200} for _ in range(100)]}))
            while batch := await receive(client, queue, max=10):
                for message in batch:
                    _ok(await client.delete(
                        f"/v1/queues/{queue}/messages/{message['receipt_handle']}"), 204)
        await db.execute("VACUUM leaseq.messages_g0")
        kept = await db.fetchval("SELECT pg_relation_size('leaseq.messages_g0')")
        assert kept >= 10 * 8192, "the settled history was removed: the horizon is not held"

        old, _new = await _rotated(client, db)

        assert old == 0
        assert await db.fetchval("SELECT pg_relation_size('leaseq.messages_g0')") == 0
        assert await holder.fetchval("SELECT count(*) FROM pg_stat_activity "
                                     "WHERE pid = pg_backend_pid() AND backend_xmin IS NOT NULL")
    finally:
        await holder.close()


async def test_heartbeats_of_many_leases_all_hold_while_their_messages_are_moved(
    app_factory: AppClient, db: asyncpg.Connection
) -> None:
    """A heartbeat of a hundred leases waits for rows the rotation moves a batch
    at a time; it may meet several batches of one drain, and is run again until
    it finds them all, never answered with an error."""
    client = await app_factory(rotate_after=0)
    queue = await make_queue(client, visibility_timeout=600)
    for _ in range(30):
        _ok(await client.post(f"/v1/queues/{queue}/messages", json={
            "messages": [{"body": "held"} for _ in range(100)]}))
    handles: list[str] = []
    while batch := await receive(client, queue, max=10):
        handles.extend(m["receipt_handle"] for m in batch)
    assert len(handles) == 3000
    stop = asyncio.Event()
    answers: list[tuple[int, int]] = []

    async def beat(chunk: list[str]) -> None:
        entries = [{"receipt_handle": h, "timeout": 600} for h in chunk]
        while not stop.is_set():
            response = await client.post(f"/v1/queues/{queue}/messages/visibility",
                                         json={"entries": entries})
            failed = response.json().get("failed", 0) if response.status_code == 200 else 0
            answers.append((response.status_code, failed))

    beaters = [asyncio.create_task(beat(handles[i:i + 100])) for i in range(0, 3000, 100)]
    try:
        await _rotated(client, db)
    finally:
        stop.set()
        await asyncio.gather(*beaters)
    assert answers and set(answers) == {(200, 0)}
