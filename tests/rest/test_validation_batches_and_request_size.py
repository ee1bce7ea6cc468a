"""Input validation at the REST boundary, against the real app and PostgreSQL:
batches, request sizes, and the default limits.

Every limit is probed at its edges (min, max, min-1, max+1), every refusal is
checked to be problem+json with a stable code, and refused input is checked
not to have reached the database. Malformed input of any kind must be a 4xx,
never a 500: the ASGI transport re-raises unhandled server errors, so a 500
fails these tests loudly.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
from conftest import AppClient
from support import make_queue, receive
from validation_support import (
    JSON,
    expect_invalid,
    expect_problem,
    message_count,
    raw,
    request_json,
)

from app.config import Settings

# -- batches ------------------------------------------------------------------


async def test_batch_with_an_oversized_entry(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, "batch", max_message_bytes=1024)
    response = await client.post(
        f"/v1/queues/{queue}/messages",
        json={"messages": [
            {"body": "first"},
            {"body": "x" * 1025},
            {"body": "third", "attributes": {"k": "v"}},
            {"body": "y" * 1000, "attributes": {"k" * 20: "v" * 20}},
        ]},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["succeeded"], body["failed"]) == (2, 2)
    first, second, third, fourth = body["results"]
    assert first["ok"] is True and third["ok"] is True
    for failed in (second, fourth):
        assert failed["ok"] is False
        assert failed["status"] == 413 and failed["code"] == "message_too_large"
        assert failed["detail"]
    stored = await db.fetch(
        "SELECT message_id::text AS message_id, body FROM leaseq.messages ORDER BY id"
    )
    assert [(r["message_id"], r["body"]) for r in stored] == [
        (first["message_id"], "first"), (third["message_id"], "third")]


async def test_batch_shapes(client: httpx.AsyncClient, db: asyncpg.Connection) -> None:
    queue = await make_queue(client, "shapes")
    url = f"/v1/queues/{queue}/messages"
    bad: list[Any] = [
        {"messages": []},
        {"messages": None},
        {"messages": "x"},
        {"messages": {"body": "x"}},
        {"messages": [{"body": ""}]},
        {"messages": [{"body": "ok"}, {"body": "\u0000"}]},
        {"messages": [{"body": "ok"}, {"nobody": "x"}]},
        {"messages": [{"body": "ok", "extra": 1}]},
        {"messages": [{"body": "ok"}], "body": "x"},
        {"messages": [["ok"]]},
    ]
    for payload in bad:
        expect_invalid(await request_json(client, "POST", url, payload))
    # The per-handle batches refuse empty lists just the same.
    expect_invalid(await client.post(f"{url}/visibility", json={"entries": []}))
    expect_invalid(await client.post(f"{url}/delete", json={"receipt_handles": []}))
    assert await message_count(db) == 0


async def test_batches_over_max_batch(app_factory: AppClient, db: asyncpg.Connection) -> None:
    client = await app_factory(max_batch=3)
    queue = await make_queue(client, "capped")
    url = f"/v1/queues/{queue}/messages"
    three = await client.post(url, json={"messages": [{"body": str(i)} for i in range(3)]})
    assert three.status_code == 200 and three.json()["succeeded"] == 3
    expect_invalid(await client.post(url, json={"messages": [{"body": str(i)} for i in range(4)]}))
    assert await message_count(db) == 3
    handles = [m["receipt_handle"] for m in await receive(client, queue, max=3)]
    four = [*handles, handles[0]]
    expect_invalid(await client.post(
        f"{url}/visibility", json={"entries": [{"receipt_handle": h, "timeout": 0} for h in four]}
    ))
    expect_invalid(await client.post(f"{url}/delete", json={"receipt_handles": four}))
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages WHERE leased") == 3
    done = await client.post(f"{url}/delete", json={"receipt_handles": handles})
    assert done.status_code == 200 and done.json()["succeeded"] == 3


# -- request size -------------------------------------------------------------


async def _chunks(data: bytes, size: int = 500) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def test_request_body_over_max_request_bytes(
    app_factory: AppClient, db: asyncpg.Connection
) -> None:
    client = await app_factory(max_request_bytes=2048)
    queue = await make_queue(client, "capped")
    url = f"/v1/queues/{queue}/messages"

    def message_of(size: int) -> bytes:
        data = raw({"body": "a" * (size - 12)}).encode()
        assert len(data) == size
        return data

    # Exactly the limit passes, declared or chunked.
    assert (await client.post(url, content=message_of(2048), headers=JSON)).status_code == 201
    chunked = await client.post(url, content=_chunks(message_of(2048)), headers=JSON)
    assert chunked.status_code == 201, chunked.text
    assert await message_count(db) == 2

    too_big = message_of(2049)
    declared = await client.post(url, content=too_big, headers=JSON)
    body = expect_problem(declared, 413, "request_too_large")
    assert "2048" in body["detail"]
    streamed = await client.post(url, content=_chunks(too_big), headers=JSON)
    assert "content-length" not in streamed.request.headers
    expect_problem(streamed, 413, "request_too_large")
    # Not only message sends: any body, even on a route that would refuse it anyway.
    handle = "A" * 66
    for method, path in (("POST", "/v1/queues"), ("PATCH", f"/v1/queues/{queue}"),
                         ("PUT", f"{url}/{handle}/checkpoint"),
                         ("POST", f"{url}/delete")):
        expect_problem(await client.request(method, path, content=b"x" * 5000, headers=JSON),
                       413, "request_too_large")
        expect_problem(await client.request(method, path, content=_chunks(b"[" * 5000),
                                            headers=JSON), 413, "request_too_large")
    assert await message_count(db) == 2


async def test_the_default_limits_come_from_the_queue_limits(
    app_factory: AppClient, db: asyncpg.Connection
) -> None:
    """Unless configured: 10 entries a batch, and a body limit that fits 10 messages
    of 1 MiB; a 16 MB body or a 900k-entry batch is refused, the first before it is
    read."""
    client = await app_factory(max_batch=Settings.model_fields["max_batch"].default)
    assert Settings.model_fields["max_batch"].default == 10
    limit = client.app.state.settings.request_limit()  # type: ignore[attr-defined]
    assert limit == 10 * 1_048_576 + 65_536
    queue = await make_queue(client, "defaults")
    url = f"/v1/queues/{queue}/messages"
    full = [{"body": "m" * (1_048_576 - 10)} for _ in range(10)]
    batch = await client.post(url, json={"messages": full})
    assert batch.status_code == 200 and batch.json()["succeeded"] == 10, batch.text[:300]
    expect_invalid(await client.post(url, json={"messages": [{"body": "x"}] * 11}))
    expect_problem(await client.post(url, content=b"x" * 16_000_000, headers=JSON),
                   413, "request_too_large")
    many = b'{"messages": [' + b",".join([b'{"body":"m"}'] * 900_000) + b"]}"
    expect_problem(await client.post(url, content=many, headers=JSON), 413,
                   "request_too_large")
    under = b'{"messages": [' + b",".join([b'{"body":"m"}'] * 700_000) + b"]}"
    assert len(under) < limit
    # Refused by the parser at the 45th object, not after building 700,000.
    refused = expect_invalid(await client.post(url, content=under, headers=JSON))
    assert "stopped reading after 44 objects and numbers" in refused["detail"]
    numbers = b'{"messages": [{"body": "x", "delay": 1}], "x": [' + b"1," * 100_000 + b"1]}"
    assert "stopped reading" in expect_invalid(
        await client.post(url, content=numbers, headers=JSON))["detail"]
    # Longer than any message: refused by its size, unread by the character check.
    huge = raw({"body": "\u0000" + "m" * 2_000_000}).encode()
    expect_problem(await client.post(url, content=huge, headers=JSON), 413,
                   "message_too_large")
    # Only sends may carry more than a megabyte.
    (handle,) = [m["receipt_handle"] for m in await receive(client, queue)]
    handles = json.dumps({"receipt_handles": [handle] * 9 + ["h" * 1_100_000]}).encode()
    expect_problem(await client.post(f"{url}/delete", content=handles, headers=JSON), 413,
                   "request_too_large")
    # A checkpoint's cursor is JSON of the caller's: not counted, only sized.
    cursor = {"cursor": [{"i": i} for i in range(2_000)]}
    saved = await client.put(f"{url}/{handle}/checkpoint", json=cursor)
    assert saved.status_code == 200, saved.text
    assert await message_count(db) == 10
