"""A receive that first acknowledges and extends what the worker holds
(`POST /v1/queues/{queue}/receive`): one request per iteration of a worker."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg
import httpx
from support import make_queue, receive, send


async def settle(client: httpx.AsyncClient, queue: str, **body: Any) -> httpx.Response:
    return await client.post(f"/v1/queues/{queue}/receive", json=body)


async def test_acknowledgements_ride_on_the_next_receive(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, "ride")
    for body in ("one", "two", "three"):
        await send(client, queue, body)
    first = await receive(client, queue, max=2)
    answer = await settle(client, queue, delete=[m["receipt_handle"] for m in first], max=5)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["deleted"] == [{"ok": True}, {"ok": True}] and data["extended"] == []
    assert [m["body"] for m in data["messages"]] == ["three"]
    left = await db.fetch("SELECT body FROM messages")
    assert [r["body"] for r in left] == ["three"]  # the two acknowledged are gone


async def test_a_lost_lease_is_its_entry_s_answer_not_the_receive_s(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client, "stale")
    await send(client, queue, "a")
    await send(client, queue, "b")
    (held,) = await receive(client, queue)
    handle = held["receipt_handle"]
    assert (await client.delete(f"/v1/queues/{queue}/messages/{handle}")).status_code == 204
    answer = await settle(client, queue, delete=[handle, "not-a-handle"])
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert [e["ok"] for e in data["deleted"]] == [False, False]
    assert [e["code"] for e in data["deleted"]] == ["lease_lost", "invalid_receipt_handle"]
    assert data["deleted"][0]["status"] == 409
    assert [m["body"] for m in data["messages"]] == ["b"]


async def test_extensions_renew_leases_before_the_claim(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "extend", visibility_timeout=30)
    await send(client, queue, "long job")
    (held,) = await receive(client, queue)
    answer = await settle(
        client, queue, extend=[{"receipt_handle": held["receipt_handle"], "timeout": 600}]
    )
    assert answer.status_code == 200, answer.text
    (extended,) = answer.json()["extended"]
    assert extended["ok"] and extended["lease_seconds"] == 600
    renewed = datetime.fromisoformat(extended["lease_expires_at"])
    assert (renewed - datetime.fromisoformat(held["lease_expires_at"])).total_seconds() > 500
    assert answer.json()["messages"] == []  # the one message is still held


async def test_one_handle_is_deleted_or_extended_not_both(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "both")
    await send(client, queue, "x")
    (held,) = await receive(client, queue)
    handle = held["receipt_handle"]
    answer = await settle(
        client, queue, delete=[handle], extend=[{"receipt_handle": handle, "timeout": 60}]
    )
    assert answer.status_code == 422 and answer.json()["code"] == "validation_error"
    # Nothing was applied: the message is still held by this handle.
    assert (await client.delete(f"/v1/queues/{queue}/messages/{handle}")).status_code == 204


async def test_the_receive_s_own_parameters_and_limits_hold(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "limits")
    for bad in ({"max": 0}, {"max": 11}, {"wait": 21}, {"visibility_timeout": -1},
                {"delete": "h"}, {"delete": ["h"] * 101},
                {"extend": [{"receipt_handle": "h", "timeout": 1.5}]}, {"other": 1}):
        answer = await settle(client, queue, **bad)
        assert answer.status_code == 422, (bad, answer.text)
        assert answer.json()["code"] == "validation_error"
    missing = await settle(client, "no-such-queue", delete=["h"])
    assert missing.status_code == 404 and missing.json()["code"] == "queue_not_found"
