"""A REST body nested far past Python's recursion limit is 422 validation_error on
every route that takes JSON (lean or FastAPI's), never a 500."""

from __future__ import annotations

import httpx
import pytest
from support import make_queue

DEEP_LIST = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"a":' * 50_000 + b"1" + b"}" * 50_000


@pytest.mark.parametrize("body", [DEEP_LIST, DEEP_OBJECT, b'{"body":' + DEEP_LIST + b"}"],
                         ids=["list", "object", "in-a-field"])
async def test_a_deep_body_is_a_validation_error(client: httpx.AsyncClient, body: bytes) -> None:
    queue = await make_queue(client, "deep")
    for method, path in [
        ("POST", "/v1/queues"), ("PATCH", f"/v1/queues/{queue}"),
        ("POST", f"/v1/queues/{queue}/messages"), ("POST", f"/v1/queues/{queue}/receive"),
        ("POST", f"/v1/queues/{queue}/messages/delete"),
        ("POST", f"/v1/queues/{queue}/messages/visibility"),
        ("POST", f"/v1/queues/{queue}/redrive"), ("POST", "/v1/keys"),
    ]:
        answer = await client.request(method, path, content=body,
                                      headers={"content-type": "application/json"})
        assert answer.status_code == 422, (method, path, answer.text[:300])
        assert answer.json()["code"] == "validation_error"
