"""The SQL API (migration 0012, docs/transactions.md): sending and settling
inside the caller's own transaction, on the caller's own connection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from support import make_queue, notices_heard, parked, queue_id_of, receive, send, sql_send

from app.db.engine import plain_url

LEASE_LOST = "LQ005"
INVALID_HANDLE = "LQ004"


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """The application's own connections: the caller's transactions."""
    async with asyncpg.create_pool(plain_url(database_url), min_size=1, max_size=20) as made:
        yield made


async def test_a_send_wakes_a_waiting_receive_when_its_transaction_commits_and_not_before(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    queue = await make_queue(client)
    waiter = asyncio.create_task(receive(client, queue, wait=20))
    await parked(client, queue)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        sent = await sql_send(conn, queue, "order 1 placed")
        # A fence: a notice committed after the send reaches every listener
        # after anything the send's statement could have woken.
        await notices_heard(pool)
        assert not waiter.done(), "woken before the sending transaction committed"
        await tx.commit()
    messages = await asyncio.wait_for(waiter, 20)
    assert [m["message_id"] for m in messages] == [str(sent["message_id"])]
    assert messages[0]["body"] == "order 1 placed"


async def test_a_rolled_back_send_leaves_nothing_and_wakes_no_one(
    client: httpx.AsyncClient, pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client)
    queue_id = await queue_id_of(client, queue)
    notices: list[str] = []
    await db.add_listener("leaseq", lambda *a: notices.append(a[3]))
    waiter = asyncio.create_task(receive(client, queue, wait=20))
    await parked(client, queue)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await sql_send(conn, queue, "never")
        await tx.rollback()
    await notices_heard(pool)
    assert [n for n in notices if n.startswith(f"{queue_id}:")] == []
    assert not waiter.done()
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 0
    message_id = await send(client, queue, "after")
    assert [m["message_id"] for m in await waiter] == [message_id]


async def test_committed_sends_are_delivered_once_and_rolled_back_ones_never(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """1,000 messages from 20 concurrent transactions, every other one rolled
    back, while REST receivers consume."""
    queue = await make_queue(client, visibility_timeout=60)
    committed: set[str] = set()
    rolled_back: set[str] = set()

    async def producer(n: int) -> None:
        async with pool.acquire() as conn:
            for batch in range(5):
                tx = conn.transaction()
                await tx.start()
                ids = set()
                for i in range(10):
                    row = await sql_send(conn, queue, f"{n}-{batch}-{i}")
                    ids.add(str(row["message_id"]))
                await conn.execute("SELECT pg_sleep(0.01)")  # hold the rows a moment
                if (n + batch) % 2:
                    await tx.rollback()
                    rolled_back.update(ids)
                else:
                    await tx.commit()
                    committed.update(ids)

    delivered: list[str] = []
    producing = True

    async def consumer() -> None:
        while producing or len(delivered) < len(committed):
            messages = await receive(client, queue, max=10, wait=1)
            for m in messages:
                delivered.append(m["message_id"])
                response = await client.delete(
                    f"/v1/queues/{queue}/messages/{m['receipt_handle']}"
                )
                assert response.status_code == 204, response.text

    consumers = [asyncio.create_task(consumer()) for _ in range(4)]
    await asyncio.gather(*(producer(n) for n in range(20)))
    producing = False
    await asyncio.wait_for(asyncio.gather(*consumers), 60)
    assert len(committed) == 500 and len(rolled_back) == 500
    assert len(delivered) == len(set(delivered)), "a message was delivered twice"
    assert set(delivered) == committed


async def test_an_acknowledgement_rolled_back_is_delivered_again_after_its_lease(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    queue = await make_queue(client)
    await send(client, queue, "charge card")
    (message,) = await receive(client, queue, visibility_timeout=1)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("SELECT leaseq.delete($1, $2)", queue, message["receipt_handle"])
        await tx.rollback()
    again = await receive(client, queue, wait=10)
    assert [m["message_id"] for m in again] == [message["message_id"]]
    assert again[0]["receive_count"] == 2


async def test_an_acknowledgement_committed_deletes_the_message(
    client: httpx.AsyncClient, pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client)
    await send(client, queue)
    (message,) = await receive(client, queue)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT leaseq.delete($1, $2)", queue, message["receipt_handle"])
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 0
    # The same handle again: the lease is gone with the message.
    with pytest.raises(asyncpg.PostgresError) as lost:
        await db.execute("SELECT leaseq.delete($1, $2)", queue, message["receipt_handle"])
    assert lost.value.sqlstate == LEASE_LOST


async def test_a_stale_handle_raises_lease_lost_and_changes_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client)
    await send(client, queue)
    (first,) = await receive(client, queue, visibility_timeout=1)
    (second,) = await receive(client, queue, wait=10)  # the lease lapsed, claimed again
    assert second["message_id"] == first["message_id"]
    before = await db.fetchrow("SELECT * FROM leaseq.messages")
    for statement, args in (
        ("SELECT leaseq.delete($1, $2)", ()),
        ("SELECT leaseq.change_visibility($1, $2, $3)", (60,)),
        ("SELECT leaseq.change_visibility($1, $2, $3)", (0,)),
    ):
        with pytest.raises(asyncpg.PostgresError) as lost:
            await db.execute(statement, queue, first["receipt_handle"], *args)
        assert lost.value.sqlstate == LEASE_LOST
        assert "lease is lost" in str(lost.value)
    assert await db.fetchrow("SELECT * FROM leaseq.messages") == before
    # The current holder's handle still works.
    await db.execute("SELECT leaseq.delete($1, $2)", queue, second["receipt_handle"])


async def test_a_handle_is_verified_as_the_service_verifies_it(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    await make_queue(client, "a")
    await make_queue(client, "b")
    await send(client, "a")
    (message,) = await receive(client, "a")
    handle = message["receipt_handle"]
    tampered = handle[:30] + ("A" if handle[30] != "A" else "B") + handle[31:]
    for queue, given in (("a", tampered), ("a", handle[:-1]), ("a", handle + "A"),
                         ("a", "not a handle"), ("b", handle)):
        rest = await client.delete(f"/v1/queues/{queue}/messages/{given}")
        assert rest.status_code in (400, 404), rest.text
        assert rest.json()["code"] == "invalid_receipt_handle"
        with pytest.raises(asyncpg.PostgresError) as refused:
            await db.execute("SELECT leaseq.delete($1, $2)", queue, given)
        assert refused.value.sqlstate == INVALID_HANDLE, (queue, given)
    # A retired key verifies nothing, here as in the service.
    await db.execute("UPDATE leaseq.receipt_keys SET retired_at = now()")
    with pytest.raises(asyncpg.PostgresError) as retired:
        await db.execute("SELECT leaseq.delete($1, $2)", "a", handle)
    assert retired.value.sqlstate == INVALID_HANDLE
    await db.execute("UPDATE leaseq.receipt_keys SET retired_at = NULL")
    await db.execute("SELECT leaseq.delete($1, $2)", "a", handle)
    assert await receive(client, "a") == []


async def test_change_visibility_extends_a_lease_and_a_release_wakes_a_receiver(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client)
    await send(client, queue)
    (message,) = await receive(client, queue, visibility_timeout=5)
    deadline = await db.fetchval(
        "SELECT leaseq.change_visibility($1, $2, 600)", queue, message["receipt_handle"])
    assert await db.fetchval("SELECT visible_at FROM leaseq.messages") == deadline
    assert await db.fetchval("SELECT $1::timestamptz - now() > interval '590 s'", deadline)
    waiter = asyncio.create_task(receive(client, queue, wait=20))
    await parked(client, queue)
    await db.execute("SELECT leaseq.change_visibility($1, $2, 0)", queue, message["receipt_handle"])
    (again,) = await asyncio.wait_for(waiter, 20)
    assert again["message_id"] == message["message_id"]
    with pytest.raises(asyncpg.PostgresError) as refused:
        await db.execute("SELECT leaseq.change_visibility($1, $2, 43201)",
                         queue, again["receipt_handle"])
    assert refused.value.sqlstate == "LQ002"


async def test_fifo_deduplication_holds_across_sql_and_rest_sends(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, "orders.fifo", fifo=True)
    first = await sql_send(db, queue, "placed", group="customer-1", deduplication_id="order-7")
    rest = await client.post(f"/v1/queues/{queue}/messages", json={
        "body": "placed again", "group": "customer-1", "deduplication_id": "order-7"})
    assert rest.status_code == 201, rest.text
    assert rest.json()["message_id"] == str(first["message_id"])
    assert int(rest.json()["sequence_number"]) == first["sequence_number"]
    other = await client.post(f"/v1/queues/{queue}/messages", json={
        "body": "shipped", "group": "customer-1", "deduplication_id": "order-8"})
    again = await sql_send(db, queue, "shipped twice", group="customer-1",
                           deduplication_id="order-8")
    assert str(again["message_id"]) == other.json()["message_id"]
    assert again["sequence_number"] > first["sequence_number"]
    received = await receive(client, queue, max=10)
    assert [m["body"] for m in received] == ["placed", "shipped"]  # the group, in order


async def test_fifo_deduplication_keeps_the_scope_the_queue_was_created_with(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    # Created per group, switched to the queue: both doors still deduplicate per
    # group, as SQS does (migration 0017).
    queue = await make_queue(client, "tenants.fifo", fifo=True,
                             deduplication_scope="message_group")
    switched = await client.patch(f"/v1/queues/{queue}", json={"deduplication_scope": "queue"})
    assert switched.json()["attributes"]["deduplication_scope"] == "queue"
    one = await sql_send(db, queue, "a", group="g-1", deduplication_id="same")
    two = await sql_send(db, queue, "b", group="g-2", deduplication_id="same")
    rest = await client.post(f"/v1/queues/{queue}/messages", json={
        "body": "c", "group": "g-3", "deduplication_id": "same"})
    assert len({str(one["message_id"]), str(two["message_id"]), rest.json()["message_id"]}) == 3
    again = await sql_send(db, queue, "a again", group="g-1", deduplication_id="same")
    assert again["message_id"] == one["message_id"]


async def test_a_fifo_acknowledgement_in_sql_frees_the_group(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, "steps.fifo", fifo=True, content_based_deduplication=True)
    await db.execute(
        "SELECT leaseq.send_batch($1, ARRAY['one', 'two'], groups => ARRAY['g', 'g'])", queue)
    (one,) = await receive(client, queue)
    assert one["body"] == "one"
    waiter = asyncio.create_task(receive(client, queue, wait=20))
    await parked(client, queue)
    await db.execute("SELECT leaseq.delete($1, $2)", queue, one["receipt_handle"])
    (two,) = await asyncio.wait_for(waiter, 20)
    assert two["body"] == "two"


# -- the same rules as the REST send -------------------------------------------

CASES: list[tuple[str, dict[str, Any]]] = [
    ("plain", {"body": "hello"}),
    ("attributes", {"body": "x", "attributes": {"kind": "order", "n": "7"}}),
    ("delay", {"body": "later", "delay": 30}),
    ("delay too long", {"body": "x", "delay": 901}),
    ("negative delay", {"body": "x", "delay": -1}),
    ("empty body", {"body": ""}),
    ("control character", {"body": "a\x07b"}),
    ("tab and newline", {"body": "a\tb\nc\r"}),
    ("astral", {"body": "\U0001F600"}),
    ("bad attribute name", {"body": "x", "attributes": {"no spaces": "v"}}),
    ("control in attribute", {"body": "x", "attributes": {"k": "\x01"}}),
    ("eleven attributes", {"body": "x", "attributes": {f"a{i}": "v" for i in range(11)}}),
    ("too large", {"body": "x" * 1020, "attributes": {"kk": "v" * 3}}),
    ("just fits", {"body": "x" * 1020, "attributes": {"k": "vvv"}}),
    ("group on standard", {"body": "x", "group": "tenant-7"}),
    ("group on standard too long", {"body": "x", "group": "g" * 129}),
    ("group on standard with space", {"body": "x", "group": "a b"}),
    ("group on standard, delayed", {"body": "x", "group": "t", "delay": 3}),
    ("deduplication on standard", {"body": "x", "deduplication_id": "d"}),
]
FIFO_CASES: list[tuple[str, dict[str, Any]]] = [
    ("fifo plain", {"body": "x", "group": "g", "deduplication_id": "d1"}),
    ("fifo no group", {"body": "x", "deduplication_id": "d2"}),
    ("fifo no deduplication", {"body": "x", "group": "g"}),
    ("fifo delay", {"body": "x", "group": "g", "deduplication_id": "d3", "delay": 5}),
    ("fifo group too long", {"body": "x", "group": "g" * 129, "deduplication_id": "d4"}),
    ("fifo group with space", {"body": "x", "group": "a b", "deduplication_id": "d5"}),
    ("fifo punctuation", {"body": "x", "group": "!~{}", "deduplication_id": "[d6]"}),
    ("fifo deduplication empty", {"body": "x", "group": "g", "deduplication_id": ""}),
]
REST_CODES = {"LQ002": "validation_error", "LQ003": "message_too_large"}


def _comparable(row: asyncpg.Record) -> dict[str, Any]:
    kept = dict(row)
    for moving in ("id", "message_id", "sent_at", "visible_at", "sequence_number"):
        kept.pop(moving)
    return kept


@pytest.mark.parametrize(
    ("fifo", "case"),
    [(False, c) for c in CASES] + [(True, c) for c in FIFO_CASES],
    ids=[name for name, _ in CASES + FIFO_CASES],
)
async def test_sql_and_rest_sends_refuse_the_same_messages_and_store_the_same_rows(
    client: httpx.AsyncClient, db: asyncpg.Connection, fifo: bool,
    case: tuple[str, dict[str, Any]],
) -> None:
    _, message = case
    kind = {"fifo": True} if fifo else {}
    rest_queue = await make_queue(client, "rest.fifo" if fifo else "rest",
                                  max_message_bytes=1024, **kind)
    sql_queue = await make_queue(client, "sql.fifo" if fifo else "sql",
                                 max_message_bytes=1024, **kind)
    rest = await client.post(f"/v1/queues/{rest_queue}/messages", json=message)
    named = {k: v for k, v in message.items() if k != "body"}
    if "attributes" in named:
        named["attributes"] = json.dumps(named["attributes"])
    try:
        await sql_send(db, sql_queue, message["body"], **named)
        sql_code = None
    except asyncpg.PostgresError as exc:
        sql_code = REST_CODES.get(exc.sqlstate or "", exc.sqlstate)
    if rest.status_code == 201:
        assert sql_code is None
    else:
        assert sql_code is not None, rest.text
        assert sql_code == rest.json()["code"], rest.text
        return
    rows = await db.fetch(
        "SELECT m.*, q.name FROM leaseq.messages AS m JOIN leaseq.queues AS q "
        "ON q.id = m.queue_id ORDER BY q.name")
    by_queue = {row["name"]: row for row in rows}
    rest_row, sql_row = by_queue[rest_queue], by_queue[sql_queue]
    assert rest_row["visible_at"] - rest_row["sent_at"] == sql_row["visible_at"] - sql_row[
        "sent_at"]
    assert {**_comparable(rest_row), "queue_id": 0, "name": ""} == {
        **_comparable(sql_row), "queue_id": 0, "name": ""}


async def test_a_batch_is_checked_whole_before_anything_is_stored(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client)
    with pytest.raises(asyncpg.PostgresError) as refused:
        await db.fetch("SELECT * FROM leaseq.send_batch($1, ARRAY['ok', ''])", queue)
    assert refused.value.sqlstate == "LQ002"
    assert "message 2" in str(refused.value)
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 0
    rows = await db.fetch(
        "SELECT * FROM leaseq.send_batch($1, ARRAY['a', 'b', 'c'], delays => ARRAY[0, 5, 0])",
        queue)
    assert len(rows) == 3
    assert [m["body"] for m in await receive(client, queue, max=10)] in (["a", "c"], ["c", "a"])
    with pytest.raises(asyncpg.PostgresError) as uneven:
        await db.fetch("SELECT * FROM leaseq.send_batch($1, ARRAY['a'], delays => ARRAY[0, 1])",
                       queue)
    assert uneven.value.sqlstate == "LQ002"
    with pytest.raises(asyncpg.PostgresError) as missing:
        await db.fetch("SELECT * FROM leaseq.send('nowhere', 'x')")
    assert missing.value.sqlstate == "LQ001"
    assert await db.fetchval("SELECT leaseq.api_version()") == 1
