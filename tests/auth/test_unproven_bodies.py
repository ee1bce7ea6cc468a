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
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from conftest import ServeApp
from sqs_clients import client, run
from support import wait_until

from app.asgi.body_budget import BodyBudget, ProvenCallers, address_of

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
OTHER_SECRET = "Hq8vT2mZk4Xw9LbN0cRj7YdPf3GsA6eUo1iKt5Vn"
KEYS = f"AKIDREAL:{SECRET},AKIDOTHER:{OTHER_SECRET}"
FORGED = "Zq3_x8VbN1-kPf0wYt7uLr2sHc9aJe4dMg6iWo5n"
LIMIT = 600_000  # the largest request, and so one address's share (of a budget of two)
BODY = 500_000  # two never fit in one share


def _batch_body(size: int) -> bytes:
    entries = [{"Id": f"m{i}", "MessageBody": "x" * (size // 10 - 100)} for i in range(10)]
    return json.dumps({"QueueUrl": "http://127.0.0.1/000000000000/q", "Entries": entries}).encode()


def _forged_headers(endpoint: str, body: bytes, key: str = "AKIDREAL") -> dict[str, str]:
    """Headers naming a real key id, signed with a secret that is not its own."""
    request = AWSRequest(method="POST", url=endpoint + "/", data=body, headers={
        "Content-Type": "application/x-amz-json-1.0",
        "X-Amz-Target": "AmazonSQS.SendMessageBatch",
    })
    SigV4Auth(Credentials(key, FORGED), "sqs", "us-east-1").add_auth(request)
    return dict(request.headers.items())


async def _serve(serve_factory: ServeApp, **more: Any) -> tuple[str, Any]:
    return await serve_factory(sqs_credentials=KEYS, max_request_bytes=LIMIT,
                               max_batch=10, **more)


async def test_forged_signatures_never_hold_more_than_the_budget(
    serve_factory: ServeApp,
) -> None:
    endpoint, app = await _serve(serve_factory, unproven_body_wait_seconds=30)
    budget = app.state.unproven
    assert (budget.limit, budget.per_address) == (2 * LIMIT, LIMIT)
    body = _batch_body(BODY)
    async with httpx.AsyncClient(base_url=endpoint, timeout=60) as http:
        answers = await asyncio.gather(*(
            http.post("/", content=body, headers=_forged_headers(endpoint, body))
            for _ in range(8)))
    for answer in answers:
        assert answer.status_code == 403, answer.text[:300]
        assert answer.json()["__type"].endswith(("#SignatureDoesNotMatch",
                                                 "#RequestThrottled")), answer.text[:300]
    assert 0 < budget.high_water <= LIMIT  # all from one address
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


def _holder(endpoint: str, how: str, source: str = "127.0.0.1",
            key: str = "AKIDREAL") -> socket.socket:
    """A connection (from the address `source`) naming the real key id with a
    forged signature that declares the largest body (or sends one chunked, of no
    declared length), sends its first bytes and holds."""
    port = int(endpoint.rsplit(":", 1)[1])
    body = _batch_body(BODY)
    framing = (f"Content-Length: {LIMIT}\r\n" if how == "declared"
               else "Transfer-Encoding: chunked\r\n")
    head = f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in _forged_headers(endpoint, body, key).items()
    ) + framing + "\r\n"
    start = body[:1000] if how == "declared" else b"3e8\r\n" + body[:1000] + b"\r\n"
    holder = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
    holder.sendall(head.encode() + start)
    return holder


@pytest.mark.parametrize("how", ["declared", "chunked"])
async def test_one_caller_holding_a_forged_body_starves_no_one(
    serve_factory: ServeApp, how: str,
) -> None:
    """One connection, naming a real key id with a forged signature, held the whole
    budget while it trickled its body: every other SQS request, however small and
    however well signed, waited and was throttled. Now a small body reserves
    nothing, and one client address holds at most one full request of a budget
    of two: the small calls go through at once, from the holder's own address
    too, and so does a full batch signed properly from another address."""
    endpoint, app = await _serve(serve_factory, unproven_body_wait_seconds=0.5,
                                 body_min_bytes_per_second=0)
    budget = app.state.unproven
    # The forger is not where the proven caller is (127.0.0.1): there, it would
    # draw on the proven callers' budget (test_forgers_on_many_addresses_...).
    holder = _holder(endpoint, how, "127.0.0.3")
    try:
        await wait_until(lambda: budget.held == LIMIT)
        good = client(endpoint, "json", key="AKIDREAL", secret=SECRET)
        await run(good.list_queues)
        url = (await run(good.create_queue, QueueName="q"))["QueueUrl"]
        await run(good.send_message, QueueUrl=url, MessageBody="small")
        # A full batch, signed properly, from another client address not proven
        # yet: with another key it has the rest of the budget; with the key the
        # forger names, that key's share is out (a stranger naming a key id holds at
        # most one full request of the budget, forgers included).
        body = json.dumps({"QueueUrl": url, "Entries": [
            {"Id": f"m{i}", "MessageBody": "y" * (BODY // 10 - 100)} for i in range(10)
        ]}).encode()

        async def batch_from_elsewhere(key: str, secret: str) -> httpx.Response:
            signed = AWSRequest(method="POST", url=endpoint + "/", data=body, headers={
                "Content-Type": "application/x-amz-json-1.0",
                "X-Amz-Target": "AmazonSQS.SendMessageBatch",
            })
            SigV4Auth(Credentials(key, secret), "sqs", "us-east-1").add_auth(signed)
            elsewhere = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
            async with httpx.AsyncClient(transport=elsewhere, timeout=60) as http:
                return await http.post(endpoint + "/", content=body,
                                       headers=dict(signed.headers.items()))

        same_key = await batch_from_elsewhere("AKIDREAL", SECRET)
        assert same_key.json()["__type"].endswith("#RequestThrottled"), same_key.text[:300]
        answer = await batch_from_elsewhere("AKIDOTHER", OTHER_SECRET)
        assert answer.status_code == 200, answer.text[:300]
        assert len(answer.json()["Successful"]) == 10
        assert budget.high_water == LIMIT + len(body)  # held beside the holder's
        # The holder's address has its share out: its next large body waits, and
        # is throttled unread.
        forged = _batch_body(BODY)
        forger = httpx.AsyncHTTPTransport(local_address="127.0.0.3")
        async with httpx.AsyncClient(transport=forger, timeout=60) as http:
            answer = await http.post(endpoint + "/", content=forged,
                                     headers=_forged_headers(endpoint, forged))
        assert answer.json()["__type"].endswith("#RequestThrottled"), answer.text[:300]
        assert budget.held == LIMIT
    finally:
        holder.close()
    await wait_until(lambda: budget.held == 0)


async def test_forgers_on_many_addresses_keep_no_proven_caller_out(
    serve_factory: ServeApp,
) -> None:
    """Two forged bodies held from two addresses filled the whole budget (one full
    request per address, two in all): every large body of anyone else waited and
    was throttled. A caller whose signature checked out lately from its address
    draws on a budget of its own, which a forged signature never reaches."""
    endpoint, app = await _serve(serve_factory, unproven_body_wait_seconds=0.5,
                                 body_min_bytes_per_second=0)
    strangers, known = app.state.unproven, app.state.unproven_known
    good = client(endpoint, "json", key="AKIDREAL", secret=SECRET)
    url = (await run(good.create_queue, QueueName="q"))["QueueUrl"]  # proves 127.0.0.1
    # Two forgers, two addresses, two key ids: the strangers' budget is full.
    holders = [_holder(endpoint, "declared", source, key)
               for source, key in (("127.0.0.2", "AKIDREAL"), ("127.0.0.3", "AKIDOTHER"))]
    try:
        await wait_until(lambda: strangers.held == strangers.limit)
        sent = await run(good.send_message_batch, QueueUrl=url, Entries=[
            {"Id": f"m{i}", "MessageBody": "y" * (BODY // 10 - 100)} for i in range(10)])
        assert len(sent["Successful"]) == 10
        assert known.high_water > 0 and known.held == 0
        # A stranger's large body still has only the strangers' budget, which is full.
        forged = _batch_body(BODY)
        elsewhere = httpx.AsyncHTTPTransport(local_address="127.0.0.4")
        async with httpx.AsyncClient(transport=elsewhere, timeout=60) as http:
            answer = await http.post(endpoint + "/", content=forged,
                                     headers=_forged_headers(endpoint, forged))
        assert answer.json()["__type"].endswith("#RequestThrottled"), answer.text[:300]
        assert strangers.high_water == strangers.limit
    finally:
        for holder in holders:
            holder.close()
    await wait_until(lambda: strangers.held == 0)


def test_a_caller_is_proven_for_a_while_by_address_and_key() -> None:
    proven = ProvenCallers(seconds=600, most=2)
    proven.prove("203.0.113.7", "AKIDREAL")
    assert proven.knows("203.0.113.7", "AKIDREAL")
    assert not proven.knows("203.0.113.8", "AKIDREAL")  # another address
    assert not proven.knows("203.0.113.7", "AKIDOTHER")  # another key
    proven.prove("203.0.113.8", "AKIDREAL")
    proven.prove("203.0.113.9", "AKIDREAL")  # past `most`: the least recent goes
    assert len(proven) == 2 and not proven.knows("203.0.113.7", "AKIDREAL")
    lapsed = ProvenCallers(seconds=-1.0)
    lapsed.prove("203.0.113.7", "AKIDREAL")
    assert not lapsed.knows("203.0.113.7", "AKIDREAL")


async def test_a_waiter_for_its_own_address_share_holds_up_no_one_else() -> None:
    budget = BodyBudget(300, per_address=100)
    first = await budget.reserve(100, "a", wait=0)
    assert first is not None
    # One address cannot take more than its share, whatever the budget has left...
    assert await budget.reserve(10, "a", wait=0) is None
    second = asyncio.create_task(budget.reserve(60, "a", wait=30))
    third = asyncio.create_task(budget.reserve(50, "a", wait=30))
    await wait_until(lambda: budget.waiters() == 2)
    # ...and its waiting holds up no other address the budget has room for.
    other = await budget.reserve(100, "b", wait=0)
    assert other is not None
    first.release()
    got = await second  # in order: the address's next one first
    assert got is not None
    assert not third.done()
    got.release()
    last = await third
    assert last is not None
    for held in (other, last):
        held.release()
    assert (budget.held, budget.waiters(), budget.high_water) == (0, 0, 200)


async def test_the_total_stays_bounded_whatever_the_addresses() -> None:
    budget = BodyBudget(200, per_address=100)
    a = await budget.reserve(100, "a", wait=0)
    b = await budget.reserve(100, "b", wait=0)
    assert a is not None and b is not None
    assert await budget.reserve(1, "c", wait=0) is None
    big = asyncio.create_task(budget.reserve(100, "c", wait=30))
    small = asyncio.create_task(budget.reserve(20, "d", wait=30))
    await wait_until(lambda: budget.waiters() == 2)
    a.release()
    c = await big  # the large one first, in order: not starved by the small one
    assert c is not None
    assert not small.done()
    b.release()
    d = await small
    assert d is not None
    assert budget.high_water == 200
    # A waiter that gives up leaves no claim behind.
    gone = asyncio.create_task(budget.reserve(100, "c", wait=30))
    await wait_until(lambda: budget.waiters() == 1)
    queued = asyncio.create_task(budget.reserve(100, "e", wait=30))
    await wait_until(lambda: budget.waiters() == 2)
    for task in (gone, queued):
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    c.release()
    d.release()
    assert (budget.held, budget.waiters()) == (0, 0)
    again = await budget.reserve(100, "c", wait=0)
    assert again is not None
    assert await budget.reserve(100, "e", wait=0) is not None


def test_a_client_address_is_its_host_an_ipv6_host_its_slash_64() -> None:
    assert address_of(("203.0.113.7", 5000)) == "203.0.113.7"
    assert address_of(("::ffff:203.0.113.7", 5000)) == "203.0.113.7"
    assert address_of(("2001:db8:1:2::1", 1)) == address_of(("2001:db8:1:2:ffff::9", 2))
    assert address_of(("2001:db8:1:2::1", 1)) != address_of(("2001:db8:1:3::1", 1))
    assert address_of(None) == ""


async def test_only_a_request_signed_allowed_and_within_its_rate_proves_its_caller(
    serve_factory: ServeApp,
) -> None:
    """A signature that checks out is not enough to be proven: a key refused the
    action (any key holder's, or a replayed link's) would otherwise reach the
    proven callers' budget for its address."""
    admin = "LQBOOTSTRAPADMIN0001.admin-secret-0123456789abcdefghij"
    endpoint, app = await serve_factory(admin_key=admin)
    async with httpx.AsyncClient(base_url=endpoint, timeout=30) as http:
        made = await http.post("/v1/keys", json={"name": "narrow", "scopes": ["send:only-*"]},
                               headers={"Authorization": f"Bearer {admin}"})
    assert made.status_code == 201, made.text
    narrow_id, narrow_secret = made.json()["token"].split(".", 1)
    narrow = client(endpoint, "json", key=narrow_id, secret=narrow_secret)
    with pytest.raises(Exception, match="AccessDenied"):
        await run(narrow.list_queues)
    proven = app.state.proven
    assert not proven.knows("127.0.0.1", narrow_id)
    admin_id, admin_secret = admin.split(".", 1)
    await run(client(endpoint, "json", key=admin_id, secret=admin_secret).list_queues)
    assert proven.knows("127.0.0.1", admin_id)
