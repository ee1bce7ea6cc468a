"""Redrive policies, retry ladders, releases, peeking and dead-letter redrive."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from conftest import AppClient
from support import eventually, make_queue, positional, receive, send, wait_until

from app.db.engine import plain_url


async def dead_letter_pair(
    client: httpx.AsyncClient, max_receive_count: int = 3, **attributes: Any
) -> tuple[str, str]:
    dlq = await make_queue(client, "dlq", message_retention=1_209_600)
    source = await make_queue(
        client, "work", dead_letter_queue=dlq, max_receive_count=max_receive_count, **attributes
    )
    return source, dlq


async def test_failing_messages_land_in_the_dlq_exactly_once_under_concurrency(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    source, dlq = await dead_letter_pair(client, max_receive_count=3)
    response = await client.post(
        f"/v1/queues/{source}/messages",
        json={"messages": [{"body": f"job-{i}", "attributes": {"n": str(i)}} for i in range(40)]},
    )
    sent = {r["message_id"] for r in response.json()["results"]}
    sent_at = {r["message_id"]: r["sent_at"] for r in response.json()["results"]}
    deliveries: Counter[str] = Counter()

    async def failing_worker() -> None:
        # visibility_timeout=0: every receive "fails" and the message is visible
        # again at once: the hardest case for counting.
        while batch := await receive(client, source, max=10, visibility_timeout=0):
            for message in batch:
                deliveries[message["message_id"]] += 1
                assert message["receive_count"] <= 3

    await asyncio.gather(*(failing_worker() for _ in range(8)))
    assert set(deliveries) == sent
    assert set(deliveries.values()) == {3}, "delivered more or fewer times than the limit"

    peeked = (await client.get(f"/v1/queues/{dlq}/messages")).json()["messages"]
    assert {m["message_id"] for m in peeked} == sent
    for message in peeked:
        assert message["receive_count"] == 3
        assert message["dead_letter_source"] == source
        assert message["sent_at"] == sent_at[message["message_id"]]
        assert message["body"].startswith("job-")
        assert message["attributes"] == {"n": message["body"].split("-")[1]}
    rows = await db.fetch("SELECT message_id, queue_id FROM leaseq.messages")
    assert len(rows) == 40, "a message is in both queues, or lost"
    assert await receive(client, source) == []
    stats = (await client.get(f"/v1/queues/{dlq}")).json()["stats"]
    assert stats["visible"] == 40


async def test_a_waiting_dlq_receiver_is_woken_by_dead_lettering(
    client: httpx.AsyncClient,
) -> None:
    source, dlq = await dead_letter_pair(client, max_receive_count=1)
    message_id = await send(client, source)
    assert len(await receive(client, source, visibility_timeout=0)) == 1
    waiter = asyncio.create_task(receive(client, dlq, wait=20))
    hub = client.app.state.hub  # type: ignore[attr-defined]
    await wait_until(lambda: hub.parked() == 1)
    assert await receive(client, source) == []  # this claim moves the message
    (moved,) = await asyncio.wait_for(waiter, timeout=10)
    assert moved["message_id"] == message_id
    assert moved["receive_count"] == 2  # its count carries on in the DLQ


async def test_release_follows_the_retry_ladder_on_the_database_clock(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(
        client,
        visibility_timeout=60,
        retry_backoff={"initial": 10, "multiplier": 3, "max": 50, "jitter": 0},
    )
    await send(client, queue)
    delays = []
    for expected in (10, 30, 50, 50):
        (message,) = await receive(client, queue)
        before = await db.fetchval("SELECT clock_timestamp()")
        released = await client.post(
            f"/v1/queues/{queue}/messages/{message['receipt_handle']}/release"
        )
        assert released.status_code == 200, released.text
        after = await db.fetchval("SELECT clock_timestamp()")
        visible_at = datetime.fromisoformat(released.json()["visible_at"])
        assert before + timedelta(seconds=expected) <= visible_at
        assert visible_at <= after + timedelta(seconds=expected)
        delays.append(round(released.json()["delay_seconds"]))
        # Make it visible again now, through the holder's own handle.
        assert (await client.patch(
            f"/v1/queues/{queue}/messages/{message['receipt_handle']}/visibility",
            json={"timeout": 0},
        )).status_code == 200
    assert delays == [10, 30, 50, 50]
    stats = (await client.get(f"/v1/queues/{queue}")).json()["stats"]
    assert stats["visible"] == 1


async def test_release_jitter_stays_within_its_fraction(client: httpx.AsyncClient) -> None:
    queue = await make_queue(
        client, retry_backoff={"initial": 100, "multiplier": 1, "max": 100, "jitter": 0.5}
    )
    seen = set()
    for _ in range(12):
        await send(client, queue)
        (message,) = await receive(client, queue)
        released = await client.post(
            f"/v1/queues/{queue}/messages/{message['receipt_handle']}/release"
        )
        delay = released.json()["delay_seconds"]
        assert 50 <= delay <= 100
        seen.add(round(delay))
    assert len(seen) > 1  # it is random


async def test_release_without_a_ladder_or_with_a_delay(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client, visibility_timeout=600)
    await send(client, queue)
    (message,) = await receive(client, queue)
    base = f"/v1/queues/{queue}/messages/{message['receipt_handle']}"
    released = await client.post(f"{base}/release")
    assert released.json()["delay_seconds"] == 0
    (again,) = await receive(client, queue)
    assert again["receive_count"] == 2
    delayed = await client.post(
        f"/v1/queues/{queue}/messages/{again['receipt_handle']}/release", json={"delay": 120}
    )
    assert delayed.status_code == 200 and round(delayed.json()["delay_seconds"]) == 120
    stats = (await client.get(f"/v1/queues/{queue}")).json()["stats"]
    assert stats == {**stats, "visible": 0, "delayed": 1, "in_flight": 0}
    # The first handle was replaced by the second receive: its release is refused.
    stale = await client.post(f"{base}/release")
    assert stale.status_code == 409 and stale.json()["code"] == "lease_lost"
    for bad in ({"delay": -1}, {"delay": 43_201}, {"delay": "5"}, {"later": 1}):
        response = await client.post(
            f"/v1/queues/{queue}/messages/{again['receipt_handle']}/release", json=bad
        )
        assert response.status_code == 422, (bad, response.text)


async def test_invalid_redrive_policies(client: httpx.AsyncClient) -> None:
    await make_queue(client, "dlq")
    await make_queue(client, "work", dead_letter_queue="dlq", max_receive_count=5)
    cases = [
        ({"name": "x", "dead_letter_queue": "missing", "max_receive_count": 3}, 400),
        ({"name": "x", "dead_letter_queue": "x", "max_receive_count": 3}, 400),
        ({"name": "x", "dead_letter_queue": "dlq"}, 400),
        ({"name": "x", "max_receive_count": 3}, 400),
        ({"name": "x", "dead_letter_queue": "dlq", "max_receive_count": 0}, 422),
        ({"name": "x", "dead_letter_queue": "dlq", "max_receive_count": 1001}, 422),
        ({"name": "x", "dead_letter_queue": "a.b", "max_receive_count": 3}, 422),
    ]
    for body, status in cases:
        response = await client.post("/v1/queues", json=body)
        assert response.status_code == status, (body, response.text)
        if status == 400:
            assert response.json()["code"] == "invalid_redrive_policy"
    itself = await client.patch("/v1/queues/work", json={"dead_letter_queue": "work"})
    assert itself.status_code == 400
    in_use = await client.delete("/v1/queues/dlq")
    assert in_use.status_code == 409 and in_use.json()["code"] == "queue_in_use"
    assert "work" in in_use.json()["detail"]
    sources = await client.get("/v1/queues/dlq/dead-letter-sources")
    assert sources.json() == {"queues": ["work"]}
    # Removing the policy frees the dead-letter queue.
    removed = await client.patch("/v1/queues/work", json={"dead_letter_queue": None})
    assert removed.status_code == 200
    assert removed.json()["attributes"]["max_receive_count"] is None
    assert (await client.delete("/v1/queues/dlq")).status_code == 204


async def test_redrive_moves_messages_back_with_a_fresh_count(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    source, dlq = await dead_letter_pair(client, max_receive_count=1)
    for i in range(25):
        await send(client, source, f"m{i}")
    while await receive(client, source, max=10, visibility_timeout=0):
        pass
    assert (await client.get(f"/v1/queues/{dlq}")).json()["stats"]["visible"] == 25

    started = await client.post(f"/v1/queues/{dlq}/redrive", json={})
    assert started.status_code == 202, started.text
    task = started.json()
    assert task["status"] in ("running", "completed")
    assert task["to_move_at_start"] == 25
    done: dict[str, Any] = {}

    async def finished() -> bool:
        done.update((await client.get(f"/v1/redrive-tasks/{task['task_id']}")).json())
        return done["status"] == "completed"

    await eventually(finished)
    assert done["moved"] == 25 and done["remaining"] == 0
    back = []
    while batch := await receive(client, source, max=10, visibility_timeout=600):
        back.extend(batch)
    assert len(back) == 25
    assert {m["receive_count"] for m in back} == {1}  # a fresh count, then this receive
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 25
    listed = (await client.get(f"/v1/queues/{dlq}/redrive")).json()["tasks"]
    assert [t["task_id"] for t in listed] == [task["task_id"]]


async def test_redrive_to_a_destination_at_a_rate_and_cancel(
    client: httpx.AsyncClient,
) -> None:
    await make_queue(client, "dlq")
    await make_queue(client, "elsewhere")
    await client.post(
        "/v1/queues/dlq/messages", json={"messages": [{"body": str(i)} for i in range(60)]}
    )
    started = await client.post(
        "/v1/queues/dlq/redrive", json={"destination": "elsewhere", "max_per_second": 10}
    )
    assert started.status_code == 202
    task_id = started.json()["task_id"]
    again = await client.post("/v1/queues/dlq/redrive", json={})
    assert again.status_code == 409 and again.json()["code"] == "redrive_in_progress"

    async def moved() -> int:
        return int((await client.get(f"/v1/redrive-tasks/{task_id}")).json()["moved"])

    async def ten_moved() -> bool:
        return await moved() >= 10

    await eventually(ten_moved)
    cancelled = await client.delete(f"/v1/redrive-tasks/{task_id}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    count = cancelled.json()["moved"]
    assert 10 <= count < 60  # the rate kept it from finishing at once
    stats = (await client.get("/v1/queues/elsewhere")).json()["stats"]
    dlq_stats = (await client.get("/v1/queues/dlq")).json()["stats"]
    assert stats["visible"] + dlq_stats["visible"] == 60
    assert stats["visible"] >= count
    missing = await client.get("/v1/redrive-tasks/not-a-task")
    assert missing.status_code == 404 and missing.json()["code"] == "task_not_found"


async def test_a_redrive_whose_connections_are_killed_loses_and_duplicates_nothing(
    app_factory: AppClient, db: asyncpg.Connection
) -> None:
    client = await app_factory(redrive_hold_seconds=1)
    source, dlq = await dead_letter_pair(client, max_receive_count=1)
    await client.post(
        f"/v1/queues/{source}/messages",
        json={"messages": [{"body": str(i)} for i in range(80)]},
    )
    while await receive(client, source, max=10, visibility_timeout=0):
        pass
    ids = {r["message_id"] for r in await db.fetch("SELECT message_id FROM leaseq.messages")}
    assert len(ids) == 80
    task_id = (await client.post(f"/v1/queues/{dlq}/redrive", json={"max_per_second": 40})
               ).json()["task_id"]
    for _ in range(4):  # kill every service connection, mid-batch or not, four times
        await asyncio.sleep(0.15)
        await db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = 'leaseq'"
        )
        rows = await db.fetch("SELECT message_id FROM leaseq.messages")
        assert {r["message_id"] for r in rows} == ids and len(rows) == 80

    async def status() -> str:
        response = await client.get(f"/v1/redrive-tasks/{task_id}")
        if response.status_code == 503:  # its connection was just killed
            return "running"
        return str(response.json()["status"])

    async def completed() -> bool:
        return await status() == "completed"

    await eventually(completed, seconds=30)
    rows = await db.fetch("SELECT message_id, queue_id, receive_count FROM leaseq.messages")
    assert {r["message_id"] for r in rows} == ids and len(rows) == 80
    source_id = await db.fetchval("SELECT id FROM leaseq.queues WHERE name = $1", source)
    assert {r["queue_id"] for r in rows} == {source_id}
    assert {r["receive_count"] for r in rows} == {0}


async def test_a_redrive_batch_killed_before_commit_changes_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection, database_url: str
) -> None:
    """The batch statement itself, run in a transaction whose backend is killed
    before it commits: no message moves, the task counts nothing."""
    await make_queue(client, "dlq")
    await make_queue(client, "elsewhere")
    await client.post("/v1/queues/dlq/messages",
                      json={"messages": [{"body": str(i)} for i in range(30)]})
    # A task nobody runs yet (it is created directly, held far into the future).
    task_id = await db.fetchval(
        "INSERT INTO leaseq.redrive_tasks (source_queue_id, destination_queue_id, "
        "to_move_at_start, "
        "runner_until) SELECT d.id, e.id, 30, now() + interval '1 hour' "
        "FROM leaseq.queues d, leaseq.queues e WHERE d.name = 'dlq' AND e.name = 'elsewhere' "
        "RETURNING id"
    )
    victim = await asyncpg.connect(plain_url(database_url))
    sql, args = positional("redrive_batch", {"task_id": task_id, "batch": 20, "hold": 5})
    transaction = victim.transaction()
    await transaction.start()
    row = await victim.fetchrow(sql, *args)
    assert row["moved"] == 20  # moved, inside the open transaction
    await db.execute("SELECT pg_terminate_backend($1)", victim.get_server_pid())
    with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError,
                        asyncpg.InternalClientError, ConnectionError)):
        await transaction.commit()
    victim.terminate()
    counts = dict(await db.fetch(
        "SELECT q.name, count(m.id) FROM leaseq.queues q LEFT JOIN leaseq.messages m ON "
        "m.queue_id = q.id "
        "GROUP BY q.name"
    ))
    assert counts == {"dlq": 30, "elsewhere": 0}
    assert await db.fetchval("SELECT moved FROM leaseq.redrive_tasks WHERE id = $1", task_id) == 0


async def test_peek_by_state_with_paging_and_truncation(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, visibility_timeout=600)
    for i in range(5):
        await send(client, queue, f"body-{i}-" + "x" * 50)
    await send(client, queue, "later", delay=600)
    claimed = await receive(client, queue, max=2)
    by_state = {}
    for state in ("visible", "in_flight", "delayed"):
        got = (await client.get(f"/v1/queues/{queue}/messages", params={"state": state})).json()
        by_state[state] = got["messages"]
        assert all(m["state"] == state for m in got["messages"])
    assert [len(by_state[s]) for s in ("visible", "in_flight", "delayed")] == [3, 2, 1]
    # In flight: the holder's fencing token and what is left of its lease.
    tokens = {m["receipt_handle"]: m["fencing_token"] for m in claimed}
    assert sorted(m["fencing_token"] for m in by_state["in_flight"]) == sorted(tokens.values())
    assert all(590 < m["lease_remaining_seconds"] <= 600 for m in by_state["in_flight"])
    assert all(m["fencing_token"] is None and m["lease_remaining_seconds"] is None
               for m in by_state["visible"] + by_state["delayed"])
    page = (await client.get(f"/v1/queues/{queue}/messages",
                             params={"limit": 4, "body_chars": 6})).json()
    assert len(page["messages"]) == 4 and page["next_after"]
    assert all(m["body"] == "body-" + m["body"][5] and m["truncated"]
               for m in page["messages"] if m["body"] != "later")
    rest = (await client.get(f"/v1/queues/{queue}/messages",
                             params={"after": page["next_after"]})).json()
    assert len(rest["messages"]) == 2 and rest["next_after"] is None
    # Peeking claims nothing.
    assert (await client.get(f"/v1/queues/{queue}")).json()["stats"]["in_flight"] == 2
    for bad in ({"state": "gone"}, {"limit": 0}, {"after": "x"}, {"body_chars": -1}):
        response = await client.get(f"/v1/queues/{queue}/messages", params=bad)
        assert response.status_code == 422, bad


async def test_not_before_is_judged_on_the_database_clock(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, message_retention=3600)
    db_now = await db.fetchval("SELECT clock_timestamp()")
    soon = (db_now + timedelta(seconds=2)).isoformat()
    await send(client, queue, "scheduled", not_before=soon)
    await send(client, queue, "past", not_before=(db_now - timedelta(days=1)).isoformat())
    await send(client, queue, "far", not_before=(db_now + timedelta(days=30)).isoformat())
    (past,) = await receive(client, queue, max=10)
    assert past["body"] == "past"
    (scheduled,) = await receive(client, queue, wait=10)
    assert scheduled["body"] == "scheduled"
    assert datetime.fromisoformat(scheduled["first_received_at"]) >= db_now + timedelta(seconds=2)
    # Beyond retention it is clamped to it: visible before it would expire.
    far = await db.fetchval(
        "SELECT visible_at - sent_at FROM leaseq.messages WHERE body = 'far'"
    )
    assert far <= timedelta(seconds=3600)
    both = await client.post(f"/v1/queues/{queue}/messages",
                             json={"body": "x", "delay": 1, "not_before": soon})
    assert both.status_code == 422
    naive = await client.post(f"/v1/queues/{queue}/messages",
                              json={"body": "x", "not_before": "2030-01-01T00:00:00"})
    assert naive.status_code == 422


@pytest.mark.parametrize("attribute", ["dead_letter_queue", "retry_backoff"])
async def test_queue_shows_its_policies(client: httpx.AsyncClient, attribute: str) -> None:
    await make_queue(client, "dlq")
    await make_queue(
        client, "work", dead_letter_queue="dlq", max_receive_count=4,
        retry_backoff={"initial": 1, "multiplier": 2, "max": 60, "jitter": 0.1},
    )
    attributes = (await client.get("/v1/queues/work")).json()["attributes"]
    assert attributes["dead_letter_queue"] == "dlq" and attributes["max_receive_count"] == 4
    assert attributes["retry_backoff"] == {"initial": 1, "multiplier": 2, "max": 60,
                                           "jitter": 0.1}
    removed = await client.patch("/v1/queues/work", json={attribute: None})
    assert removed.json()["attributes"][attribute] is None
    unchanged = "retry_backoff" if attribute == "dead_letter_queue" else "dead_letter_queue"
    assert removed.json()["attributes"][unchanged] is not None


async def test_expired_lease_does_not_use_the_ladder(client: httpx.AsyncClient) -> None:
    """A crashed worker's message comes back when its lease expires, not later:
    the ladder applies only to explicit releases (see docs/state-machine.md)."""
    queue = await make_queue(
        client, visibility_timeout=1,
        retry_backoff={"initial": 300, "multiplier": 2, "max": 600, "jitter": 0},
    )
    await send(client, queue)
    (first,) = await receive(client, queue)
    (second,) = await receive(client, queue, wait=10)
    reclaimed_at = datetime.fromisoformat(second["lease_expires_at"]) - timedelta(seconds=1)
    assert reclaimed_at - datetime.fromisoformat(first["lease_expires_at"]) < timedelta(seconds=5)


async def test_a_task_whose_runner_died_is_taken_over_and_finished(
    app_factory: AppClient, db: asyncpg.Connection
) -> None:
    """A task left 'running' by a runner that died (its hold has run out) is
    resumed by another process's runner, from where it stopped."""
    setup = await app_factory()
    await make_queue(setup, "dlq")
    await make_queue(setup, "elsewhere")
    await setup.post("/v1/queues/dlq/messages",
                     json={"messages": [{"body": str(i)} for i in range(50)]})
    # Half moved by the dead runner before it died: 25 already in "elsewhere".
    task_id = await db.fetchval(
        "INSERT INTO leaseq.redrive_tasks (source_queue_id, destination_queue_id, "
        "to_move_at_start, "
        "moved, runner_until) SELECT d.id, e.id, 50, 25, now() - interval '1 second' "
        "FROM leaseq.queues d, leaseq.queues e WHERE d.name = 'dlq' AND e.name = 'elsewhere' "
        "RETURNING id"
    )
    await db.execute(
        "UPDATE leaseq.messages SET queue_id = (SELECT id FROM leaseq.queues WHERE name = "
        "'elsewhere') "
        "WHERE id IN (SELECT id FROM leaseq.messages ORDER BY id LIMIT 25)"
    )
    survivor = await app_factory(redrive_scan_seconds=0.1)

    async def completed() -> bool:
        task = (await survivor.get(f"/v1/redrive-tasks/{task_id}")).json()
        return bool(task["status"] == "completed")

    await eventually(completed)
    task = (await survivor.get(f"/v1/redrive-tasks/{task_id}")).json()
    assert task["moved"] == 50 and task["remaining"] == 0
    counts = dict(await db.fetch(
        "SELECT q.name, count(m.id) FROM leaseq.queues q LEFT JOIN leaseq.messages m ON "
        "m.queue_id = q.id "
        "GROUP BY q.name"
    ))
    assert counts == {"dlq": 0, "elsewhere": 50}


async def test_deleting_a_destination_waits_for_a_running_batch_instead_of_deadlocking(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    await make_queue(client, "dlq")
    await make_queue(client, "elsewhere")
    await client.post("/v1/queues/dlq/messages",
                      json={"messages": [{"body": str(i)} for i in range(5)]})
    started = await client.post(
        "/v1/queues/dlq/redrive", json={"destination": "elsewhere", "max_per_second": 1}
    )
    task_id = started.json()["task_id"]
    destination = await db.fetchval("SELECT id FROM leaseq.queues WHERE name = 'elsewhere'")
    # A batch's locks, taken by hand: the task first, then (moving a row into the
    # destination) the destination's queue row, which the foreign key checks.
    async with db.transaction():
        await db.execute("SELECT 1 FROM leaseq.redrive_tasks WHERE id = $1 FOR UPDATE", task_id)
        deleting = asyncio.create_task(client.delete("/v1/queues/elsewhere"))

        async def delete_waits() -> bool:
            return bool(await db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND pid <> pg_backend_pid()"))

        await eventually(delete_waits)
        # Had the delete locked the destination first, this would deadlock with it.
        moved = await db.execute(
            "UPDATE leaseq.messages SET queue_id = $1 WHERE id = "
            "(SELECT min(id) FROM leaseq.messages WHERE queue_id = "
            " (SELECT id FROM leaseq.queues WHERE name = 'dlq'))", destination)
        assert moved == "UPDATE 1"
    assert (await deleting).status_code == 204

    async def failed() -> bool:
        task = (await client.get(f"/v1/redrive-tasks/{task_id}")).json()
        return bool(task["status"] == "failed")

    await eventually(failed)
