"""Input validation at the REST boundary, against the real app and PostgreSQL:
message sizes, bodies, attributes, delays and receive parameters.

Every limit is probed at its edges (min, max, min-1, max+1), every refusal is
checked to be problem+json with a stable code, and refused input is checked
not to have reached the database. Malformed input of any kind must be a 4xx,
never a 500: the ASGI transport re-raises unhandled server errors, so a 500
fails these tests loudly.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
from support import make_queue, receive, send
from validation_support import expect_invalid, expect_problem, message_count, request_json

# -- messages -----------------------------------------------------------------


async def test_message_size_counts_utf8_bytes_and_attributes(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, "small", max_message_bytes=1024)
    url = f"/v1/queues/{queue}/messages"
    fits = [
        {"body": "a" * 1024},
        {"body": "é" * 512},  # 2 bytes each
        {"body": "€" * 341 + "a"},  # 3 bytes each
        {"body": "\U0001f600" * 256},  # 4 bytes each
        {"body": "a" * 1000, "attributes": {"kkkk": "v" * 20}},  # names and values count
        {"body": "a" * 1000, "attributes": {"k": "€" * 7 + "aa"}},  # 1 + 23
    ]
    too_big = [
        {"body": "a" * 1025},
        {"body": "é" * 512 + "a"},
        {"body": "€" * 342},
        {"body": "\U0001f600" * 256 + "a"},
        {"body": "a" * 1000, "attributes": {"kkkk": "v" * 21}},
        {"body": "a" * 1000, "attributes": {"kkkkk": "v" * 20}},
        {"body": "a" * 1000, "attributes": {"k": "€" * 8}},
    ]
    ids = []
    for entry in fits:
        response = await request_json(client, "POST", url, entry)
        assert response.status_code == 201, response.text
        ids.append(response.json()["message_id"])
    for entry in too_big:
        expect_problem(await request_json(client, "POST", url, entry), 413, "message_too_large")
    assert await message_count(db) == len(fits)
    got = await receive(client, queue, max=10)
    by_id = {m["message_id"]: m for m in got}
    for message_id, entry in zip(ids, fits, strict=True):
        assert by_id[message_id]["body"] == entry["body"]
        assert by_id[message_id]["attributes"] == entry.get("attributes", {})


async def test_default_max_message_bytes_is_one_mebibyte(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, "big")
    body = "b" * 1_048_576
    message_id = await send(client, queue, body)
    expect_problem(
        await client.post(f"/v1/queues/{queue}/messages", json={"body": body + "b"}),
        413, "message_too_large",
    )
    (message,) = await receive(client, queue)
    assert message["message_id"] == message_id and message["body"] == body
    assert await message_count(db) == 1


BAD_BODIES = [
    "", "\u0000", "a\u0000b", "\u0001", "\u0008", "\u000b", "\u000c", "\u001f",
    "\ud800", "\udfff", "a\ud83d", "\ude00a", "\ufffe", "\uffff",
]
GOOD_BODIES = ["\t\n\r", "\u007f", "\u0085", "\U0001f600", "\U0010ffff", "\ue000", " ", "{}"]


async def test_message_body_characters(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, "chars")
    url = f"/v1/queues/{queue}/messages"
    for body in BAD_BODIES:
        expect_invalid(await request_json(client, "POST", url, {"body": body}))
        expect_invalid(await request_json(client, "POST", url, {"messages": [{"body": body}]}))
    for shape in ({}, {"body": None}, {"body": 5}, {"body": ["x"]}, {"body": {"a": 1}},
                  {"body": True}, {"body": "x", "extra": 1}, {"body": "x", "id": "1"}):
        expect_invalid(await request_json(client, "POST", url, shape))
    assert await message_count(db) == 0
    ids = [(await request_json(client, "POST", url, {"body": b})).json()["message_id"]
           for b in GOOD_BODIES]
    received = {m["message_id"]: m["body"] for m in await receive(client, queue, max=10)}
    assert [received[i] for i in ids] == GOOD_BODIES


async def test_message_attributes(client: httpx.AsyncClient, db: asyncpg.Connection) -> None:
    queue = await make_queue(client, "attrs")
    url = f"/v1/queues/{queue}/messages"
    good = [
        {f"k{i}": str(i) for i in range(10)},
        {"k" * 256: "v"},
        {"a.b-c_D9": ""},
        {"x": "é\U0001f600\t"},
    ]
    bad: list[Any] = [
        {f"k{i}": str(i) for i in range(11)},
        {"": "v"}, {"a b": "v"}, {"ä": "v"}, {"k" * 257: "v"}, {"a/b": "v"},
        {"a\u0000": "v"}, {"a:b": "v"},
        {"k": 1}, {"k": 1.5}, {"k": True}, {"k": None}, {"k": []}, {"k": {}},
        {"k": "\u0000"}, {"k": "\ud800"}, {"k": "\u0002"},
        "k=v", ["k", "v"], 5, None,
    ]
    for attributes in bad:
        expect_invalid(await request_json(
            client, "POST", url, {"body": "x", "attributes": attributes}))
    assert await message_count(db) == 0
    for attributes in good:
        response = await request_json(client, "POST", url, {"body": "x", "attributes": attributes})
        assert response.status_code == 201, response.text
    got = sorted((m["attributes"] for m in await receive(client, queue, max=10)), key=str)
    assert got == sorted(good, key=str)


async def test_message_delay_limits(client: httpx.AsyncClient, db: asyncpg.Connection) -> None:
    queue = await make_queue(client, "delays")
    url = f"/v1/queues/{queue}/messages"
    for delay in (-1, 901, 10**30, "5", 1.5, 5.0, True, [5]):
        expect_invalid(await request_json(client, "POST", url, {"body": "x", "delay": delay}))
        expect_invalid(await request_json(
            client, "POST", url, {"messages": [{"body": "x", "delay": delay}]}))
    assert await message_count(db) == 0
    now = await send(client, queue, "now", delay=0)
    await send(client, queue, "later", delay=900)
    await send(client, queue, "default", delay=None)
    got = await receive(client, queue, max=10)
    assert sorted(m["body"] for m in got) == ["default", "now"]
    assert now in {m["message_id"] for m in got}


async def test_receive_query_parameters(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "params")
    url = f"/v1/queues/{queue}/receive"
    bad: list[dict[str, Any]] = [
        {"max": 0}, {"max": 11}, {"max": -1}, {"max": "abc"}, {"max": 1.5}, {"max": ""},
        {"max": str(10**30)},
        {"wait": 21}, {"wait": -1}, {"wait": "x"}, {"wait": 0.5},
        {"visibility_timeout": 43201}, {"visibility_timeout": -1},
        {"visibility_timeout": "abc"}, {"visibility_timeout": str(10**30)},
    ]
    for params in bad:
        expect_invalid(await client.get(url, params={"wait": 0, **params}))
    await send(client, queue)
    # (A lease of 0 leaves the message visible for the next call.)
    for params in ({"max": 1, "wait": 20, "visibility_timeout": 0},
                   {"max": 10, "wait": 0, "visibility_timeout": 43200}):
        response = await client.get(url, params=params)
        assert response.status_code == 200, response.text
        assert len(response.json()["messages"]) == 1
