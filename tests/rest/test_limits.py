"""Limits that hold before the work is done: long polls past a cap, heartbeats
past their share of the pool and requests past the pool are refused in bounded
time with 503 (never left to hang), and a peek cannot ask for a gigabyte."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import asyncpg
import boto3
import httpx
import pytest
import uvicorn
from botocore.config import Config
from conftest import AppClient
from sqs_clients import client, refusal, run
from support import TEST_SECRET, make_queue, receive, send, wait_until

from app.cli import _run_uvicorn
from app.config import Settings
from app.db.connector import Connector
from app.db.engine import create_engine, dialer
from app.errors import DatabaseUnavailable, Overloaded
from app.queue.catalog import QueueCatalog
from app.queue.waiting import CALLER_KEY, Ready, WaitHub
from app.sqs.errors import from_engine


def _state(client: httpx.AsyncClient) -> Any:
    return client.app.state  # type: ignore[attr-defined]


def _refused(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "overloaded"
    assert int(response.headers["retry-after"]) >= 1


# -- long polls ----------------------------------------------------------------------


def test_seats_run_out_per_queue_and_per_process() -> None:
    hub = WaitHub(max_waiters=3, max_waiters_per_queue=2)
    first = hub.take_seat(1)
    hub.take_seat(1)
    with pytest.raises(Overloaded, match="This queue") as refused:
        hub.take_seat(1)
    assert refused.value.retry_after >= 1
    second = hub.take_seat(2)
    with pytest.raises(Overloaded, match="This service process"):
        hub.take_seat(3)
    assert (hub.seated(), hub.seated(1), hub.seated(2)) == (3, 2, 1)
    hub.free_seat(first)
    hub.take_seat(3)
    hub.free_seat(second)
    hub.take_seat(1)
    assert (hub.seated(), hub.seated(1), hub.seated(2), hub.seated(3)) == (3, 2, 0, 1)


def test_one_key_takes_at_most_its_share_of_the_seats() -> None:
    hub = WaitHub(max_waiters=4, max_waiters_per_queue=4, max_waiters_per_key=2)
    greedy = CALLER_KEY.set("LQGREEDY")
    try:
        held = [hub.take_seat(1), hub.take_seat(2)]
        with pytest.raises(Overloaded, match="This key") as refused:
            hub.take_seat(3)
        assert refused.value.retry_after >= 1
    finally:
        CALLER_KEY.reset(greedy)
    polite = CALLER_KEY.set("LQPOLITE")
    try:
        hub.take_seat(1)  # another key still has seats
    finally:
        CALLER_KEY.reset(polite)
    hub.free_seat(held[0])
    greedy = CALLER_KEY.set("LQGREEDY")
    try:
        hub.take_seat(3)  # its seat given back, the key may wait again
    finally:
        CALLER_KEY.reset(greedy)
    assert hub.seated() == 3


async def test_a_long_poll_past_the_queue_cap_is_refused_and_a_short_poll_never_is(
    client: httpx.AsyncClient,
) -> None:
    hub = _state(client).hub
    hub.max_waiters_per_queue = 2
    queue = await make_queue(client, "capped")
    other = await make_queue(client, "other")
    polls = [asyncio.create_task(receive(client, queue, wait=20)) for _ in range(2)]
    await wait_until(lambda: hub.parked() == 2)

    _refused(await client.get(f"/v1/queues/{queue}/receive", params={"wait": 20}))
    # The queue's default wait (receive_wait) is a long poll too.
    await client.patch(f"/v1/queues/{queue}", json={"receive_wait": 20})
    _refused(await client.get(f"/v1/queues/{queue}/receive"))
    short = await client.get(f"/v1/queues/{queue}/receive", params={"wait": 0})
    assert short.status_code == 200 and short.json()["messages"] == []

    elsewhere = asyncio.create_task(receive(client, other, wait=20))
    await wait_until(lambda: hub.parked() == 3)

    # A poll that got its message gives its seat back.
    await send(client, queue, "first")
    done, waiting = await asyncio.wait(polls, return_when=asyncio.FIRST_COMPLETED)
    assert [m["body"] for m in done.pop().result()] == ["first"]
    await wait_until(lambda: hub.seated() == 2)
    waiting.add(asyncio.create_task(receive(client, queue, wait=20)))
    await wait_until(lambda: hub.parked() == 3)

    for body in ("a", "b"):
        await send(client, queue, body)
    await send(client, other, "c")
    results = await asyncio.gather(*waiting, elsewhere)
    assert sorted(m["body"] for got in results for m in got) == ["a", "b", "c"]
    assert hub.seated() == 0


async def test_a_long_poll_past_the_process_cap_is_refused(client: httpx.AsyncClient) -> None:
    hub = _state(client).hub
    hub.max_waiters = 2
    for name in ("q1", "q2", "q3"):
        await make_queue(client, name)
    polls = [asyncio.create_task(receive(client, q, wait=20)) for q in ("q1", "q2")]
    await wait_until(lambda: hub.parked() == 2)
    _refused(await client.get("/v1/queues/q3/receive", params={"wait": 20}))
    await send(client, "q1", "x")
    await send(client, "q2", "y")
    assert [len(got) for got in await asyncio.gather(*polls)] == [1, 1]


async def test_an_admitted_long_poll_keeps_its_seat_while_it_looks_again(
    app_factory: AppClient, db: asyncpg.Connection
) -> None:
    """Woken, a receiver leaves the line to look; its seat is not up for grabs
    meanwhile, so a newcomer is refused rather than the poll already waiting."""
    client = await app_factory(pool_size=1)
    state = _state(client)
    hub = state.hub
    hub.max_waiters_per_queue = 1
    queue = await make_queue(client, "seated")
    first = asyncio.create_task(receive(client, queue, wait=20))
    await wait_until(lambda: hub.parked() == 1)
    queue_id = await db.fetchval("SELECT id FROM leaseq.queues WHERE name = $1", queue)
    async with state.db.engine.connect():  # the only connection: its look waits
        hub.announce(Ready(queue_id, 1))  # woken, with nothing for it
        await wait_until(lambda: hub.parked() == 0)
        _refused(await client.get(f"/v1/queues/{queue}/receive", params={"wait": 20}))
    await wait_until(lambda: hub.parked() == 1)  # looked, found nothing, waits again
    await send(client, queue, "yours")
    assert [m["body"] for m in await first] == ["yours"]


async def test_sqs_clients_are_throttled_and_retry(served: tuple[str, Any]) -> None:
    """SQS's own throttling answer, which the SDKs back off and retry on: botocore's
    standard mode by its name, its legacy mode by its name and 403."""
    assert from_engine(Overloaded()).name == "RequestThrottled"
    base, app = served
    async with httpx.AsyncClient(base_url=base) as http:
        await http.post("/v1/queues", json={"name": "throttled"})
        app.state.hub.max_waiters_per_queue = 1
        poll = asyncio.create_task(
            http.get("/v1/queues/throttled/receive", params={"wait": 20}, timeout=60)
        )
        await wait_until(lambda: app.state.hub.parked() == 1)
        url = f"{base}/000000000000/throttled"
        for mode in ("standard", "legacy"):
            sqs = boto3.client(
                "sqs", endpoint_url=base, region_name="us-east-1",
                aws_access_key_id="any", aws_secret_access_key="any",
                config=Config(retries={"mode": mode, "total_max_attempts": 2}),
            )
            with pytest.raises(sqs.exceptions.RequestThrottled) as refused:
                await run(sqs.receive_message, QueueUrl=url, WaitTimeSeconds=20)
            error = refused.value.response
            assert error["ResponseMetadata"]["HTTPStatusCode"] == 403
            assert error["ResponseMetadata"]["RetryAttempts"] == 1, mode
        await http.post("/v1/queues/throttled/messages", json={"body": "done"})
        assert (await poll).status_code == 200


# -- connections -----------------------------------------------------------------------


async def test_a_heartbeat_past_its_share_of_the_pool_is_refused_in_bounded_time(
    app_factory: AppClient, db: asyncpg.Connection
) -> None:
    client = await app_factory(pool_size=1)  # one connection, all of it the beats' share
    service = _state(client).service
    service.pool_wait_seconds = 0.5
    handles = {}
    for name in ("stuck", "waiting"):
        await make_queue(client, name)
        await send(client, name)
        (message,) = await receive(client, name)
        handles[name] = f"/v1/queues/{name}/messages/{message['receipt_handle']}/visibility"

    async with db.transaction():
        # The stuck beat's UPDATE waits on this lock, holding the share and the pool.
        await db.execute(
            "SELECT 1 FROM leaseq.messages WHERE queue_id = "
            "(SELECT id FROM leaseq.queues WHERE name = 'stuck') FOR UPDATE"
        )
        stuck = asyncio.create_task(client.patch(handles["stuck"], json={"timeout": 60}))
        await wait_until(lambda: service.group.budgeted_in_flight == 1)
        started = time.monotonic()
        async with asyncio.timeout(10):
            waiting = await client.patch(handles["waiting"], json={"timeout": 60})
        _refused(waiting)
        assert time.monotonic() - started < 5
        async with asyncio.timeout(10):
            _refused(await stuck)
    # The lock gone, the stuck statement ends and the share is free again.
    await wait_until(lambda: service.group.budgeted_in_flight == 0)
    answered = await client.patch(handles["waiting"], json={"timeout": 60})
    assert answered.status_code == 200, answered.text


async def test_a_request_finding_no_free_connection_fails_in_bounded_time(
    database_url: str,
) -> None:
    engine = create_engine(
        database_url, pool_size=1, pool_timeout=0.3, dial=dialer(Settings()), pgbouncer="off"
    )
    catalog = QueueCatalog(Connector(engine), WaitHub())
    try:
        async with engine.connect():  # the pool's only connection, held
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable, match="in time"):
                async with asyncio.timeout(10):
                    await catalog.list_queues()
            assert time.monotonic() - started < 5
        assert await catalog.list_queues() == []
    finally:
        await engine.dispose()


# -- peek ------------------------------------------------------------------------------


async def test_peek_cuts_bodies_by_default_and_refuses_pages_over_the_cap(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client, "peeked")
    await send(client, queue, "x" * 3000)
    (shown,) = (await client.get(f"/v1/queues/{queue}/messages")).json()["messages"]
    assert len(shown["body"]) == 1024 and shown["truncated"]

    at_cap = {"limit": 10, "body_chars": 1_048_576}
    (whole,) = (await client.get(f"/v1/queues/{queue}/messages", params=at_cap)).json()[
        "messages"
    ]
    assert len(whole["body"]) == 3000 and not whole["truncated"]
    over = await client.get(
        f"/v1/queues/{queue}/messages", params={"limit": 11, "body_chars": 1_048_576}
    )
    assert over.status_code == 422
    assert over.json()["code"] == "validation_error"
    assert "limit * body_chars must be at most 10485760" in over.json()["detail"]


# -- configuration ---------------------------------------------------------------------


def _uvicorn_config(monkeypatch: pytest.MonkeyPatch, **settings: Any) -> uvicorn.Config:
    seen: list[uvicorn.Config] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: seen.append(self.config))
    # The config's logging is the served process's, not this test process's.
    monkeypatch.setattr(uvicorn.Config, "configure_logging", lambda self: None)
    _run_uvicorn(Settings(**settings), workers=1)
    (config,) = seen
    return config


def test_uvicorn_turns_requests_away_only_above_the_waiter_cap(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    base = {"database_url": "postgresql://nobody@127.0.0.1/none", "data_dir": tmp_path,
            "secret": TEST_SECRET}
    config = _uvicorn_config(monkeypatch, **base, max_waiters=40, keep_alive_seconds=9)
    assert config.limit_concurrency == 1040
    assert config.timeout_keep_alive == 9
    config = _uvicorn_config(monkeypatch, **base, limit_concurrency=77)
    assert config.limit_concurrency == 77
    defaults = Settings(**base)
    assert defaults.limit_concurrency is None
    assert defaults.max_waiters > defaults.max_waiters_per_queue


async def test_the_settings_reach_the_pool_the_hub_and_the_service(
    app_factory: AppClient,
) -> None:
    client = await app_factory(max_waiters=7, max_waiters_per_queue=3, pool_wait_seconds=0.25)
    state = _state(client)
    assert (state.hub.max_waiters, state.hub.max_waiters_per_queue) == (7, 3)
    assert state.service.pool_wait_seconds == 0.25
    assert state.db.engine.pool.timeout() == 0.25


# -- per key -------------------------------------------------------------------------

KEYED_ADMIN = "LQBOOTSTRAPADMIN0001.admin-secret-0123456789abcdefghij"


@pytest.mark.parametrize("door", ["rest", "sqs"])
async def test_one_key_cannot_take_every_long_poll_seat(
    serve_factory: Any, door: str
) -> None:
    """A key past its share of the seats gets 503 overloaded on its next long
    poll, while another key's long polls are still seated."""
    endpoint, app = await serve_factory(admin_key=KEYED_ADMIN, max_waiters=4,
                                        key_waiter_share=0.5)
    greedy_id, greedy_secret = (await app.state.keys.create("greedy", ["admin:*"]))
    other_id, other_secret = (await app.state.keys.create("other", ["admin:*"]))
    greedy = {"Authorization": f"Bearer {greedy_id.id}.{greedy_secret}"}
    other = {"Authorization": f"Bearer {other_id.id}.{other_secret}"}
    async with httpx.AsyncClient(base_url=endpoint, timeout=30) as http:
        assert (await http.post("/v1/queues", json={"name": "seats"},
                                headers=greedy)).status_code == 201
        hub = app.state.hub
        polls = [asyncio.create_task(http.get("/v1/queues/seats/receive",
                                               params={"wait": 20}, headers=greedy))
                 for _ in range(2)]
        await wait_until(lambda: hub.seated() == 2)
        if door == "rest":
            _refused(await http.get("/v1/queues/seats/receive", params={"wait": 20},
                                    headers=greedy))
        else:
            sqs = client(endpoint, "json", key=greedy_id.id, secret=greedy_secret)
            code, _ = await refusal(sqs.receive_message, QueueUrl=f"{endpoint}/000000000000/seats",
                                    WaitTimeSeconds=20)
            assert code == "RequestThrottled", code
        seated = asyncio.create_task(http.get("/v1/queues/seats/receive",
                                              params={"wait": 20}, headers=other))
        await wait_until(lambda: hub.seated() == 3)
        await http.post("/v1/queues/seats/messages", json={"messages": [
            {"body": str(i)} for i in range(3)]}, headers=other)
        answers = await asyncio.gather(*polls, seated)
        assert [a.status_code for a in answers] == [200, 200, 200]


@pytest.mark.parametrize("door", ["rest", "sqs"])
async def test_one_key_cannot_take_every_long_poll_seat_of_a_shared_queue(
    serve_factory: Any, door: str
) -> None:
    """Within its process share, a key still takes at most its share of one queue's
    seats: a key polling a queue it shares with others leaves them seats there,
    and what it holds on one queue does not count on another."""
    endpoint, app = await serve_factory(admin_key=KEYED_ADMIN, max_waiters=100,
                                        max_waiters_per_queue=4, key_waiter_share=0.5)
    greedy_id, greedy_secret = (await app.state.keys.create("greedy", ["admin:*"]))
    other_id, other_secret = (await app.state.keys.create("other", ["admin:*"]))
    greedy = {"Authorization": f"Bearer {greedy_id.id}.{greedy_secret}"}
    other = {"Authorization": f"Bearer {other_id.id}.{other_secret}"}
    hub = app.state.hub
    async with httpx.AsyncClient(base_url=endpoint, timeout=30) as http:
        for name in ("shared", "elsewhere"):
            assert (await http.post("/v1/queues", json={"name": name},
                                    headers=greedy)).status_code == 201

        def poll(queue: str, headers: dict[str, str]) -> asyncio.Task[httpx.Response]:
            return asyncio.create_task(http.get(f"/v1/queues/{queue}/receive",
                                                params={"wait": 20}, headers=headers))

        polls = [poll("shared", greedy) for _ in range(2)]
        await wait_until(lambda: hub.seated() == 2)
        if door == "rest":
            _refused(await http.get("/v1/queues/shared/receive", params={"wait": 20},
                                    headers=greedy))
        else:
            sqs = client(endpoint, "json", key=greedy_id.id, secret=greedy_secret)
            code, _ = await refusal(sqs.receive_message,
                                    QueueUrl=f"{endpoint}/000000000000/shared",
                                    WaitTimeSeconds=20)
            assert code == "RequestThrottled", code
        polls += [poll("shared", other), poll("elsewhere", greedy)]
        await wait_until(lambda: hub.seated() == 4)
        for name, count in (("shared", 3), ("elsewhere", 1)):
            await http.post(f"/v1/queues/{name}/messages", json={"messages": [
                {"body": str(i)} for i in range(count)]}, headers=other)
        answers = await asyncio.gather(*polls)
        assert [a.status_code for a in answers] == [200, 200, 200, 200]


def test_a_keys_share_of_a_queue_is_below_the_queue_cap() -> None:
    """The same share of a queue's seats as of the process's, at least one, and
    one fewer than the queue cap even at a share of 1.0 (else one key, the only
    one allowed past the process share, could still fill a queue)."""
    seats = [Settings(max_waiters_per_queue=cap, key_waiter_share=share)
             .waiters_per_key_on_a_queue()
             for cap, share in ((1000, 0.5), (4, 0.5), (4, 1.0), (4, 0.01), (1, 1.0))]
    assert seats == [500, 2, 3, 1, 1]


async def test_a_key_has_at_most_its_requests_in_progress(serve_factory: Any) -> None:
    endpoint, app = await serve_factory(admin_key=KEYED_ADMIN, key_concurrency=2)
    info, secret = await app.state.keys.create("busy", ["admin:*"])
    headers = {"Authorization": f"Bearer {info.id}.{secret}"}
    admin = {"Authorization": f"Bearer {KEYED_ADMIN}"}
    async with httpx.AsyncClient(base_url=endpoint, timeout=30) as http:
        await http.post("/v1/queues", json={"name": "busy"}, headers=headers)
        polls = [asyncio.create_task(http.get("/v1/queues/busy/receive",
                                               params={"wait": 20}, headers=headers))
                 for _ in range(2)]
        await wait_until(lambda: app.state.hub.seated() == 2)
        limited = await http.get("/v1/queues/busy", headers=headers)
        assert limited.status_code == 429 and limited.json()["code"] == "rate_limited"
        assert int(limited.headers["retry-after"]) >= 1
        assert (await http.get("/v1/queues/busy", headers=admin)).status_code == 200
        await http.post("/v1/queues/busy/messages", json={"messages": [
            {"body": "a"}, {"body": "b"}]}, headers=admin)
        assert [p.status_code for p in await asyncio.gather(*polls)] == [200, 200]
        assert (await http.get("/v1/queues/busy", headers=headers)).status_code == 200
