"""Leases: exclusive claims, expiry without a sweeper, heartbeats, stale handles,
fencing tokens, checkpoints, releases."""

from __future__ import annotations

import asyncio
import random
from datetime import datetime

import asyncpg
import httpx
from conftest import AppClient
from support import make_queue, receive, send

MESSAGE_ROW = "SELECT visible_at, claim_token, receive_count, checkpoint FROM leaseq.messages"


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


async def test_concurrent_receivers_never_get_the_same_message(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client, visibility_timeout=600)
    rng = random.Random(7)
    for round_ in range(3):
        response = await client.post(
            f"/v1/queues/{queue}/messages",
            json={"messages": [{"body": f"{round_}-{i}"} for i in range(100)]},
        )
        assert response.json()["succeeded"] == 100
        sent = {r["message_id"] for r in response.json()["results"]}
        if round_ == 1:
            more = await client.post(
                f"/v1/queues/{queue}/messages",
                json={"messages": [{"body": f"x-{i}"} for i in range(100)]},
            )
            sent |= {r["message_id"] for r in more.json()["results"]}

        async def worker() -> list[str]:
            got: list[str] = []
            while True:
                batch = await receive(client, queue, max=rng.randint(1, 10))
                if not batch:
                    return got
                got.extend(m["message_id"] for m in batch)

        results = await asyncio.gather(*(worker() for _ in range(8)))
        received = [mid for got in results for mid in got]
        assert len(received) == len(set(received)), "a message was handed to two receivers"
        assert set(received) == sent
        # The work really was spread: several receivers got messages.
        assert sum(1 for got in results if got) >= 2


async def test_concurrent_claims_at_the_sql_level_are_disjoint(
    client: httpx.AsyncClient, app_factory: AppClient
) -> None:
    """Receivers in separate app instances (separate pools) race on the same rows."""
    queue = await make_queue(client, visibility_timeout=600)
    await client.post(
        f"/v1/queues/{queue}/messages",
        json={"messages": [{"body": str(i)} for i in range(100)]},
    )
    clients = [client, await app_factory(), await app_factory()]

    async def drain(c: httpx.AsyncClient) -> list[str]:
        got: list[str] = []
        while batch := await receive(c, queue, max=3):
            got.extend(m["message_id"] for m in batch)
        return got

    results = await asyncio.gather(*(drain(c) for c in clients for _ in range(3)))
    received = [m for got in results for m in got]
    assert len(received) == 100 == len(set(received))


async def test_an_expired_lease_is_claimed_again_by_the_claim_itself(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    # The retention sweeper runs once an hour in tests: only the claim acts.
    queue = await make_queue(client, visibility_timeout=1)
    message_id = await send(client, queue)
    (first,) = await receive(client, queue)
    assert await receive(client, queue) == []
    # The long poll wakes when the lease expires, by the database clock.
    (second,) = await receive(client, queue, wait=10)
    assert second["message_id"] == message_id
    assert second["receive_count"] == 2
    assert second["receipt_handle"] != first["receipt_handle"]
    assert second["fencing_token"] > first["fencing_token"]
    assert second["first_received_at"] == first["first_received_at"]
    expired_at = await db.fetchval("SELECT clock_timestamp()")
    assert _ts(second["first_received_at"]) < expired_at


async def test_a_heartbeat_keeps_the_message_invisible_past_its_first_deadline(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, visibility_timeout=1)
    await send(client, queue)
    (message,) = await receive(client, queue)
    first_deadline = _ts(message["lease_expires_at"])
    beat = await client.patch(
        f"/v1/queues/{queue}/messages/{message['receipt_handle']}/visibility",
        json={"timeout": 30},
    )
    assert beat.status_code == 200, beat.text
    assert beat.json()["lease_seconds"] == 30
    assert _ts(beat.json()["lease_expires_at"]) > first_deadline
    # Wait out the original lease (a long poll that would take the message).
    assert await receive(client, queue, wait=3) == []
    assert await db.fetchval("SELECT clock_timestamp()") > first_deadline
    stats = (await client.get(f"/v1/queues/{queue}")).json()["stats"]
    assert stats["in_flight"] == 1 and stats["visible"] == 0
    deleted = await client.delete(f"/v1/queues/{queue}/messages/{message['receipt_handle']}")
    assert deleted.status_code == 204


async def test_stale_handles_get_409_and_change_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, visibility_timeout=1)
    await send(client, queue)
    (old,) = await receive(client, queue)
    (new,) = await receive(client, queue, wait=10)  # after the first lease expired
    before = await db.fetchrow(MESSAGE_ROW)
    stale = old["receipt_handle"]
    base = f"/v1/queues/{queue}/messages/{stale}"
    for response in (
        await client.patch(f"{base}/visibility", json={"timeout": 600}),
        await client.patch(f"{base}/visibility", json={"timeout": 0}),
        await client.put(f"{base}/checkpoint", json={"cursor": {"stale": True}}),
        await client.delete(base),
    ):
        assert response.status_code == 409, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["code"] == "lease_lost"
    assert await db.fetchrow(MESSAGE_ROW) == before
    # The current holder is untouched and can still acknowledge.
    done = await client.delete(f"/v1/queues/{queue}/messages/{new['receipt_handle']}")
    assert done.status_code == 204
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 0


async def test_a_lapsed_holder_not_yet_replaced_may_still_extend_and_acknowledge(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, visibility_timeout=1)
    await send(client, queue)
    (message,) = await receive(client, queue)
    deadline = _ts(message["lease_expires_at"])
    # Let the lease lapse by the database clock, with nobody receiving.
    await db.execute(
        "SELECT pg_sleep(greatest(0, extract(epoch FROM $1::timestamptz - clock_timestamp())))",
        deadline,
    )
    base = f"/v1/queues/{queue}/messages/{message['receipt_handle']}"
    assert (await client.patch(f"{base}/visibility", json={"timeout": 60})).status_code == 200
    assert (await client.delete(base)).status_code == 204


async def test_fencing_tokens_strictly_increase_across_reclaims(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client)
    await send(client, queue, "a")
    await send(client, queue, "b")
    tokens: list[int] = []
    handles: set[str] = set()
    for _ in range(15):
        # visibility_timeout=0: visible again at once, so each receive re-claims.
        batch = await receive(client, queue, max=10, visibility_timeout=0)
        assert len(batch) == 2
        tokens.extend(m["fencing_token"] for m in batch)
        handles.update(m["receipt_handle"] for m in batch)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    assert len(handles) == 30  # a new claim token every time
    counts = {m["body"]: m["receive_count"] for m in batch}
    assert counts == {"a": 15, "b": 15}


async def test_release_with_timeout_zero_makes_the_message_visible_at_once(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client, visibility_timeout=600)
    await send(client, queue)
    (message,) = await receive(client, queue)
    released = await client.patch(
        f"/v1/queues/{queue}/messages/{message['receipt_handle']}/visibility",
        json={"timeout": 0},
    )
    assert released.status_code == 200
    (again,) = await receive(client, queue)
    assert again["message_id"] == message["message_id"]
    assert again["receive_count"] == 2


async def test_checkpoint_is_returned_on_the_next_receive_and_renews_the_lease(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client, visibility_timeout=120)
    await send(client, queue)
    (message,) = await receive(client, queue, visibility_timeout=5)
    assert message["checkpoint"] is None
    base = f"/v1/queues/{queue}/messages/{message['receipt_handle']}"
    saved = await client.put(f"{base}/checkpoint", json={"cursor": {"row": 4200, "ok": [1, 2]}})
    assert saved.status_code == 200, saved.text
    # Renewed by the queue's timeout (120), not the receive's (5).
    assert saved.json()["lease_seconds"] == 120
    assert _ts(saved.json()["lease_expires_at"]) > _ts(message["lease_expires_at"])
    assert (await client.patch(f"{base}/visibility", json={"timeout": 0})).status_code == 200
    (again,) = await receive(client, queue)
    assert again["checkpoint"] == {"row": 4200, "ok": [1, 2]}


async def test_batch_visibility_and_delete_report_per_handle(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client, visibility_timeout=1)
    for i in range(3):
        await send(client, queue, str(i))
    batch = await receive(client, queue, max=10)
    assert len(batch) == 3
    # Let the first one be taken over by a second receive.
    first = batch[0]
    taken = await client.patch(
        f"/v1/queues/{queue}/messages/{first['receipt_handle']}/visibility", json={"timeout": 0}
    )
    assert taken.status_code == 200
    (retaken,) = await receive(client, queue, visibility_timeout=600)
    assert retaken["message_id"] == first["message_id"]

    entries = [
        {"receipt_handle": m["receipt_handle"], "timeout": 300} for m in batch
    ] + [{"receipt_handle": "not-a-handle", "timeout": 300}]
    response = await client.post(f"/v1/queues/{queue}/messages/visibility",
                                 json={"entries": entries})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["ok"] for r in results] == [False, True, True, False]
    assert results[0]["code"] == "lease_lost" and results[0]["status"] == 409
    assert results[3]["code"] == "invalid_receipt_handle" and results[3]["status"] == 400
    assert results[1]["lease_seconds"] == 300
    assert response.json()["succeeded"] == 2 and response.json()["failed"] == 2

    handles = [m["receipt_handle"] for m in batch] + ["AAAA"]
    deleted = await client.post(f"/v1/queues/{queue}/messages/delete",
                                json={"receipt_handles": handles})
    assert deleted.status_code == 200
    assert [r["ok"] for r in deleted.json()["results"]] == [False, True, True, False]
    assert [r.get("code") for r in deleted.json()["results"]] == [
        "lease_lost", None, None, "invalid_receipt_handle"
    ]
    stats = (await client.get(f"/v1/queues/{queue}")).json()["stats"]
    assert stats["in_flight"] == 1  # only the re-taken one is left


async def test_a_handle_for_one_queue_is_rejected_on_another(client: httpx.AsyncClient) -> None:
    a = await make_queue(client, "a")
    b = await make_queue(client, "b")
    await send(client, a)
    (message,) = await receive(client, a)
    response = await client.delete(f"/v1/queues/{b}/messages/{message['receipt_handle']}")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_receipt_handle"


async def test_checkpoint_may_renew_by_its_own_timeout(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, visibility_timeout=0)
    await send(client, queue)
    (message,) = await receive(client, queue, visibility_timeout=30)
    saved = await client.put(
        f"/v1/queues/{queue}/messages/{message['receipt_handle']}/checkpoint",
        json={"cursor": 1, "timeout": 45},
    )
    assert saved.status_code == 200 and saved.json()["lease_seconds"] == 45
    # The queue's own timeout (0) would have made it visible again at once.
    assert await receive(client, queue) == []
