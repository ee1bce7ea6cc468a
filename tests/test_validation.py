"""Input validation at the REST boundary, against the real app and PostgreSQL.

Every limit is probed at its edges (min, max, min-1, max+1), every refusal is
checked to be problem+json with a stable code, and refused input is checked
not to have reached the database. Malformed input of any kind must be a 4xx,
never a 500: the ASGI transport re-raises unhandled server errors, so a 500
fails these tests loudly.
"""

from __future__ import annotations

import base64
import json
import random
import string
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
from conftest import AppClient
from support import make_queue, receive, send

from app.config import Settings

PROBLEM = "application/problem+json"
JSON = {"content-type": "application/json"}

LIMITS: dict[str, tuple[int, int]] = {
    "visibility_timeout": (0, 43_200),
    "message_retention": (60, 1_209_600),
    "delay": (0, 900),
    "receive_wait": (0, 20),
    "max_message_bytes": (1_024, 1_048_576),
}
DEFAULTS = {
    "visibility_timeout": 30,
    "message_retention": 345_600,
    "delay": 0,
    "receive_wait": 0,
    "max_message_bytes": 1_048_576,
    "dead_letter_queue": None,
    "max_receive_count": None,
    "retry_backoff": None,
    "fifo": False,
    "content_based_deduplication": False,
    "deduplication_scope": "queue",
    "fifo_throughput_limit": "per_queue",
}
B64 = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"


def expect_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """`response` is an RFC 9457 problem with this status and code."""
    assert response.status_code == status, (response.request.url, response.text[:500])
    assert response.headers["content-type"].split(";")[0] == PROBLEM, response.headers
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    assert body["status"] == status
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    assert isinstance(body["type"], str) and body["type"]
    return body


def expect_invalid(response: httpx.Response) -> dict[str, Any]:
    return expect_problem(response, 422, "validation_error")


def raw(obj: Any) -> str:
    """JSON text with non-ASCII escaped, so lone surrogates survive the trip."""
    return json.dumps(obj, ensure_ascii=True)


async def request_json(
    client: httpx.AsyncClient, method: str, url: str, obj: Any
) -> httpx.Response:
    return await client.request(method, url, content=raw(obj), headers=JSON)


async def message_count(db: asyncpg.Connection) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM messages")
    return count


async def claimed(client: httpx.AsyncClient, queue: str, body: str = "job") -> dict[str, Any]:
    await send(client, queue, body)
    (message,) = await receive(client, queue, visibility_timeout=600)
    return message


# -- queue attributes ---------------------------------------------------------


async def test_queue_attribute_defaults(client: httpx.AsyncClient) -> None:
    created = await client.post("/v1/queues", json={"name": "plain"})
    assert created.status_code == 201
    assert created.json()["attributes"] == DEFAULTS
    got = await client.get("/v1/queues/plain")
    assert got.status_code == 200 and got.json()["attributes"] == DEFAULTS
    # null means "not given": the default on create, "unchanged" on PATCH.
    nulls = await client.post("/v1/queues", json={"name": "nulls", **dict.fromkeys(DEFAULTS)})
    assert nulls.status_code == 201 and nulls.json()["attributes"] == DEFAULTS
    await make_queue(client, "patched", delay=5)
    same = await client.patch("/v1/queues/patched", json={"delay": None})
    assert same.status_code == 200 and same.json()["attributes"]["delay"] == 5


async def test_queue_attribute_limits_on_create(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    for attribute, (low, high) in LIMITS.items():
        for value in (low, high):
            name = f"{attribute}-{value}"
            response = await client.post("/v1/queues", json={"name": name, attribute: value})
            assert response.status_code == 201, response.text
            assert response.json()["attributes"] == {**DEFAULTS, attribute: value}
        for value in (low - 1, high + 1, 10**30, -(10**30)):
            response = await client.post(
                "/v1/queues", json={"name": f"bad-{attribute}", attribute: value}
            )
            body = expect_invalid(response)
            assert attribute in body["detail"]
    assert await db.fetchval("SELECT count(*) FROM queues WHERE name LIKE 'bad-%'") == 0
    assert await db.fetchval("SELECT count(*) FROM queues") == 2 * len(LIMITS)


async def test_queue_attribute_limits_on_patch(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "tuned")
    current = dict(DEFAULTS)
    for attribute, (low, high) in LIMITS.items():
        for value in (low, high):
            response = await client.patch(f"/v1/queues/{queue}", json={attribute: value})
            assert response.status_code == 200, response.text
            current[attribute] = value
            assert response.json()["attributes"] == current
        for value in (low - 1, high + 1, 10**30):
            expect_invalid(await client.patch(f"/v1/queues/{queue}", json={attribute: value}))
    got = await client.get(f"/v1/queues/{queue}")
    assert got.json()["attributes"] == current


async def test_queue_attributes_must_be_integers(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "typed")
    for value in ["30", 1.5, 30.0, True, False, [30], {"s": 30}, "", "abc"]:
        for attribute in LIMITS:
            expect_invalid(await client.post("/v1/queues", json={"name": "t2", attribute: value}))
            expect_invalid(await client.patch(f"/v1/queues/{queue}", json={attribute: value}))
    assert (await client.get("/v1/queues/t2")).status_code == 404
    assert (await client.get(f"/v1/queues/{queue}")).json()["attributes"] == DEFAULTS


async def test_unknown_queue_fields_are_rejected(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "known")
    for extra in ({"colour": "red"}, {"VisibilityTimeout": 30}, {"fifo": True},
                  {"redrive_policy": "dlq"}, {"stats": {}}):
        expect_invalid(await client.post("/v1/queues", json={"name": "x", **extra}))
        expect_invalid(await client.patch(f"/v1/queues/{queue}", json=extra))
    # A queue's name is not an attribute to change.
    expect_invalid(await client.patch(f"/v1/queues/{queue}", json={"name": "renamed"}))
    assert (await client.get("/v1/queues/x")).status_code == 404
    assert (await client.get("/v1/queues/renamed")).status_code == 404


# -- queue names --------------------------------------------------------------

GOOD_NAMES = ["a", "Z", "0", "a-b_C9", "-", "_", "q" * 80]
BAD_NAMES = ["", "q" * 81, "a.b", "a b", "ä", "x.fifo", " a", "a\n", "a/b", "a\u0000", "é" * 10]


async def test_queue_names_on_create(client: httpx.AsyncClient, db: asyncpg.Connection) -> None:
    for name in GOOD_NAMES:
        response = await client.post("/v1/queues", json={"name": name})
        assert response.status_code == 201, (name, response.text)
        assert response.json()["name"] == name
    for name in BAD_NAMES:
        expect_invalid(await request_json(client, "POST", "/v1/queues", {"name": name}))
    for body in ({}, {"name": None}, {"name": 5}, {"name": ["a"]}):
        expect_invalid(await client.post("/v1/queues", json=body))
    names = await db.fetch("SELECT name FROM queues")
    assert sorted(r["name"] for r in names) == sorted(GOOD_NAMES)


async def test_missing_or_invalid_queue_is_404_everywhere(client: httpx.AsyncClient) -> None:
    await make_queue(client, "exists")
    handle = (await claimed(client, "exists"))["receipt_handle"]
    for name in ["nope", "a.b", "x.fifo", "q" * 81, "ä", "a b", "a\u0000", "EXISTS"]:
        await _all_404(client, name, handle)
    # The claim on the real queue was not touched by any of that.
    assert (await client.delete(f"/v1/queues/exists/messages/{handle}")).status_code == 204


async def _all_404(client: httpx.AsyncClient, name: str, handle: str) -> None:
    base = f"/v1/queues/{quote(name, safe='')}"
    calls: list[tuple[str, str, Any]] = [
        ("GET", base, None),
        ("PATCH", base, {"delay": 1}),
        ("DELETE", base, None),
        ("POST", f"{base}/purge", None),
        ("POST", f"{base}/messages", {"body": "x"}),
        ("POST", f"{base}/messages", {"messages": [{"body": "x"}]}),
        ("GET", f"{base}/receive?wait=0", None),
        ("PATCH", f"{base}/messages/{handle}/visibility", {"timeout": 5}),
        ("DELETE", f"{base}/messages/{handle}", None),
        ("PUT", f"{base}/messages/{handle}/checkpoint", {"cursor": 1}),
        ("POST", f"{base}/messages/visibility", {"entries": [
            {"receipt_handle": handle, "timeout": 5}]}),
        ("POST", f"{base}/messages/delete", {"receipt_handles": [handle]}),
    ]
    for method, url, body in calls:
        if body is None:
            response = await client.request(method, url)
        else:
            response = await request_json(client, method, url, body)
        expect_problem(response, 404, "queue_not_found")


async def test_create_existing_queue(client: httpx.AsyncClient) -> None:
    first = await client.post("/v1/queues", json={"name": "dup", "delay": 5})
    assert first.status_code == 201
    again = await client.post("/v1/queues", json={"name": "dup", "delay": 5})
    assert again.status_code == 200 and again.json() == first.json()
    # The defaults spelled out are the same attributes as the defaults left out.
    await make_queue(client, "dflt")
    explicit = await client.post("/v1/queues", json={"name": "dflt", **DEFAULTS})
    assert explicit.status_code == 200
    for different in ({"delay": 6}, {}, {"delay": 5, "visibility_timeout": 31}):
        conflict = await client.post("/v1/queues", json={"name": "dup", **different})
        expect_problem(conflict, 409, "queue_already_exists")
    assert (await client.get("/v1/queues/dup")).json()["attributes"] == {**DEFAULTS, "delay": 5}
    # Invalid attributes are a 422 even when the name is taken.
    expect_invalid(await client.post("/v1/queues", json={"name": "dup", "delay": 901}))


async def test_list_queues_prefix_and_pagination(client: httpx.AsyncClient) -> None:
    for name in ("job3", "job1", "other", "job5", "job2", "job4", "q_1", "qx1"):
        await make_queue(client, name)

    async def page(**params: Any) -> tuple[list[str], str | None]:
        response = await client.get("/v1/queues", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        return [q["name"] for q in body["queues"]], body["next_after"]

    assert await page(prefix="job", limit=2) == (["job1", "job2"], "job2")
    assert await page(prefix="job", limit=2, after="job2") == (["job3", "job4"], "job4")
    assert await page(prefix="job", limit=2, after="job4") == (["job5"], None)
    # A full last page still points on; the page after it is empty.
    assert await page(prefix="job", limit=5) == ([f"job{i}" for i in range(1, 6)], "job5")
    assert await page(prefix="job", limit=5, after="job5") == ([], None)
    assert await page(prefix="nothing") == ([], None)
    # The prefix is literal: `_` is not a LIKE wildcard.
    assert await page(prefix="q_") == (["q_1"], None)
    everything, next_after = await page()
    assert len(everything) == 8 and next_after is None
    for params in ({"limit": 0}, {"limit": 1001}, {"limit": "x"}, {"prefix": "p" * 81},
                   {"after": "a" * 81}, {"prefix": "\u0000"}, {"after": "\u0000"},
                   {"prefix": "a.b"}, {"after": "ä"}):
        expect_invalid(await client.get("/v1/queues", params=params))


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
        "SELECT message_id::text AS message_id, body FROM messages ORDER BY id"
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
    assert await db.fetchval("SELECT count(*) FROM messages WHERE leased") == 3
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


# -- malformed input ----------------------------------------------------------

MALFORMED: list[bytes] = [
    b"{",
    b"{'body': 'x'}",
    b'{"body": "x"} trailing',
    b'{"body": "x",}',
    b"",
    b"\xff\xfe\x00",
    b'{"body": "\xff"}',
    b"[]",
    b"[1, 2]",
    b"1",
    b"-0.5",
    b'"a string"',
    b"null",
    b"true",
    b"NaN",
    b"[" * 10_000 + b"]" * 10_000,
    b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
    b"1" * 5_000,
    b'{"body": ' + b"9" * 5_000 + b"}",
    b'{"body": "\\u0000"}',
    b'{"body": "\\ud800"}',
    b"\x00",
]


async def test_malformed_bodies_are_422_on_every_body_route(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, "malformed")
    message = await claimed(client, queue, "keep me")
    handle = message["receipt_handle"]
    before = await db.fetchrow("SELECT * FROM messages")
    targets = [
        ("POST", "/v1/queues"),
        ("PATCH", f"/v1/queues/{queue}"),
        ("POST", f"/v1/queues/{queue}/messages"),
        ("PATCH", f"/v1/queues/{queue}/messages/{handle}/visibility"),
        ("PUT", f"/v1/queues/{queue}/messages/{handle}/checkpoint"),
        ("POST", f"/v1/queues/{queue}/messages/visibility"),
        ("POST", f"/v1/queues/{queue}/messages/delete"),
    ]
    for method, url in targets:
        for payload in MALFORMED:
            response = await client.request(method, url, content=payload, headers=JSON)
            expect_invalid(response)
        # A well-formed JSON body under a content type that is not JSON is refused
        # before it is read: no HTML form or text/plain request can change state.
        for content_type in ("text/plain", "application/x-www-form-urlencoded",
                             "multipart/form-data; boundary=x", "application/xml", None):
            headers = {} if content_type is None else {"content-type": content_type}
            body = {"name": "q", "body": "x", "timeout": 5, "cursor": 1, "entries": [],
                    "receipt_handles": []}
            response = await client.request(method, url, content=raw(body), headers=headers)
            expect_problem(response, 415, "unsupported_media_type")
    assert await db.fetchrow("SELECT * FROM messages") == before
    assert await db.fetchval("SELECT count(*) FROM queues") == 1
    assert (await client.delete(f"/v1/queues/{queue}/messages/{handle}")).status_code == 204


async def test_checkpoint_cursor_validation(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, "cursors")
    handle = (await claimed(client, queue))["receipt_handle"]
    url = f"/v1/queues/{queue}/messages/{handle}/checkpoint"

    def nested(depth: int) -> str:
        return '{"cursor": ' + "[" * depth + "]" * depth + "}"

    bad = [
        nested(10_000), nested(1_000), nested(100),
        '{"cursor": ' + '{"a": ' * 10_000 + "1" + "}" * 10_000 + "}",
        '{"cursor": NaN}', '{"cursor": Infinity}', '{"cursor": -Infinity}',
        '{"cursor": [1, NaN]}', '{"cursor": {"x": Infinity}}', '{"cursor": 1e400}',
        '{"cursor": ' + "7" * 5_000 + "}",
        '{"cursor": "\\u0000"}', '{"cursor": {"\\u0000": 1}}', '{"cursor": ["\\ud800"]}',
        '{"cursor": {"k": "a\\udfff"}}',
        raw({"cursor": "x" * 70_000}),
        "{}", '{"cursor": 1, "extra": 2}', '{"Cursor": 1}',
    ]
    for payload in bad:
        expect_invalid(await client.put(url, content=payload, headers=JSON))
    assert await db.fetchval("SELECT checkpoint FROM messages") is None

    big = 10**3_000
    # (jsonb keeps numbers as numeric: 1.5 comes back as 1.5, but 1.5e300
    # would come back as a 301-digit integer, equal in JSON but not in Python.)
    for cursor in (nested(50)[11:-1], raw({"big": -big, "f": 1.5, "s": "é\U0001f600"})):
        response = await client.put(url, content=f'{{"cursor": {cursor}}}', headers=JSON)
        assert response.status_code == 200, response.text
    # The cursor comes back with the next receive of the message, exactly.
    release = await client.patch(f"/v1/queues/{queue}/messages/{handle}/visibility",
                                 json={"timeout": 0})
    assert release.status_code == 200
    (again,) = await receive(client, queue)
    assert again["checkpoint"] == {"big": -big, "f": 1.5, "s": "é\U0001f600"}


async def test_huge_integers_are_range_errors(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "huge")
    handle = (await claimed(client, queue))["receipt_handle"]
    for value in (2**63, -(2**63) - 1, 10**300):
        expect_invalid(await client.post("/v1/queues", json={"name": "h", "delay": value}))
        expect_invalid(await client.patch(f"/v1/queues/{queue}",
                                          json={"visibility_timeout": value}))
        expect_invalid(await client.post(f"/v1/queues/{queue}/messages",
                                         json={"body": "x", "delay": value}))
        expect_invalid(await client.patch(f"/v1/queues/{queue}/messages/{handle}/visibility",
                                          json={"timeout": value}))
        expect_invalid(await client.get(f"/v1/queues/{queue}/receive", params={"max": value}))
        expect_invalid(await client.get("/v1/queues", params={"limit": value}))


# -- receipt handles ----------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _flip(handle: str, position: int) -> str:
    replacement = B64[(B64.index(handle[position]) + 1) % 64]
    return handle[:position] + replacement + handle[position + 1 :]


def garbage_handles(real: str) -> list[str]:
    rng = random.Random(7)
    decoded = base64.urlsafe_b64decode(real + "=" * (-len(real) % 4))
    return [
        "garbage",
        "x",
        "!!!!",
        "a" * 5_000,
        "A" * len(real),
        _b64(rng.randbytes(len(decoded) - 1)),  # valid base64, wrong length
        _b64(rng.randbytes(len(decoded) + 1)),
        _b64(rng.randbytes(len(decoded))),  # right length, no valid tag
        _b64(decoded[:-1]),
        _b64(decoded + b"\x00"),
        _b64(b"\x03" + decoded[1:]),  # another version byte
        _b64(decoded[:1] + b"\x00\x07" + decoded[3:]),  # a key id that signs nothing
        real + "A",
        real[:-1],
        real + "==",
        real.lower(),
        real.swapcase(),
        real[::-1],
        " " + real,
        real + "\u0000",
        real + "é",
        _flip(real, len(real) - 1),  # only bits that decoding drops
        _flip(real, 0),
        _flip(real, 20),  # inside the message row id
        _flip(real, 40),  # inside the claim token
        _flip(real, 60),  # inside the tag
    ]


async def test_receipt_handles_that_are_not_handles(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await make_queue(client, "handles")
    other = await make_queue(client, "other")
    message = await claimed(client, queue)
    real = message["receipt_handle"]
    before = await db.fetchrow("SELECT * FROM messages")
    base = f"/v1/queues/{queue}/messages"

    async def every_form(handle: str, queue_name: str = queue) -> None:
        url = f"/v1/queues/{queue_name}/messages"
        path = quote(handle, safe="")
        expect_problem(await client.patch(f"{url}/{path}/visibility", json={"timeout": 5}),
                       400, "invalid_receipt_handle")
        expect_problem(await client.delete(f"{url}/{path}"), 400, "invalid_receipt_handle")
        expect_problem(await client.put(f"{url}/{path}/checkpoint", json={"cursor": 1}),
                       400, "invalid_receipt_handle")
        for batch_url, payload in (
            (f"{url}/visibility", {"entries": [{"receipt_handle": handle, "timeout": 5}]}),
            (f"{url}/delete", {"receipt_handles": [handle]}),
        ):
            response = await request_json(client, "POST", batch_url, payload)
            assert response.status_code == 200, response.text
            (result,) = response.json()["results"]
            assert result["ok"] is False and result["status"] == 400
            assert result["code"] == "invalid_receipt_handle"

    for handle in garbage_handles(real):
        await every_form(handle)
    # Every single-character change of a real handle is refused, wherever it is.
    for position in range(len(real)):
        flipped = _flip(real, position)
        expect_problem(await client.delete(f"{base}/{flipped}"), 400, "invalid_receipt_handle")
    # A real handle is a claim on its own queue only.
    await every_form(real, other)

    assert await db.fetchrow("SELECT * FROM messages") == before
    beat = await client.patch(f"{base}/{real}/visibility", json={"timeout": 60})
    assert beat.status_code == 200 and beat.json()["lease_seconds"] == 60
    assert (await client.delete(f"{base}/{real}")).status_code == 204
    expect_problem(await client.delete(f"{base}/{real}"), 409, "lease_lost")
    expect_problem(await client.patch(f"{base}/{real}/visibility", json={"timeout": 5}),
                   409, "lease_lost")


async def test_visibility_timeout_body(client: httpx.AsyncClient, db: asyncpg.Connection) -> None:
    queue = await make_queue(client, "beats")
    handle = (await claimed(client, queue))["receipt_handle"]
    url = f"/v1/queues/{queue}/messages/{handle}/visibility"
    for payload in ({}, {"timeout": None}, {"timeout": "5"}, {"timeout": 1.5}, {"timeout": True},
                    {"timeout": -1}, {"timeout": 43_201}, {"timeout": 5, "extra": 1},
                    {"visibility_timeout": 5}):
        expect_invalid(await request_json(client, "PATCH", url, payload))
    assert await db.fetchval("SELECT leased FROM messages") is True
    for timeout in (43_200, 1):
        response = await client.patch(url, json={"timeout": timeout})
        assert response.status_code == 200 and response.json()["lease_seconds"] == timeout


# -- routing ------------------------------------------------------------------


async def test_unknown_routes_and_wrong_methods(client: httpx.AsyncClient) -> None:
    await make_queue(client, "routes")
    for path in ("/v1/nope", "/nope", "/v2/queues", "/v1/queues/routes/nope",
                 "/v1/queues/routes/messages/a/b/c", "/v1/queues/a/b"):
        expect_problem(await client.get(path), 404, "not_found")
    for method, path, allowed in (
        ("PUT", "/v1/queues", {"GET", "POST"}),
        ("DELETE", "/v1/queues", {"GET", "POST"}),
        ("PUT", "/v1/queues/routes/receive", {"GET", "POST"}),
        ("GET", "/v1/queues/routes/purge", {"POST"}),
        ("GET", "/v1/queues/routes/messages/h/visibility", {"PATCH"}),
        ("POST", "/healthz", {"GET"}),
    ):
        response = await client.request(method, path)
        expect_problem(response, 405, "method_not_allowed")
        # Starlette lists the methods of the first route whose path matched
        # (POST only for PUT /v1/queues), not of every route on the path.
        listed = {m.strip() for m in response.headers["allow"].split(",")}
        assert listed and listed <= allowed, listed


# -- fuzz ---------------------------------------------------------------------

FIELDS = [
    "name", "body", "attributes", "delay", "messages", "timeout", "cursor", "entries",
    "receipt_handle", "receipt_handles", "visibility_timeout", "message_retention",
    "max_message_bytes", "receive_wait", "x", "",
]
ENDPOINTS = [
    ("POST", "/v1/queues"),
    ("GET", "/v1/queues"),
    ("GET", "/v1/queues/{queue}"),
    ("PATCH", "/v1/queues/{queue}"),
    ("DELETE", "/v1/queues/{queue}"),
    ("POST", "/v1/queues/{queue}/purge"),
    ("POST", "/v1/queues/{queue}/messages"),
    ("GET", "/v1/queues/{queue}/receive"),
    ("POST", "/v1/queues/{queue}/receive"),
    ("PATCH", "/v1/queues/{queue}/messages/{receipt_handle}/visibility"),
    ("DELETE", "/v1/queues/{queue}/messages/{receipt_handle}"),
    ("PUT", "/v1/queues/{queue}/messages/{receipt_handle}/checkpoint"),
    ("POST", "/v1/queues/{queue}/messages/visibility"),
    ("POST", "/v1/queues/{queue}/messages/delete"),
    ("POST", "/v1/queues/{queue}/messages/{receipt_handle}/release"),
    ("GET", "/v1/queues/{queue}/messages"),
    ("GET", "/v1/queues/{queue}/dead-letter-sources"),
    ("POST", "/v1/queues/{queue}/redrive"),
    ("GET", "/v1/queues/{queue}/redrive"),
    ("GET", "/v1/redrive-tasks/{task_id}"),
    ("DELETE", "/v1/redrive-tasks/{task_id}"),
    ("POST", "/v1/keys"),
    ("GET", "/v1/keys"),
    ("DELETE", "/v1/keys/{key_id}"),
]


def _random_text(rng: random.Random) -> str:
    pools = [
        string.ascii_letters + string.digits + "-_",
        "".join(map(chr, range(0x20))) + "\u007f\ufffe\uffff\ud800\udfff",
        "é€\U0001f600ä ./%?#&=+\\\"'",
    ]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(rng.choice([0, 1, 5, 40])))


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return rng.choice([0, 1, -1, 5, 30, 900, 901, 43_201, 2**63, -(2**70), 10**40])
    if kind == 1:
        return rng.choice([0.5, -1.5, 1e300, 30.0])
    if kind == 2:
        return _random_text(rng)
    if kind == 3:
        return rng.choice([True, False])
    if kind == 4:
        return None
    if kind == 5:
        return rng.choice(["x", "a" * 300, "q" * 81])
    if kind == 6:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(FIELDS): _random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def _random_body(rng: random.Random, handles: list[str]) -> bytes:
    kind = rng.randrange(8)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 64))
    if kind == 1:
        text = raw(_random_json(rng))
        return text[: rng.randrange(len(text) + 1)].encode()  # truncated
    if kind == 2:
        depth = rng.choice([100, 3_000, 20_000])
        return b'{"cursor": ' + b"[" * depth + b"]" * depth + b"}"
    if kind == 3:
        return rng.choice([b'{"cursor": NaN}', b'{"timeout": Infinity}', b'{"delay": -0}',
                           b'{"body": "' + b"9" * 5_000 + b'"}', b"9" * 5_000])
    if kind == 4 and handles:
        return raw({"entries": [{"receipt_handle": rng.choice(handles),
                                 "timeout": rng.choice([0, 5, -1])}],
                    "receipt_handles": [rng.choice(handles)]}).encode()
    if kind == 5:
        return raw({"body": _random_text(rng) or "b",
                    "attributes": {_random_text(rng): _random_text(rng)}}).encode()
    return raw(_random_json(rng)).encode()


def _segment(text: str) -> str:
    """One path segment, lone surrogates and all (as invalid UTF-8)."""
    return quote(text.replace("/", "_").encode("utf-8", "surrogatepass"), safe="")


def _plausible_body(rng: random.Random, template: str, handle: str) -> bytes:
    """A body of the right shape for the route, with random values in it."""

    def value() -> Any:
        return rng.choice([_random_json(rng), rng.randrange(-2, 50), 0, 900, 43_200])

    def text() -> Any:
        return rng.choice([_random_text(rng), "ok", "x" * rng.choice([1, 2_000, 70_000])])

    shapes: dict[str, Callable[[], Any]] = {
        "/v1/queues": lambda: {"name": rng.choice(["fuzz", "keep", "new1", text()]),
                               rng.choice(list(LIMITS)): value()},
        "/v1/queues/{queue}": lambda: {rng.choice(list(LIMITS)): value()},
        "/v1/queues/{queue}/messages": lambda: rng.choice([
            {"body": text(), "attributes": {rng.choice(["k", "a b", ""]): text()}},
            {"body": text(), "delay": rng.choice([0, 1, -1, 901, None])},
            {"messages": [{"body": text()} for _ in range(rng.randrange(3))]},
        ]),
        "/v1/queues/{queue}/messages/{receipt_handle}/visibility": lambda: {"timeout": value()},
        "/v1/queues/{queue}/messages/{receipt_handle}/checkpoint": lambda: {
            "cursor": _random_json(rng)},
        "/v1/queues/{queue}/messages/visibility": lambda: {"entries": [
            {"receipt_handle": handle, "timeout": value()}]},
        "/v1/queues/{queue}/messages/delete": lambda: {"receipt_handles": [handle, text()]},
        # `wait` never valid and above 0: a fuzz case must not park for 20 s.
        "/v1/queues/{queue}/receive": lambda: {
            "max": value(), "wait": rng.choice([0, -1, 21, "x"]),
            rng.choice(["delete", "extend"]): rng.choice([
                [handle, text()], [{"receipt_handle": handle, "timeout": value()}]]),
        },
        "/v1/queues/{queue}/messages/{receipt_handle}/release": lambda: {"delay": value()},
        "/v1/queues/{queue}/redrive": lambda: {
            rng.choice(["destination", "max_per_second"]): rng.choice([value(), text()])},
        # Never a valid scope (random text is no action): a key created here would
        # lock the fuzz's keyless client out of everything after it.
        "/v1/keys": lambda: {"name": text(), "scopes": [_random_text(rng) + ":*"],
                             rng.choice(["expires_in", "rate_per_second"]): value()},
    }
    return raw(shapes[template]()).encode()


def _mutate_handle(rng: random.Random, handle: str) -> str:
    chars = list(handle)
    for _ in range(rng.randrange(1, 4)):
        action = rng.randrange(3)
        position = rng.randrange(len(chars))
        if action == 0:
            chars[position] = rng.choice(B64 + "=.~")
        elif action == 1:
            del chars[position]
        else:
            chars.insert(position, rng.choice(B64))
    return "".join(chars)


async def test_fuzz_never_500(client: httpx.AsyncClient, db: asyncpg.Connection) -> None:
    rng = random.Random(20240607)
    openapi = (await client.get("/openapi.json")).json()
    await make_queue(client, "keep")
    await make_queue(client, "fuzz")
    sentinel_body = "sentinel ✓ \t\n\U0001f600"
    sentinel_attrs = {"kind": "sentinel", "n": "1"}
    sentinel = await send(client, "keep", sentinel_body, attributes=sentinel_attrs)
    before = await db.fetchrow("SELECT * FROM messages")
    handles: list[str] = []
    content_types = ["application/json", "application/json; charset=utf-8", "text/plain",
                     "application/problem+json", "application/octet-stream", None]

    for _ in range(200):
        if not handles or rng.random() < 0.1:
            # The fuzz may have deleted or re-tuned its queue; put it back.
            await client.delete("/v1/queues/fuzz")
            await make_queue(client, "fuzz")
            await send(client, "fuzz", "seed")
            handles += [m["receipt_handle"] for m in await receive(
                client, "fuzz", max=10, wait=0, visibility_timeout=rng.choice([0, 600]))]
        method, template = rng.choice(ENDPOINTS)
        has_handle = "{receipt_handle}" in template
        # "keep" is only ever addressed with handles nobody holds; everything
        # else may hit the fuzz queue, a missing one, or a name that is not a name.
        queue = rng.choice(["keep"] if has_handle and rng.random() < 0.3 else
                           ["fuzz", "fuzz", "missing", "a.b", _random_text(rng) or "x"])
        handle = rng.choice(handles) if handles else "A" * 66
        if rng.random() < 0.6:
            handle = _mutate_handle(rng, handle) if rng.random() < 0.7 else _random_text(rng)
        path = template.format(queue=_segment(queue), receipt_handle=_segment(handle) or "h",
                               task_id=_segment(_random_text(rng)) or "t",
                               key_id=_segment(_random_text(rng)) or "k")
        params: dict[str, str] = {}
        if method == "GET":
            # Never a long poll: wait is always 0 or invalid.
            params = {k: rng.choice(values) for k, values in (
                ("wait", ["0", "-1", "21", "x", "1.5"]),
                ("max", ["1", "10", "0", "11", "q", str(10**30)]),
                ("visibility_timeout", ["0", "43201", "-1", "abc"]),
                ("prefix", ["", "f", "\u0000", "%", "a.b"]),
                ("limit", ["1", "0", "1001", "z"]),
            ) if rng.random() < 0.6}
            params.setdefault("wait", "0")
        content = None
        content_type = rng.choice(content_types)
        if method in ("POST", "PATCH", "PUT"):
            if rng.random() < 0.5 and not template.endswith("/purge"):
                content = _plausible_body(rng, template, handle)
                content_type = "application/json"
            else:
                content = _random_body(rng, handles)
        headers = {"content-type": content_type} if content_type else {}
        response = await client.request(method, path, params=params, content=content,
                                        headers=headers)
        status = response.status_code
        assert status < 500, (method, path, content, response.text)
        code = None
        if status >= 400:
            assert response.headers["content-type"].split(";")[0] == PROBLEM, response.text
            code = response.json()["code"]
        # Whatever it answered, the OpenAPI document says it can, with this code.
        # (A "." or ".." segment makes it another path: 404 not_found or 405.)
        if code not in ("not_found", "method_not_allowed"):
            documented = openapi["paths"][template][method.lower()]["responses"]
            assert str(status) in documented, (method, template, status, response.text)
            if code is not None:
                assert code in documented_codes(documented[str(status)]), (
                    method, template, status, code)
        if status == 200 and template.endswith("/receive"):
            handles += [m["receipt_handle"] for m in response.json()["messages"]]

    # The message sent before the fuzz is untouched and delivered as it was sent.
    assert await db.fetchrow(
        "SELECT m.* FROM messages m JOIN queues q ON q.id = m.queue_id WHERE q.name = 'keep'"
    ) == before
    (message,) = await receive(client, "keep", max=10)
    assert message["message_id"] == sentinel
    assert message["body"] == sentinel_body and message["attributes"] == sentinel_attrs
    assert message["receive_count"] == 1 and message["checkpoint"] is None


# -- OpenAPI ------------------------------------------------------------------

PROBLEM_STATUSES = {"400", "401", "403", "404", "409", "413", "415", "422", "429", "500", "503"}
GUARD_STATUSES = {"400", "401", "403", "413", "429", "500", "503"}
CHANGES = {"POST", "PUT", "PATCH", "DELETE"}


def documented_codes(response: dict[str, Any]) -> set[str]:
    """The `code` values a documented problem response lists."""
    schema = response["content"][PROBLEM]["schema"]
    narrowed = [part for part in schema["allOf"] if "$ref" not in part]
    return set(narrowed[0]["properties"]["code"]["enum"])


async def test_openapi_documents_problem_responses(client: httpx.AsyncClient) -> None:
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    doc = response.json()
    problem_schema = doc["components"]["schemas"]["Problem"]
    assert set(problem_schema["required"]) >= {"type", "title", "status", "code", "detail"}

    operations: dict[tuple[str, str], dict[str, Any]] = {
        (method.upper(), path): operation
        for path, item in doc["paths"].items() if path.startswith("/v1")
        for method, operation in item.items()
    }
    assert len(operations) == len(ENDPOINTS)
    assert {(m, p) for m, p in ENDPOINTS} == set(operations)

    def expect(statuses: set[str], applies: Callable[[str, str, dict[str, Any]], bool]) -> None:
        for (method, path), operation in operations.items():
            if applies(method, path, operation):
                missing = statuses - set(operation["responses"])
                assert not missing, (method, path, missing)

    def codes(method: str, path: str, status: int) -> set[str]:
        return documented_codes(operations[(method, path)]["responses"][str(status)])

    # The guard's, the body limit's and the database's, on every operation.
    expect(GUARD_STATUSES, lambda m, p, o: True)
    expect({"415"}, lambda m, p, o: m in CHANGES)
    expect({"422"}, lambda m, p, o: "requestBody" in o or any(
        x["in"] == "query" for x in o.get("parameters", ())))
    expect({"404"}, lambda m, p, o: "{" in p)
    expect({"400", "409"}, lambda m, p, o: "{receipt_handle}" in p)
    expect({"409"}, lambda m, p, o: (m, p) == ("POST", "/v1/queues"))
    assert codes("POST", "/v1/queues", 409) == {"queue_already_exists"}
    assert codes("POST", "/v1/queues", 400) == {"host_not_allowed", "invalid_redrive_policy"}
    assert codes("DELETE", "/v1/queues/{queue}", 409) == {"queue_in_use"}
    assert codes("POST", "/v1/queues/{queue}/messages", 413) == {
        "request_too_large", "message_too_large"}
    assert codes("GET", "/v1/queues/{queue}/receive", 503) == {
        "database_unavailable", "overloaded"}
    assert codes("DELETE", "/v1/keys/{key_id}", 404) == {"key_not_found"}
    assert codes("GET", "/v1/redrive-tasks/{task_id}", 404) == {"task_not_found"}
    assert codes("DELETE", "/v1/queues/{queue}/messages/{receipt_handle}", 409) == {"lease_lost"}
    # No input to validate, no 422.
    assert "422" not in operations[("GET", "/v1/keys")]["responses"]
    assert "422" not in operations[("GET", "/v1/queues/{queue}")]["responses"]

    for (method, path), operation in operations.items():
        assert operation["security"] == [{"bearer": []}], (method, path)
        for status, documented in operation["responses"].items():
            if int(status) < 400:
                continue
            assert status in PROBLEM_STATUSES, (method, path, status)
            content = documented["content"]
            assert set(content) == {PROBLEM}, (method, path, status, content)
            schema = content[PROBLEM]["schema"]
            assert {"$ref": "#/components/schemas/Problem"} in schema["allOf"]
            listed = documented_codes(documented)
            assert listed and set(content[PROBLEM]["examples"]) == listed
            # A 500 is never an expected answer: only the generic internal_error.
            assert (status == "500") == (listed == {"internal_error"}), (method, path, listed)
            for example in content[PROBLEM]["examples"].values():
                assert example["value"]["status"] == int(status)
        if "429" in operation["responses"]:
            assert operation["responses"]["429"]["headers"]["Retry-After"]["required"]
    assert doc["components"]["securitySchemes"]["bearer"] == {
        **doc["components"]["securitySchemes"]["bearer"], "type": "http", "scheme": "bearer"}
    for path in ("/healthz", "/readyz"):
        assert "security" not in doc["paths"][path]["get"]
        assert "401" not in doc["paths"][path]["get"]["responses"]
