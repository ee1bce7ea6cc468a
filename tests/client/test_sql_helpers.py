"""leaseq.sql, the client's helpers of the SQL API, on each kind of connection a
caller may have (real PostgreSQL, the caller's own transactions), and a worker's
handler acknowledging its message in its own transaction (`ctx.ack_with`).

The SQL functions themselves are held to the REST door's rules by
tests/engine/test_sql_api.py; here: that each driver reaches them, inside the
caller's transaction, and that their errors come out as the client's.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import asyncpg
import httpx
import psycopg
import pytest
import sqlalchemy.exc
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from support import db_now, make_queue, receive, wait_until
from worker_support import Counting, running

from app.db.engine import asyncpg_url, parse_url, plain_url
from leaseq import (
    ApiError,
    AsyncClient,
    AsyncContext,
    Context,
    Forbidden,
    InvalidReceiptHandle,
    LeaseLost,
    Message,
    Outcome,
    OutgoingMessage,
    QueueNotFound,
    ValidationError,
    Worker,
    sql,
)
from leaseq.sql import Sent

E = TypeVar("E", bound=ApiError)


@dataclass
class Caller:
    """A connection of one kind, always in a transaction the test ends."""

    kind: str
    conn: Any
    end: Callable[[bool], Awaitable[None]]
    """Commit (True) or roll back the transaction, and begin the next."""

    async def commit(self) -> None:
        await self.end(True)

    async def rollback(self) -> None:
        await self.end(False)


async def done(answer: Any) -> Any:
    """A helper's answer: awaited on an async connection, as is on a sync one."""
    return await answer if inspect.isawaitable(answer) else answer


KINDS = [
    "asyncpg", "psycopg", "psycopg-async", "sqlalchemy-session", "sqlalchemy-async-session",
    "sqlalchemy-connection", "sqlalchemy-async-connection",
]


@pytest.fixture(params=KINDS)
async def caller(request: pytest.FixtureRequest, database_url: str) -> AsyncIterator[Caller]:
    kind = str(request.param)
    async with contextlib.AsyncExitStack() as stack:
        if kind == "asyncpg":
            conn = await asyncpg.connect(plain_url(database_url))
            stack.push_async_callback(conn.close)
            tx = conn.transaction()
            await tx.start()

            async def end(commit: bool) -> None:
                nonlocal tx
                await (tx.commit() if commit else tx.rollback())
                tx = conn.transaction()
                await tx.start()

            yield Caller(kind, conn, end)
        elif kind == "psycopg":
            sync = stack.enter_context(psycopg.connect(plain_url(database_url)))
            yield Caller(kind, sync, _sync_end(sync))
        elif kind == "psycopg-async":
            aconn = await psycopg.AsyncConnection.connect(plain_url(database_url))
            stack.push_async_callback(aconn.close)
            yield Caller(kind, aconn, _async_end(aconn))
        elif kind.startswith("sqlalchemy-async"):
            engine = create_async_engine(asyncpg_url(database_url))
            stack.push_async_callback(engine.dispose)
            if kind == "sqlalchemy-async-session":
                session: Any = AsyncSession(engine)
                stack.push_async_callback(session.close)
            else:
                session = await stack.enter_async_context(engine.connect())
            yield Caller(kind, session, _async_end(session))
        else:
            sync_engine = create_engine(
                parse_url(database_url).set(drivername="postgresql+psycopg")
            )
            stack.callback(sync_engine.dispose)
            made = Session(sync_engine) if kind == "sqlalchemy-session" else sync_engine.connect()
            stack.callback(made.close)
            yield Caller(kind, made, _sync_end(made))


def _sync_end(conn: Any) -> Callable[[bool], Awaitable[None]]:
    # Each of these begins its next transaction with its next statement.
    async def end(commit: bool) -> None:
        conn.commit() if commit else conn.rollback()

    return end


def _async_end(conn: Any) -> Callable[[bool], Awaitable[None]]:
    async def end(commit: bool) -> None:
        await (conn.commit() if commit else conn.rollback())

    return end


# -- each kind of connection ------------------------------------------------------


async def test_send_change_visibility_and_delete_in_the_caller_s_transaction(
    caller: Caller, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, "orders")
    sent = await done(sql.send(caller.conn, queue, "order 7", attributes={"k": "v"}))
    assert isinstance(sent, Sent) and sent.sequence_number is None
    assert await receive(client, queue, wait=0) == []  # not before the commit
    await caller.commit()

    (message,) = await receive(client, queue, wait=0, visibility_timeout=30)
    assert message["message_id"] == sent.message_id
    assert (message["body"], message["attributes"]) == ("order 7", {"k": "v"})
    handle = message["receipt_handle"]

    before = await db_now(db)
    deadline = await done(sql.change_visibility(caller.conn, queue, handle, 600))
    await caller.commit()
    assert isinstance(deadline, datetime) and deadline.tzinfo is not None
    assert before + timedelta(seconds=599) < deadline < await db_now(db) + timedelta(seconds=601)
    visible_at = await db.fetchval("SELECT visible_at FROM leaseq.messages")
    assert visible_at == deadline

    assert await done(sql.delete(caller.conn, queue, handle)) is None
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 1  # not committed yet
    await caller.commit()
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 0


async def test_a_rolled_back_batch_leaves_nothing_and_a_committed_one_keeps_its_order(
    caller: Caller, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, "batches")
    batch: list[OutgoingMessage | dict[str, Any] | str] = [
        "first", {"body": "second", "attributes": {"n": "2"}}, OutgoingMessage("third", delay=0),
    ]
    await done(sql.send_batch(caller.conn, queue, batch))
    await done(sql.send(caller.conn, queue, "fourth"))
    await caller.rollback()
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 0

    sent = await done(sql.send_batch(caller.conn, queue, batch))
    await caller.commit()
    messages = await receive(client, queue, wait=0, max=10)
    assert [m["body"] for m in messages] == ["first", "second", "third"]
    assert [m["message_id"] for m in messages] == [s.message_id for s in sent]
    assert messages[1]["attributes"] == {"n": "2"}


async def test_a_fifo_send_answers_its_sequence_number(
    caller: Caller, client: httpx.AsyncClient
) -> None:
    queue = await make_queue(client, "orders.fifo", fifo=True)
    first = await done(sql.send(
        caller.conn, queue, "a", group="customer-7", deduplication_id="order-1"
    ))
    again = await done(sql.send(
        caller.conn, queue, "a", group="customer-7", deduplication_id="order-1"
    ))
    (second,) = await done(sql.send_batch(
        caller.conn, queue, [{"body": "b", "group": "customer-7", "deduplication_id": "order-2"}]
    ))
    await caller.commit()
    assert isinstance(first.sequence_number, int)
    assert again == first  # a duplicate answers with the first message
    assert second.sequence_number > first.sequence_number


async def test_the_api_s_errors_come_out_as_the_client_s(
    caller: Caller, client: httpx.AsyncClient
) -> None:
    queue = await make_queue(client, "errors")
    await client.post(f"/v1/queues/{queue}/messages", json={"body": "x"})
    (message,) = await receive(client, queue, wait=0, visibility_timeout=30)
    handle = message["receipt_handle"]

    async def raises(error: type[E], call: Callable[[], Any]) -> E:
        with pytest.raises(error) as raised:
            await done(call())
        await caller.rollback()  # the statement's error aborted the transaction
        cause = raised.value.__cause__
        # The driver's own exception (SQLAlchemy's, wrapping the driver's) stays the cause.
        assert cause is not None and not isinstance(cause, ApiError)
        if caller.kind.startswith("sqlalchemy"):
            assert isinstance(cause, sqlalchemy.exc.DBAPIError)
        return raised.value

    missing = await raises(QueueNotFound, lambda: sql.send(caller.conn, "no-such-queue", "x"))
    assert (missing.status, missing.code) == (404, "queue_not_found")
    assert "no-such-queue" in str(missing)
    await raises(ValidationError, lambda: sql.send(caller.conn, queue, "x", delay=5000))
    await raises(InvalidReceiptHandle, lambda: sql.delete(caller.conn, queue, "not-a-handle"))

    await done(sql.delete(caller.conn, queue, handle))
    await caller.commit()
    used = await raises(LeaseLost, lambda: sql.delete(caller.conn, queue, handle))
    assert used.code == "lease_lost"
    await raises(LeaseLost, lambda: sql.change_visibility(caller.conn, queue, handle, 10))

    # A stale handle: the lease went back and another receive claimed the message.
    await client.post(f"/v1/queues/{queue}/messages", json={"body": "y"})
    (first,) = await receive(client, queue, wait=0, visibility_timeout=30)
    response = await client.post(
        f"/v1/queues/{queue}/messages/{first['receipt_handle']}/release", json={"delay": 0}
    )
    assert response.status_code == 200, response.text
    (second,) = await receive(client, queue, wait=0, visibility_timeout=30)
    assert second["message_id"] == first["message_id"]
    await raises(LeaseLost, lambda: sql.delete(caller.conn, queue, first["receipt_handle"]))
    # ...and after a failed call the connection goes on: the claim that holds it.
    await done(sql.delete(caller.conn, queue, second["receipt_handle"]))
    await caller.commit()


async def test_a_role_without_a_grant_is_forbidden(
    client: httpx.AsyncClient, database_url: str
) -> None:
    queue = await make_queue(client, "guarded")
    role = f"lq_test_{uuid.uuid4().hex[:12]}"  # roles are the server's, not the database's
    conn = await asyncpg.connect(plain_url(database_url))
    try:
        await conn.execute(f'CREATE ROLE "{role}"')
        try:
            tx = conn.transaction()
            await tx.start()
            await conn.execute(f'SET LOCAL ROLE "{role}"')
            with pytest.raises(Forbidden) as raised:
                await sql.send(conn, queue, "x")
            await tx.rollback()
            assert isinstance(raised.value.__cause__, asyncpg.InsufficientPrivilegeError)
            assert (raised.value.status, raised.value.code) == (403, "forbidden")
            assert f"leaseq grants add {role} send:{queue}" in raised.value.detail  # the hint
        finally:
            await conn.execute(f'DROP ROLE "{role}"')
    finally:
        await conn.close()


async def test_other_errors_and_other_objects_are_not_the_helpers(
    client: httpx.AsyncClient, database_url: str
) -> None:
    conn = await asyncpg.connect(plain_url(database_url))
    try:
        tx = conn.transaction()
        await tx.start()
        with pytest.raises(asyncpg.DivisionByZeroError):
            await conn.execute("SELECT 1 / 0")
        with pytest.raises(asyncpg.InFailedSQLTransactionError):  # as the driver raised it
            await sql.send(conn, "any", "x")
        await tx.rollback()
        pool = await asyncpg.create_pool(plain_url(database_url), min_size=1, max_size=1)
        async with pool:
            with pytest.raises(TypeError, match=r"pool\.acquire"):
                sql.delete(pool, "any", "handle")
        with pytest.raises(TypeError, match="not a connection leaseq"):
            sql.delete(object(), "any", "handle")  # type: ignore[call-overload]
    finally:
        await conn.close()


# -- a worker's handler acknowledging in its own transaction ---------------------


ACKNOWLEDGEMENTS = ("DELETE message", "POST delete", "POST receive")
"""The worker's requests that could carry an acknowledgement (a receive carrying
some is a POST)."""


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """The application's own connections."""
    async with asyncpg.create_pool(plain_url(database_url), min_size=1, max_size=4) as made:
        await made.execute(
            "CREATE TABLE public.results (message_id text PRIMARY KEY, fencing_token bigint)"
        )
        yield made


async def test_a_handler_acknowledges_in_the_transaction_of_its_result(
    api: AsyncClient, url: str, pool: asyncpg.Pool
) -> None:
    """The result and the acknowledgement commit together, the worker sends no
    acknowledgement of its own, and its heartbeat stops: the commit comes after the
    lease would have run out, and still no one else gets the message."""
    await api.create_queue("shipments")
    await api.send_batch("shipments", ["order 1", "order 2", "order 3"])
    seen: Counter[str] = Counter()
    extends_after_ack: list[int] = []

    async def handler(message: Message, ctx: AsyncContext) -> None:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("INSERT INTO public.results VALUES ($1, $2)",
                               message.message_id, ctx.fencing_token)
            await ctx.ack_with(conn)
            acked = seen["PATCH visibility"]
            # Past the lease (on the worker's clock): no beat, no watchdog.
            while ctx.lease_remaining > -0.5:  # noqa: ASYNC110 - a deadline to pass
                await asyncio.sleep(0.05)
            assert not ctx.cancelled
            extends_after_ack.append(seen["PATCH visibility"] - acked)

    worker = Worker(handler, queue="shipments", url=url, wait=1, concurrency=3,
                    visibility_timeout=2, heartbeat_period=0.2,
                    transport=lambda: Counting(seen))
    async with running(worker):
        await wait_until(lambda: worker.stats.acknowledged == 3, seconds=20)
    assert worker.stats.acknowledged_in_transaction == 3
    assert worker.stats.released == worker.stats.abandoned == worker.stats.ack_rejected == 0
    assert worker.stats.received == 3  # none came back
    assert {outcome for _, _, outcome in worker.stats.recent} == {Outcome.ACKNOWLEDGED}
    assert extends_after_ack == [0, 0, 0]
    assert not any(seen[request] for request in ACKNOWLEDGEMENTS), seen
    stats = (await api.get_queue("shipments")).stats
    assert stats is not None and stats.visible == stats.in_flight == stats.delayed == 0
    rows = await pool.fetch("SELECT message_id, fencing_token FROM public.results")
    assert {r["fencing_token"] for r in rows} == {t for _, t, _ in worker.stats.recent}
    assert {r["message_id"] for r in rows} == {m for m, _, _ in worker.stats.recent}


async def test_a_fifo_group_goes_on_after_each_acknowledgement_in_a_transaction(
    api: AsyncClient, url: str, pool: asyncpg.Pool
) -> None:
    """ack_with counts as the acknowledgement the group's next message waits for."""
    await api.create_queue("orders.fifo", fifo=True, visibility_timeout=30)
    bodies = ["one", "two", "three"]
    await api.send_batch("orders.fifo", [
        OutgoingMessage(body, group="customer-7", deduplication_id=body) for body in bodies
    ])
    handled: list[str] = []

    async def handler(message: Message, ctx: AsyncContext) -> None:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("INSERT INTO public.results VALUES ($1, $2)",
                               message.message_id, ctx.fencing_token)
            await ctx.ack_with(conn)
        handled.append(message.body)

    worker = Worker(handler, queue="orders.fifo", url=url, wait=1, concurrency=3,
                    visibility_timeout=30)  # the group's three held at once
    async with running(worker):
        await wait_until(lambda: worker.stats.acknowledged == 3, seconds=20)
    assert handled == bodies
    assert worker.stats.acknowledged_in_transaction == 3 and worker.stats.received == 3
    assert worker.stats.returned == worker.stats.released == 0
    assert await pool.fetchval("SELECT count(*) FROM public.results") == 3


async def test_a_sync_handler_acknowledges_on_its_psycopg_connection(
    api: AsyncClient, url: str, pool: asyncpg.Pool, database_url: str
) -> None:
    await api.create_queue("sync")
    await api.send("sync", "order 1")
    conninfo = plain_url(database_url)

    def handler(message: Message, ctx: Context) -> None:
        with psycopg.connect(conninfo) as conn:  # commits on the way out
            conn.execute("INSERT INTO public.results VALUES (%s, %s)",
                         (message.message_id, ctx.fencing_token))
            ctx.ack_with(conn)

    worker = Worker(handler, queue="sync", url=url, wait=1, visibility_timeout=30)
    async with running(worker):
        await wait_until(lambda: worker.stats.acknowledged == 1, seconds=20)
    assert worker.stats.acknowledged_in_transaction == 1
    assert await pool.fetchval("SELECT count(*) FROM public.results") == 1
    stats = (await api.get_queue("sync")).stats
    assert stats is not None and stats.visible == stats.in_flight == 0


async def test_an_acknowledgement_rolled_back_comes_back_after_the_lease(
    api: AsyncClient, url: str, pool: asyncpg.Pool
) -> None:
    """The worker cannot see the handler's commit: a rolled-back ack_with leaves
    the message to come back when its lease ends, and it is handled again."""
    await api.create_queue("undone")
    await api.send("undone", "order 1")
    deliveries: list[Message] = []

    async def handler(message: Message, ctx: AsyncContext) -> None:
        deliveries.append(message)
        async with pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            await conn.execute("INSERT INTO public.results VALUES ($1, $2)",
                               message.message_id, ctx.fencing_token)
            await ctx.ack_with(conn)
            await (tx.rollback() if len(deliveries) == 1 else tx.commit())

    worker = Worker(handler, queue="undone", url=url, wait=1, visibility_timeout=2)
    async with running(worker):
        await wait_until(lambda: worker.stats.acknowledged == 2, seconds=20)
    first, second = deliveries
    assert first.message_id == second.message_id and second.receive_count == 2
    assert second.fencing_token > first.fencing_token
    assert worker.stats.released == 0  # it came back by its lease, not by a release
    assert await pool.fetchval("SELECT fencing_token FROM public.results") == second.fencing_token
    stats = (await api.get_queue("undone")).stats
    assert stats is not None and stats.visible == stats.in_flight == 0


async def test_a_handler_that_raises_after_ack_with_is_released_or_harmlessly_not(
    api: AsyncClient, url: str, pool: asyncpg.Pool
) -> None:
    """Raised inside its transaction: rolled back, released, handled again. Raised
    after its commit: the release is refused (the message is gone) and nothing
    else happens."""
    await api.create_queue("raises")
    await api.send("raises", "order 1")
    deliveries: list[Message] = []

    async def handler(message: Message, ctx: AsyncContext) -> None:
        deliveries.append(message)
        async with pool.acquire() as conn:
            async with conn.transaction():
                await conn.execute("INSERT INTO public.results VALUES ($1, $2)",
                                   message.message_id, ctx.fencing_token)
                await ctx.ack_with(conn)
                if len(deliveries) == 1:
                    raise RuntimeError("failed inside the transaction")
        raise RuntimeError("failed after the commit")

    worker = Worker(handler, queue="raises", url=url, wait=1, visibility_timeout=30)
    async with running(worker) as serving:
        await wait_until(lambda: worker.stats.failed == 2, seconds=20)
        assert worker.stats.released == 1  # the first only
        assert not serving.done()
    assert len(deliveries) == 2 and deliveries[1].receive_count == 2
    assert worker.stats.acknowledged == 0
    assert await pool.fetchval("SELECT fencing_token FROM public.results") == (
        deliveries[1].fencing_token)
    stats = (await api.get_queue("raises")).stats
    assert stats is not None and stats.visible == stats.in_flight == stats.delayed == 0


async def test_ack_with_on_a_lost_claim_raises_lease_lost_in_the_handler(
    api: AsyncClient, url: str, pool: asyncpg.Pool
) -> None:
    await api.create_queue("stolen")
    await api.send("stolen", "order 1")
    lost: list[LeaseLost] = []
    taken: list[Message] = []

    async def handler(message: Message, ctx: AsyncContext) -> None:
        # Someone else claims it meanwhile (its lease of 30 s beats every 10 s:
        # no beat notices before ack_with does).
        await api.release("stolen", message.receipt_handle, 0)
        taken.extend(await api.receive("stolen", visibility_timeout=60, wait=0))
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("INSERT INTO public.results VALUES ($1, $2)",
                               message.message_id, ctx.fencing_token)
            try:
                await ctx.ack_with(conn)
            except LeaseLost as exc:
                lost.append(exc)
                raise

    worker = Worker(handler, queue="stolen", url=url, wait=1, visibility_timeout=30)
    async with running(worker):
        await wait_until(lambda: worker.stats.failed == 1, seconds=20)
    assert len(lost) == 1 and isinstance(lost[0].__cause__, asyncpg.PostgresError)
    assert worker.stats.acknowledged == worker.stats.released == 0
    assert await pool.fetchval("SELECT count(*) FROM public.results") == 0
    await api.delete("stolen", taken[0].receipt_handle)  # the other claim was never touched
