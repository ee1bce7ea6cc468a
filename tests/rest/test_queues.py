"""Queues: live stats, attribute changes taking effect, purge, delete."""

from __future__ import annotations

import time

import asyncpg
import httpx
from support import make_queue, receive, send


async def test_stats_are_counted_live(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, visibility_timeout=600)
    for _ in range(3):
        await send(client, queue)
    await send(client, queue, delay=600)
    await receive(client, queue, max=2)
    detail = (await client.get(f"/v1/queues/{queue}")).json()
    assert detail["name"] == queue
    assert detail["attributes"]["visibility_timeout"] == 600
    assert detail["stats"]["visible"] == 1
    assert detail["stats"]["in_flight"] == 2
    assert detail["stats"]["delayed"] == 1
    assert 0 <= detail["stats"]["oldest_age_seconds"] < 60


async def test_stats_of_an_empty_queue(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client)
    stats = (await client.get(f"/v1/queues/{queue}")).json()["stats"]
    assert stats == {"visible": 0, "in_flight": 0, "delayed": 0, "oldest_age_seconds": 0.0,
                     "tenants": None}


async def test_patch_changes_attributes_for_later_operations(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client)
    patched = await client.patch(f"/v1/queues/{queue}", json={"visibility_timeout": 77,
                                                              "delay": 1})
    assert patched.status_code == 200, patched.text
    assert patched.json()["attributes"]["visibility_timeout"] == 77
    assert patched.json()["attributes"]["delay"] == 1
    assert patched.json()["attributes"]["receive_wait"] == 0  # untouched
    await send(client, queue)
    # The queue's default delay applies to the send: not visible at once.
    assert await receive(client, queue) == []
    (message,) = await receive(client, queue, wait=10)
    assert message["lease_seconds"] == 77


async def test_receive_wait_attribute_is_the_default_wait(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, receive_wait=2)
    start = time.monotonic()
    assert await receive(client, queue) == []
    assert time.monotonic() - start >= 1.9
    start = time.monotonic()
    assert await receive(client, queue, wait=0) == []
    assert time.monotonic() - start < 1.5


async def test_purge_deletes_every_message(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client)
    other = await make_queue(client, "other")
    for _ in range(3):
        await send(client, queue)
    await send(client, other)
    await receive(client, queue)
    response = await client.post(f"/v1/queues/{queue}/purge")
    assert response.status_code == 200
    assert response.json() == {"purged": 3}
    assert await receive(client, queue) == []
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 1  # the other queue's


async def test_delete_queue_removes_it_and_its_messages(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client)
    await send(client, queue)
    assert (await client.delete(f"/v1/queues/{queue}")).status_code == 204
    missing = await client.get(f"/v1/queues/{queue}")
    assert missing.status_code == 404
    assert missing.json()["code"] == "queue_not_found"
    assert (await client.delete(f"/v1/queues/{queue}")).status_code == 404
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 0


async def test_list_queues(client: httpx.AsyncClient) -> None:
    for name in ("b-2", "a-1", "b-1"):
        await make_queue(client, name)
    listed = (await client.get("/v1/queues")).json()
    assert [q["name"] for q in listed["queues"]] == ["a-1", "b-1", "b-2"]
    assert listed["next_after"] is None
    page = (await client.get("/v1/queues", params={"prefix": "b", "limit": 1})).json()
    assert [q["name"] for q in page["queues"]] == ["b-1"]
    rest = (await client.get("/v1/queues", params={"prefix": "b", "after": page["next_after"]}))
    assert [q["name"] for q in rest.json()["queues"]] == ["b-2"]


async def test_health_readiness_and_metrics(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["listening"] is True
    metrics = (await client.get("/metrics")).text
    assert 'route="/readyz",status="200"} 1' in metrics


async def test_sending_to_a_queue_deleted_behind_the_cache_is_404(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client)
    await send(client, queue)  # the queue is now cached in the service
    # Deleted without the announcement a service would make: the cache is stale.
    await db.execute("DELETE FROM leaseq.queues WHERE name = $1", queue)
    response = await client.post(f"/v1/queues/{queue}/messages", json={"body": "x"})
    assert response.status_code == 404
    assert response.json()["code"] == "queue_not_found"
    assert (await client.post(f"/v1/queues/{queue}/messages", json={"body": "x"})
            ).status_code == 404
