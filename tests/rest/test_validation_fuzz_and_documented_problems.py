"""Input validation at the REST boundary, against the real app and PostgreSQL:
random and plausible requests on every route never get a 500, and every problem
answer is documented in the OpenAPI document.

Every limit is probed at its edges (min, max, min-1, max+1), every refusal is
checked to be problem+json with a stable code, and refused input is checked
not to have reached the database. Malformed input of any kind must be a 4xx,
never a 500: the ASGI transport re-raises unhandled server errors, so a 500
fails these tests loudly.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
from support import make_queue, receive, send
from validation_support import B64, LIMITS, PROBLEM, raw

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
    before = await db.fetchrow("SELECT * FROM leaseq.messages")
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
        "SELECT m.* FROM leaseq.messages m JOIN leaseq.queues q ON q.id = m.queue_id WHERE "
        "q.name = 'keep'"
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
