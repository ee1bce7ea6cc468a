"""The lean path's front (app/asgi/lean.py, `Front`): what the middleware stack
does to a request (its id, the body limit, the Guard's checks, the count and the
log line), done in one call. The same requests, answered once through the front
and once through the middleware stack it stands for, get the same answers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from conftest import AppClient

ADMIN = "LQBOOTSTRAPADMIN0001.admin-secret-0123456789abcdefghij"
JSON = {"content-type": "application/json"}


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def _chunks(body: bytes) -> AsyncIterator[bytes]:
    # No Content-Length: the limit is found while the body is read.
    for start in range(0, len(body), 4096):
        yield body[start:start + 4096]


async def _requests(client: httpx.AsyncClient, queue: str) -> list[tuple[Any, ...]]:
    """One request of each kind the front decides, each answer reduced to what
    must not differ between the two ways (ids are made per request)."""
    app = client.app  # type: ignore[attr-defined]
    admin = _bearer(ADMIN)
    created = await client.post("/v1/queues", json={"name": queue}, headers=admin)
    assert created.status_code == 201, created.text
    info, secret = await app.state.keys.create("reader", ["receive:*"])
    reader = _bearer(f"{info.id}.{secret}")
    path = f"/v1/queues/{queue}/messages"
    big = b'{"timeout": 1, "pad": "' + b"x" * 1_100_000 + b'"}'
    cases: list[tuple[str, str, dict[str, str], Any]] = [
        ("POST", path, {**JSON, **admin, "x-request-id": "given-1"}, b'{"body": "a"}'),
        ("POST", path, {**JSON, "x-request-id": "given-2"}, b'{"body": "b"}'),  # no key
        ("POST", path, {**JSON, **reader}, b'{"body": "c"}'),  # a scope missing
        ("POST", path, {"content-type": "text/plain", **admin}, b"d"),
        ("POST", path, {**JSON, **admin, "origin": "https://elsewhere.example"},
         b'{"body": "e"}'),
        ("POST", path, {**JSON, **admin, "host": "not-allowed.example"}, b'{"body": "f"}'),
        ("PATCH", f"{path}/nohandle/visibility", {**JSON, **admin}, big),  # declared size
        ("PATCH", f"{path}/nohandle/visibility", {**JSON, **admin}, _chunks(big)),
        ("GET", f"/v1/queues/{queue}/receive?max=10",
         {**reader, "x-request-id": "bad id\n"}, None),
        ("GET", "/v1/queues/missing/receive", admin, None),
    ]
    answers = []
    for method, target, headers, body in cases:
        answer = await client.request(method, target, headers=headers, content=body)
        given = headers.get("x-request-id")
        request_id = answer.headers.get("x-request-id", "")
        answers.append((
            method, target.replace(queue, "{queue}"), answer.status_code,
            answer.headers.get("content-type"),
            answer.json().get("code") if answer.content else None,
            answer.headers.get("connection"),
            (answer.headers.get("www-authenticate") or "")[:6],
            len(request_id), given is not None and given == request_id,
        ))
    return answers


def _counted(metrics: str) -> list[str]:
    return sorted(line for line in metrics.splitlines()
                  if line.startswith("leaseq_http_requests_total{")
                  and "{queue}" in line)


async def test_the_front_answers_as_the_middleware_stack_does(
    app_factory: AppClient, caplog: pytest.LogCaptureFixture,
) -> None:
    settings = {"admin_key": ADMIN, "allowed_hosts": "leaseq.test", "access_log": True,
                "max_request_bytes": 1_048_576}
    front = await app_factory(**settings)
    stack = await app_factory(**settings)
    assert front.app._front is not None  # type: ignore[attr-defined]  # no CORS: the front
    stack.app._front = None  # type: ignore[attr-defined]  # the middleware, as with CORS

    seen = {}
    for way, client, queue in [("front", front, "by-front"), ("stack", stack, "by-stack")]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="leaseq.access"):
            answers = await _requests(client, queue)
        logged = [(r.method, r.route, r.status)  # type: ignore[attr-defined]
                  for r in caplog.records if "{queue}" in getattr(r, "route", "")]
        metrics = await client.get("/metrics", headers=_bearer(ADMIN))
        seen[way] = (answers, logged, _counted(metrics.text))
    built = front.app._lean_stack  # type: ignore[attr-defined]
    assert "_front" in repr(built.app), "the front served the first app's cycle"

    answers, logged, counted = seen["front"]
    assert seen["stack"] == seen["front"]
    # ...and both are right, not only alike:
    assert [a[2] for a in answers] == [201, 401, 403, 415, 403, 400, 413, 413, 200, 404]
    assert [a[4] for a in answers] == [
        None, "unauthenticated", "forbidden", "unsupported_media_type", "forbidden",
        "host_not_allowed", "request_too_large", "request_too_large", None,
        "queue_not_found"]
    assert all(a[7] for a in answers), "every answer carries an X-Request-Id"
    assert [a[8] for a in answers][:2] == [True, True]  # a sane id given is echoed
    assert answers[8][8] is False  # one with a line break is replaced
    assert answers[1][6] == "Bearer"
    # Refused with its body unread: the connection is not kept for the rest of it.
    assert [a[5] for a in answers][1:6] == ["close"] * 5
    # One access line and one count per request, with the status it got.
    assert [line[2] for line in logged] == [a[2] for a in answers]
    by_status = {}
    for line in counted:
        status = line.split('status="', 1)[1].split('"', 1)[0]
        by_status[status] = by_status.get(status, 0) + float(line.rsplit(" ", 1)[1])
    assert by_status == {"201": 1, "401": 1, "403": 2, "415": 1, "400": 1, "413": 2,
                         "200": 1, "404": 1}
