"""Before a caller is proven, the process holds a bounded amount of body in total
(LEASEQ_UNPROVEN_BODY_BYTES, app/asgi/body_budget.py). SQS key ids are not
secret (every receiver sees SenderId): a real key id with a forged SigV4
signature made the service read a whole body before refusing it, as many at
once as were sent. Each such request now reserves its declared length before
its body is read and gives it back once its signature is checked; one that
cannot have it in time is throttled, its body unread."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from conftest import ServeApp
from sqs_clients import client, run
from support import wait_until

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
KEYS = f"AKIDREAL:{SECRET}"
FORGED = "Zq3_x8VbN1-kPf0wYt7uLr2sHc9aJe4dMg6iWo5n"
LIMIT = 600_000  # the largest request, and so the budget
BODY = 500_000  # two never fit at once


def _batch_body(size: int) -> bytes:
    entries = [{"Id": f"m{i}", "MessageBody": "x" * (size // 10 - 100)} for i in range(10)]
    return json.dumps({"QueueUrl": "http://127.0.0.1/000000000000/q", "Entries": entries}).encode()


def _forged_headers(endpoint: str, body: bytes) -> dict[str, str]:
    """Headers naming the real key id, signed with a secret that is not its own."""
    request = AWSRequest(method="POST", url=endpoint + "/", data=body, headers={
        "Content-Type": "application/x-amz-json-1.0",
        "X-Amz-Target": "AmazonSQS.SendMessageBatch",
    })
    SigV4Auth(Credentials("AKIDREAL", FORGED), "sqs", "us-east-1").add_auth(request)
    return dict(request.headers.items())


async def _serve(serve_factory: ServeApp, **more: Any) -> tuple[str, Any]:
    return await serve_factory(sqs_credentials=KEYS, max_request_bytes=LIMIT,
                               max_batch=10, **more)


async def test_forged_signatures_never_hold_more_than_the_budget(
    serve_factory: ServeApp,
) -> None:
    endpoint, app = await _serve(serve_factory, unproven_body_wait_seconds=30)
    budget = app.state.unproven
    assert budget.limit == LIMIT
    body = _batch_body(BODY)
    async with httpx.AsyncClient(base_url=endpoint, timeout=60) as http:
        answers = await asyncio.gather(*(
            http.post("/", content=body, headers=_forged_headers(endpoint, body))
            for _ in range(8)))
    for answer in answers:
        assert answer.status_code == 403, answer.text[:300]
        assert answer.json()["__type"].endswith(("#SignatureDoesNotMatch",
                                                 "#RequestThrottled")), answer.text[:300]
    assert 0 < budget.high_water <= LIMIT
    assert budget.held == 0
    # A legitimate full batch is always proven, and goes through.
    good = client(endpoint, "json", key="AKIDREAL", secret=SECRET)
    url = (await run(good.create_queue, QueueName="q"))["QueueUrl"]
    sent = await run(good.send_message_batch, QueueUrl=url, Entries=[
        {"Id": f"m{i}", "MessageBody": "y" * (BODY // 10 - 100)} for i in range(10)])
    assert len(sent["Successful"]) == 10
    assert budget.held == 0


async def test_a_request_that_cannot_reserve_in_time_is_throttled_unread(
    serve_factory: ServeApp,
) -> None:
    endpoint, app = await _serve(serve_factory, unproven_body_wait_seconds=0.2)
    budget = app.state.unproven
    body = _batch_body(BODY)
    port = int(endpoint.rsplit(":", 1)[1])
    # One forged request sends its headers and the start of its body, and holds.
    holder = socket.create_connection(("127.0.0.1", port))
    head = f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in _forged_headers(endpoint, body).items()
    ) + f"Content-Length: {len(body)}\r\n\r\n"
    holder.sendall(head.encode() + body[:1000])
    try:
        await wait_until(lambda: budget.held == len(body))
        async with httpx.AsyncClient(base_url=endpoint, timeout=60) as http:
            answer = await http.post("/", content=body,
                                     headers=_forged_headers(endpoint, body))
        assert answer.status_code == 403, answer.text[:300]
        assert answer.json()["__type"].endswith("#RequestThrottled")
        assert answer.headers["connection"] == "close"
        assert answer.headers["retry-after"] == "1"
        assert budget.high_water == len(body)
    finally:
        holder.close()
    # The holder went away: its share comes back.
    await wait_until(lambda: budget.held == 0)
