"""Factories and helpers shared by the tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import asyncpg
import httpx

from app.queue.sql import Q

TEST_SECRET = "897fe499db9274cfc62e45922c62df91dabfe498044a1700d0e1cdabc0e3716d"
"""A LEASEQ_SECRET strong enough for the settings' check (64 hex digits)."""


async def make_queue(client: httpx.AsyncClient, name: str = "jobs", **attributes: Any) -> str:
    response = await client.post("/v1/queues", json={"name": name, **attributes})
    assert response.status_code == 201, response.text
    return name


async def send(client: httpx.AsyncClient, queue: str, body: str = "hello", **extra: Any) -> str:
    response = await client.post(f"/v1/queues/{queue}/messages", json={"body": body, **extra})
    assert response.status_code == 201, response.text
    return str(response.json()["message_id"])


async def receive(
    client: httpx.AsyncClient, queue: str, **params: Any
) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/queues/{queue}/receive", params=params)
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


async def parked(client: httpx.AsyncClient, queue: str, count: int = 1) -> None:
    """Until `count` receivers are waiting on `queue` in this client's app."""
    app: Any = client.app  # type: ignore[attr-defined]
    queue_id = await queue_id_of(client, queue)
    await wait_until(lambda: app.state.hub.parked(queue_id) >= count)


async def queue_id_of(client: httpx.AsyncClient, queue: str) -> int:
    app: Any = client.app  # type: ignore[attr-defined]
    async with app.state.db.engine.connect() as conn:
        result = await conn.exec_driver_sql(
            "SELECT id FROM leaseq.queues WHERE name = $1", (queue,))
        return int(result.scalar_one())


async def db_now(db: asyncpg.Connection) -> Any:
    return await db.fetchval("SELECT clock_timestamp()")


async def wait_until(predicate: Callable[[], bool], seconds: float = 10.0) -> None:
    """Until `predicate()` holds, checking every few milliseconds; fails after `seconds`.

    For state another component owns and exposes no event for (a counter, a flag).
    """
    async with asyncio.timeout(seconds):
        while not predicate():  # noqa: ASYNC110 - the state has no event to wait on
            await asyncio.sleep(0.005)


async def eventually(check: Callable[[], Awaitable[bool]], seconds: float = 20.0) -> None:
    """Until the async `check()` holds (a state read over the API or SQL); fails
    after `seconds`."""
    async with asyncio.timeout(seconds):
        while not await check():  # noqa: ASYNC110 - polling a remote state
            await asyncio.sleep(0.02)


def positional(name: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
    """A named query of app/queue/queries.sql in asyncpg's $n form (the service's
    own translation), with its arguments in order."""
    query = getattr(Q, name)
    return query.sql, [params[n] for n in query.params]


async def stored_then_revoked(url: str, token: str) -> None:
    """Stores the key `<id>.<secret>` in the database at `url`, then revokes it:
    keys are then required there for good, and none works."""
    from app.auth.store import KeyStore
    from app.config import Settings
    from app.db.connector import Connector
    from app.db.engine import engine_for

    engine = engine_for(Settings(), pool_size=1, url=url)
    try:
        store = KeyStore(Connector(engine), master=TEST_SECRET.encode(), listening=lambda: False)
        key_id, _, secret = token.partition(".")
        await store.create("bootstrap admin", ["admin:*"], key_id=key_id, secret=secret)
        assert await store.revoke(key_id)
    finally:
        await engine.dispose()


async def sql_send(conn: Any, queue: str, body: str, **named: Any) -> asyncpg.Record:
    names = ["queue", "body", *named]
    args = ", ".join(f'"{n}" => ${i}' for i, n in enumerate(names, start=1))
    row: asyncpg.Record = await conn.fetchrow(
        f"SELECT * FROM leaseq.send({args})", queue, body, *named.values()
    )
    return row


async def notices_heard(pool: asyncpg.Pool) -> None:
    """Until a notice committed now has reached a listener of its own: every
    notice committed before it has been delivered (PostgreSQL delivers them in
    commit order), and the service's listener has had them too."""
    marker = f"fence:{uuid.uuid4().hex}"
    heard = asyncio.get_running_loop().create_future()

    def on_notice(*args: Any) -> None:
        if args[3] == marker and not heard.done():
            heard.set_result(None)

    async with pool.acquire() as listener:
        await listener.add_listener("leaseq", on_notice)
        async with pool.acquire() as conn:
            await conn.execute("SELECT pg_notify('leaseq', $1)", marker)
        await asyncio.wait_for(heard, 10)
        await listener.remove_listener("leaseq", on_notice)


def _plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found.extend(_plan_nodes(child))
    return found


def _blocks(node: dict[str, Any]) -> int:
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))


@contextlib.asynccontextmanager
async def held_horizon(database_url: str) -> AsyncIterator[None]:
    """A REPEATABLE READ transaction that has taken its snapshot, open for the
    block: no VACUUM removes a row version settled meanwhile."""
    from app.db.engine import plain_url

    holder = await asyncpg.connect(plain_url(database_url))
    try:
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT count(*) FROM leaseq.queues")
        yield
    finally:
        await holder.close()


async def statement_buffers(db: asyncpg.Connection, sql: str, args: list[Any]) -> int:
    """Buffers a statement reads or writes, by EXPLAIN (ANALYZE, BUFFERS), rolled
    back: the plan's root, and each data-modifying CTE that nothing reads
    (PostgreSQL runs those after the root, outside its count)."""
    tx = db.transaction()
    await tx.start()
    try:
        plan = json.loads(await db.fetchval(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *args))[0]["Plan"]
    finally:
        await tx.rollback()
    read = {n.get("CTE Name") for n in _plan_nodes(plan) if n["Node Type"] == "CTE Scan"}
    return _blocks(plan) + sum(
        _blocks(n) for n in plan.get("Plans", [])
        if n["Node Type"] == "ModifyTable"
        and n.get("Subplan Name", "").removeprefix("CTE ") not in read)


async def cycle(client: httpx.AsyncClient, queue: str,
                batches: Iterable[list[dict[str, Any]]]) -> None:
    """Each batch sent, then up to ten messages received and acknowledged
    together: a queue's history, a receive and a settle a batch."""
    for batch in batches:
        response = await client.post(f"/v1/queues/{queue}/messages", json={"messages": batch})
        assert response.status_code == 200, response.text
        got = await receive(client, queue, max=10, visibility_timeout=60)
        assert got
        response = await client.post(f"/v1/queues/{queue}/messages/delete", json={
            "receipt_handles": [m["receipt_handle"] for m in got]})
        assert response.status_code == 200, response.text


async def redriven(client: httpx.AsyncClient, dead_letter_queue: str) -> None:
    """A redrive of `dead_letter_queue` back to its sources, started and waited
    for until it completed."""
    started = await client.post(f"/v1/queues/{dead_letter_queue}/redrive", json={})
    assert started.status_code == 202, started.text
    task_id = started.json()["task_id"]

    async def done() -> bool:
        task = (await client.get(f"/v1/redrive-tasks/{task_id}")).json()
        return bool(task["status"] == "completed")

    await eventually(done)
