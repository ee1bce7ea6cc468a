"""Tenants on a standard queue (fair queues, issue 29): a message may name its
group, which is stored with it and returned wherever the message is shown."""

from __future__ import annotations

import httpx
from support import make_queue, receive, send


async def test_a_standard_queues_message_keeps_its_group_through_receive_and_peek(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client)
    await send(client, queue, "for tenant a", group="tenant-a")
    await send(client, queue, "nobody's")
    peeked = (await client.get(f"/v1/queues/{queue}/messages")).json()["messages"]
    assert [(m["body"], m["group"]) for m in peeked] == [
        ("for tenant a", "tenant-a"), ("nobody's", None)]
    received = await receive(client, queue, max=10)
    assert sorted((m["body"], m.get("group")) for m in received) == [
        ("for tenant a", "tenant-a"), ("nobody's", None)]
    # Neither gets FIFO's fields.
    assert all("sequence_number" not in m or m["sequence_number"] is None for m in received)


async def test_a_batch_keeps_each_messages_group(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client)
    response = await client.post(f"/v1/queues/{queue}/messages", json={"messages": [
        {"body": "one", "group": "t1"}, {"body": "two"}, {"body": "three", "group": "t2"},
    ]})
    assert response.status_code == 200, response.text
    received = await receive(client, queue, max=10)
    assert sorted((m["body"], m.get("group")) for m in received) == [
        ("one", "t1"), ("three", "t2"), ("two", None)]


async def test_a_group_is_checked_as_on_a_fifo_queue_and_a_deduplication_id_refused(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client)
    for bad in ("a b", "g" * 129, ""):
        response = await client.post(
            f"/v1/queues/{queue}/messages", json={"body": "x", "group": bad})
        assert response.status_code == 422, response.text  # the request's schema
        assert response.json()["code"] == "validation_error"
    response = await client.post(
        f"/v1/queues/{queue}/messages", json={"body": "x", "deduplication_id": "d"})
    assert response.status_code == 422
    assert "deduplication_id is for FIFO queues" in response.json()["detail"]
    assert await receive(client, queue) == []


async def test_a_dead_lettered_message_keeps_its_group(client: httpx.AsyncClient) -> None:
    dlq = await make_queue(client, "jobs-dlq")
    queue = await make_queue(client, "jobs", dead_letter_queue=dlq, max_receive_count=1)
    await send(client, queue, "poison", group="tenant-p")
    (first,) = await receive(client, queue, visibility_timeout=0)
    assert first["group"] == "tenant-p"
    assert await receive(client, queue) == []  # moved on its second receive
    (dead,) = await receive(client, dlq)
    assert (dead["body"], dead["group"]) == ("poison", "tenant-p")
