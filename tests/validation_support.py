"""What the REST validation tests share (tests/rest/test_validation_*.py): the
limits and defaults of a queue's attributes, and checks of problem+json answers."""

from __future__ import annotations

import json
import string
from typing import Any

import asyncpg
import httpx
from support import receive, send

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
    "fair": False,
    "fairness": {"in_flight_share": 0.1, "in_flight_min": 30, "processing_share": 0.1},
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
    count: int = await db.fetchval("SELECT count(*) FROM leaseq.messages")
    return count


async def claimed(client: httpx.AsyncClient, queue: str, body: str = "job") -> dict[str, Any]:
    await send(client, queue, body)
    (message,) = await receive(client, queue, visibility_timeout=600)
    return message
