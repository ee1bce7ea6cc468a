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
    left = await db.fetch("SELECT body FROM leaseq.messages")
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


def _statements(client: httpx.AsyncClient, line: str) -> int:
    count: int = client.app.state.service.group.line(line).statements  # type: ignore[attr-defined]
    return count


async def test_a_short_poll_deletes_and_claims_in_one_statement(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, "one-statement")
    for body in ("a", "b", "c"):
        await send(client, queue, body)
    held = await receive(client, queue, max=2)
    deletes, claims = _statements(client, "delete"), _statements(client, "claim")
    answer = await settle(client, queue, delete=[m["receipt_handle"] for m in held] * 2,
                          max=2, wait=0)
    data = answer.json()
    # a handle given twice: deleted once, the second entry finds the claim gone
    assert [e.get("code") for e in data["deleted"]] == [None, None, "lease_lost", "lease_lost"]
    assert [m["body"] for m in data["messages"]] == ["c"]
    assert _statements(client, "delete") == deletes
    assert _statements(client, "claim") == claims + 1
    assert [r["body"] for r in await db.fetch("SELECT body FROM leaseq.messages")] == ["c"]


async def test_a_lapsed_lease_still_held_is_acknowledged_not_claimed_again(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    # Its lease ran out but nobody claimed it since: the handle still holds the
    # claim, so it is deleted; the same statement must not also claim it.
    queue = await make_queue(client, "lapsed")
    await send(client, queue, "late")
    # Asked for two, it comes back short: the next claim reads the leases that
    # ran out too (app/queue/floors.py), where this one lies.
    (held,) = await receive(client, queue, visibility_timeout=30, max=2)
    await db.execute("UPDATE leaseq.messages SET visible_at = now() - interval '1 second'")
    answer = await settle(client, queue, delete=[held["receipt_handle"]], max=10, wait=0)
    data = answer.json()
    assert data["deleted"] == [{"ok": True}] and data["messages"] == []
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 0


async def test_a_long_poll_settles_first_then_waits(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, "settle-then-wait")
    await send(client, queue, "only")
    (held,) = await receive(client, queue)
    deletes = _statements(client, "delete")
    answer = await settle(client, queue, delete=[held["receipt_handle"]], wait=1)
    assert answer.json()["deleted"] == [{"ok": True}] and answer.json()["messages"] == []
    assert _statements(client, "delete") == deletes + 1  # its own statement, before waiting
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 0


async def test_acknowledgements_ride_with_a_dead_letter_claim(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    await make_queue(client, "ride-dlq")
    queue = await make_queue(client, "ride-src", dead_letter_queue="ride-dlq",
                             max_receive_count=1)
    await send(client, queue, "done")
    (done,) = await receive(client, queue, visibility_timeout=30)
    # "exhausted" is received once with a lease that ends at once: the next
    # claim, which reads the leases that ran out, moves it to the dead-letter
    # queue (a claim that gave 0-second leases makes the next read them:
    # app/queue/floors.py)
    await send(client, queue, "exhausted")
    (exhausted,) = await receive(client, queue, visibility_timeout=0)
    assert exhausted["body"] == "exhausted"
    await send(client, queue, "fresh")
    answer = await settle(client, queue, delete=[done["receipt_handle"]], max=2, wait=0)
    data = answer.json()
    assert data["deleted"] == [{"ok": True}]
    assert [m["body"] for m in data["messages"]] == ["fresh"]
    moved = await receive(client, "ride-dlq")
    assert [m["body"] for m in moved] == ["exhausted"]
