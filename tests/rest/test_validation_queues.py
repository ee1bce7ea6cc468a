"""Input validation at the REST boundary, against the real app and PostgreSQL:
queue attributes, queue names, queues that do not exist, and listing.

Every limit is probed at its edges (min, max, min-1, max+1), every refusal is
checked to be problem+json with a stable code, and refused input is checked
not to have reached the database. Malformed input of any kind must be a 4xx,
never a 500: the ASGI transport re-raises unhandled server errors, so a 500
fails these tests loudly.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
from support import make_queue
from validation_support import (
    DEFAULTS,
    LIMITS,
    claimed,
    expect_invalid,
    expect_problem,
    request_json,
)

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
    assert await db.fetchval("SELECT count(*) FROM leaseq.queues WHERE name LIKE 'bad-%'") == 0
    assert await db.fetchval("SELECT count(*) FROM leaseq.queues") == 2 * len(LIMITS)


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
    names = await db.fetch("SELECT name FROM leaseq.queues")
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
