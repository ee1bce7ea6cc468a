"""Long polling: a waiting receive holds no connection and wakes on a send, a
delay ending, a lease expiring, from any service process; a gone client claims
nothing."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import httpx
from conftest import AppClient
from support import eventually, make_queue, parked, queue_id_of, receive, send, wait_until


async def timed_receive(client: httpx.AsyncClient, queue: str, **params: Any) -> tuple[
    list[dict[str, Any]], float
]:
    start = time.monotonic()
    messages = await receive(client, queue, **params)
    return messages, time.monotonic() - start


async def test_a_waiting_receive_wakes_on_send(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client)
    waiter = asyncio.create_task(timed_receive(client, queue, wait=20))
    await parked(client, queue)
    message_id = await send(client, queue)
    messages, elapsed = await waiter
    assert [m["message_id"] for m in messages] == [message_id]
    assert elapsed < 10  # well before the 20 s wait ran out


async def test_a_waiting_receive_holds_no_database_connection(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client)
    waiters = [asyncio.create_task(receive(client, queue, wait=20)) for _ in range(30)]
    await parked(client, queue, 30)
    pool = client.app.state.db.engine.pool  # type: ignore[attr-defined]
    # The service's background work (maintenance, retention) borrows a connection
    # for a moment now and then; thirty parked polls would hold theirs throughout.
    await wait_until(lambda: pool.checkedout() == 0, seconds=5)

    async def nothing_busy() -> bool:
        busy = await db.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'leaseq' AND state <> 'idle'"
        )
        return bool(busy == 0)

    await eventually(nothing_busy, seconds=5)
    assert not any(w.done() for w in waiters)  # still parked, not answered
    await client.post(
        f"/v1/queues/{queue}/messages",
        json={"messages": [{"body": str(i)} for i in range(30)]},
    )
    results = await asyncio.gather(*waiters)
    assert sorted(len(r) for r in results) == [1] * 30


async def test_a_waiting_receive_wakes_when_a_delay_ends(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client)
    await send(client, queue, delay=2)
    messages, elapsed = await timed_receive(client, queue, wait=20)
    assert len(messages) == 1
    assert 1 <= elapsed < 10


async def test_a_waiting_receive_wakes_when_a_lease_expires(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, visibility_timeout=2)
    await send(client, queue)
    (first,) = await receive(client, queue)
    messages, elapsed = await timed_receive(client, queue, wait=20)
    assert [m["message_id"] for m in messages] == [first["message_id"]]
    assert elapsed < 10


async def test_a_lease_ending_between_the_claim_and_the_outlook_is_not_slept_through(
    client: httpx.AsyncClient, monkeypatch: Any
) -> None:
    """A long poll's claim and its outlook are two statements, each with its own
    now: a lease that ends between them is neither claimed (not yet) nor due (no
    longer), and no notification announces it. The poll looks again shortly
    instead of sleeping its whole wait. The gap is widened here on purpose: the
    first outlook starts only after the lease has ended."""
    from app.queue import receiving

    queue = await make_queue(client, visibility_timeout=1)
    await send(client, queue)
    (first,) = await receive(client, queue)
    real_outlook = receiving.outlook
    delayed: list[bool] = []

    async def late_outlook(session: Any, queue: Any) -> Any:
        if not delayed:
            delayed.append(True)
            await asyncio.sleep(1.5)  # the fault injected: the lease ends meanwhile
        return await real_outlook(session, queue)

    monkeypatch.setattr(receiving, "outlook", late_outlook)
    messages, elapsed = await timed_receive(client, queue, wait=10)
    assert delayed, "the outlook was not reached"
    assert [m["message_id"] for m in messages] == [first["message_id"]]
    assert elapsed < 8  # not slept to the end of its 10 s wait


async def test_a_send_through_another_process_wakes_the_waiter(
    app_factory: AppClient,
) -> None:
    """Two app instances share only the database: the wake-up crosses by NOTIFY."""
    waiting_side = await app_factory()
    sending_side = await app_factory()
    queue = await make_queue(sending_side)
    waiter = asyncio.create_task(timed_receive(waiting_side, queue, wait=20))
    await parked(waiting_side, queue)
    await send(sending_side, queue)
    messages, elapsed = await waiter
    assert len(messages) == 1
    assert elapsed < 10


async def test_waiters_recover_when_the_listener_connection_is_killed(
    app_factory: AppClient, db: asyncpg.Connection
) -> None:
    waiting_side = await app_factory()
    sending_side = await app_factory()
    queue = await make_queue(sending_side)
    listener = waiting_side.app.state.listener  # type: ignore[attr-defined]
    waiter = asyncio.create_task(timed_receive(waiting_side, queue, wait=20))
    await parked(waiting_side, queue)
    killed = await db.fetchval(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = 'leaseq-listener'"
    )
    assert killed == 2  # one per app instance
    await send(sending_side, queue)
    messages, elapsed = await waiter
    assert len(messages) == 1
    assert elapsed < 10
    async with asyncio.timeout(10):
        await listener.connected.wait()


async def test_a_disconnected_client_claims_nothing(
    served: tuple[str, Any], db: asyncpg.Connection
) -> None:
    base, app = served
    async with httpx.AsyncClient(base_url=base) as http:
        assert (await http.post("/v1/queues", json={"name": "q"})).status_code == 201
    queue_id = await db.fetchval("SELECT id FROM leaseq.queues WHERE name = 'q'")

    reader, writer = await asyncio.open_connection("127.0.0.1", int(base.rsplit(":", 1)[1]))
    writer.write(b"GET /v1/queues/q/receive?wait=20 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    await wait_until(lambda: app.state.hub.parked(queue_id) >= 1)
    writer.close()
    await writer.wait_closed()
    # The server notices the disconnect and stops waiting...
    await wait_until(lambda: app.state.hub.parked(queue_id) == 0)
    # ...so a message sent now is not claimed for the gone client.
    async with httpx.AsyncClient(base_url=base) as http:
        sent = await http.post("/v1/queues/q/messages", json={"body": "for a live worker"})
        assert sent.status_code == 201
        got = (await http.get("/v1/queues/q/receive")).json()["messages"]
    assert [m["receive_count"] for m in got] == [1]
    del reader


class LeavesWhileClaiming:
    """A client that goes away once its receive has parked, before its claim
    is answered: the race a disconnect watcher alone cannot close."""

    def __init__(self) -> None:
        self.left = False

    def is_set(self) -> bool:
        return self.left

    def watch(self) -> None:
        self.left = True

    async def wait(self) -> None:
        await asyncio.Event().wait()


async def test_a_claim_answered_after_its_client_left_is_given_back(
    served: tuple[str, Any], db: asyncpg.Connection
) -> None:
    base, app = served
    async with httpx.AsyncClient(base_url=base) as http:
        assert (await http.post("/v1/queues", json={"name": "q"})).status_code == 201
        sent = await http.post("/v1/queues/q/messages", json={"body": "for a live worker"})
        assert sent.status_code == 201
        gone = LeavesWhileClaiming()
        assert await app.state.service.receive("q", wait=5, gone=gone) == []
        assert gone.left
        # Visible again at once, and the gone client's receive not counted.
        got = (await http.get("/v1/queues/q/receive")).json()["messages"]
    assert [m["receive_count"] for m in got] == [1]


async def test_one_message_wakes_one_waiter_not_the_herd(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client)
    hub: Any = client.app.state.hub  # type: ignore[attr-defined]
    waiters = [asyncio.create_task(receive(client, queue, wait=20)) for _ in range(20)]
    await parked(client, queue, 20)
    before = hub.wakeups
    first = await send(client, queue)
    done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    assert [m["message_id"] for t in done for m in t.result()] == [first]
    assert hub.wakeups - before == 1
    assert hub.parked(await queue_id_of(client, queue)) == 19
    # A batch of five wakes five more; each gets exactly one message.
    response = await client.post(
        f"/v1/queues/{queue}/messages", json={"messages": [{"body": str(i)} for i in range(5)]}
    )
    assert response.json()["succeeded"] == 5
    await wait_until(lambda: sum(t.done() for t in waiters) == 6)
    # About one per message: a receiver woken while its own claim was already
    # under way may hand its wake-up on, so allow a little slack, not the herd.
    assert 6 <= hub.wakeups - before <= 9
    got = [m["body"] for t in waiters if t.done() for m in t.result()]
    assert sorted(got) == sorted(["hello", "0", "1", "2", "3", "4"])
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)


async def test_a_timer_wakes_one_waiter_and_the_next_when_more_is_due(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client)
    hub: Any = client.app.state.hub  # type: ignore[attr-defined]
    await client.post(
        f"/v1/queues/{queue}/messages",
        json={"messages": [{"body": "a", "delay": 1}, {"body": "b", "delay": 1}]},
    )
    waiters = [asyncio.create_task(receive(client, queue, wait=20)) for _ in range(10)]
    await parked(client, queue, 10)
    before = hub.wakeups
    # Both become visible together: the first woken takes one, sees more, passes it on.
    await wait_until(lambda: sum(t.done() for t in waiters) == 2, seconds=15)
    got = sorted(m["body"] for t in waiters if t.done() for m in t.result())
    assert got == ["a", "b"]
    assert hub.wakeups - before <= 3  # not the herd of ten
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)


async def test_long_polls_on_a_known_empty_queue_still_wake_on_send(
    app_factory: AppClient,
) -> None:
    """Once a long poll found the queue empty, later ones skip the database, and
    must still be woken by a send from any process."""
    here = await app_factory()
    there = await app_factory()
    queue = await make_queue(here)
    hub: Any = here.app.state.hub  # type: ignore[attr-defined]
    assert await receive(here, queue, wait=1) == []  # looks, finds nothing
    queue_id = await queue_id_of(here, queue)
    assert hub.quiet_for(queue_id) is not None
    waiters = [asyncio.create_task(timed_receive(here, queue, wait=20)) for _ in range(3)]
    await parked(here, queue, 3)
    await send(there, queue)
    done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    (messages, elapsed), = [t.result() for t in done]
    assert len(messages) == 1 and elapsed < 10
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)


async def test_a_short_poll_always_looks(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client)
    assert await receive(client, queue, wait=1) == []
    await send(client, queue)
    assert len(await receive(client, queue, wait=0)) == 1


async def test_deleting_a_queue_ends_the_waits_on_it_in_every_process(
    app_factory: AppClient,
) -> None:
    here = await app_factory()
    there = await app_factory()
    queue = await make_queue(here)
    waiter = asyncio.create_task(here.get(f"/v1/queues/{queue}/receive", params={"wait": 20}))
    await parked(here, queue)
    assert (await there.delete(f"/v1/queues/{queue}")).status_code == 204
    response = await asyncio.wait_for(waiter, timeout=10)
    assert response.status_code == 404
    assert response.json()["code"] == "queue_not_found"


async def test_a_queue_change_in_another_process_is_seen_at_once(
    app_factory: AppClient,
) -> None:
    here = await app_factory()
    there = await app_factory()
    queue = await make_queue(here, visibility_timeout=30)
    await send(here, queue)
    assert await receive(here, queue, wait=1, max=10)  # caches the queue here
    await send(here, queue)
    patched = await there.patch(f"/v1/queues/{queue}", json={"visibility_timeout": 77})
    assert patched.status_code == 200
    hub: Any = here.app.state.hub  # type: ignore[attr-defined]
    service: Any = here.app.state.service  # type: ignore[attr-defined]
    await wait_until(lambda: service.queues.cached(queue) is None)
    (message,) = await receive(here, queue, wait=1)
    assert message["lease_seconds"] == 77
    assert hub.listening
