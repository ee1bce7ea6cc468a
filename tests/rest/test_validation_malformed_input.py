"""Input validation at the REST boundary, against the real app and PostgreSQL:
malformed bodies, checkpoint cursors, huge integers, receipt handles that are not
handles, unknown routes and wrong methods.

Every limit is probed at its edges (min, max, min-1, max+1), every refusal is
checked to be problem+json with a stable code, and refused input is checked
not to have reached the database. Malformed input of any kind must be a 4xx,
never a 500: the ASGI transport re-raises unhandled server errors, so a 500
fails these tests loudly.
"""

from __future__ import annotations

import base64
import random
from urllib.parse import quote

import asyncpg
import httpx
from support import make_queue, receive
from validation_support import B64, JSON, claimed, expect_invalid, expect_problem, raw, request_json

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
    before = await db.fetchrow("SELECT * FROM leaseq.messages")
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
    assert await db.fetchrow("SELECT * FROM leaseq.messages") == before
    assert await db.fetchval("SELECT count(*) FROM leaseq.queues") == 1
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
    assert await db.fetchval("SELECT checkpoint FROM leaseq.messages") is None

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
    before = await db.fetchrow("SELECT * FROM leaseq.messages")
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

    assert await db.fetchrow("SELECT * FROM leaseq.messages") == before
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
    assert await db.fetchval("SELECT leased FROM leaseq.messages") is True
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
