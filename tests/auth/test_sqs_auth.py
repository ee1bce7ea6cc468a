"""API keys on the SQS door: boto3 signs with a leaseq key (id as the access key
id); scopes apply per action and queue; SigV4 is hardened (a 15-minute date
window, the headers that must be signed, verification before the body is
parsed, presigned Query URLs honoured for 15 minutes at most)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import httpx
import pytest
import time_machine
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from conftest import ServeApp
from sqs_clients import client, error_code, run

ADMIN_ID = "LQBOOTSTRAPADMIN0001"
ADMIN_SECRET = "admin-secret-0123456789abcdefghij"


@pytest.fixture
async def keyed(serve_factory: ServeApp) -> tuple[str, Any]:
    """A real uvicorn serving an app whose store holds the bootstrap admin key."""
    return await serve_factory(admin_key=f"{ADMIN_ID}.{ADMIN_SECRET}")


async def _key(app: Any, *scopes: str) -> tuple[str, str]:
    info, secret = await app.state.keys.create("test", list(scopes))
    return info.id, secret


def _signed(endpoint: str, *, body: bytes, target: str | None, key: str, secret: str,
            at: datetime | None = None, path: str = "/",
            headers: dict[str, str] | None = None) -> AWSRequest:
    all_headers = {"Content-Type": "application/x-amz-json-1.0", **(headers or {})}
    if target is not None:
        all_headers["X-Amz-Target"] = f"AmazonSQS.{target}"
    request = AWSRequest(method="POST", url=endpoint + path, data=body, headers=all_headers)
    signer = SigV4Auth(Credentials(key, secret), "sqs", "us-east-1")
    if at is None:
        signer.add_auth(request)
    else:
        with mock.patch("botocore.auth.get_current_datetime", return_value=at):
            signer.add_auth(request)
    return request


@pytest.mark.parametrize("protocol", ["json", "query"])
async def test_a_store_key_signs_for_boto3(keyed: tuple[str, Any], protocol: str) -> None:
    endpoint, app = keyed
    admin = client(endpoint, protocol, key=ADMIN_ID, secret=ADMIN_SECRET)
    url = (await run(admin.create_queue, QueueName="orders-1"))["QueueUrl"]
    await run(admin.create_queue, QueueName="billing")

    key, secret = await _key(app, "send:orders-*")
    sender = client(endpoint, protocol, key=key, secret=secret)
    assert (await run(sender.get_queue_url, QueueName="orders-1"))["QueueUrl"] == url
    await run(sender.send_message, QueueUrl=url, MessageBody="hi")
    for call, kwargs in [
        (sender.receive_message, {"QueueUrl": url}),
        (sender.purge_queue, {"QueueUrl": url}),
        (sender.send_message, {"QueueUrl": url.replace("orders-1", "billing"),
                               "MessageBody": "x"}),
        (sender.create_queue, {"QueueName": "orders-2"}),
        (sender.list_queues, {}),
    ]:
        with pytest.raises(ClientError) as info:
            await run(call, **kwargs)
        assert error_code(info.value) == "AccessDenied", call
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403

    worker_key, worker_secret = await _key(app, "receive:orders-*", "read:orders-*")
    worker = client(endpoint, protocol, key=worker_key, secret=worker_secret)
    got = await run(worker.receive_message, QueueUrl=url, AttributeNames=["SenderId"])
    (message,) = got["Messages"]
    assert message["Body"] == "hi" and message["Attributes"]["SenderId"] == key
    await run(worker.delete_message, QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert (await run(worker.list_queues)).get("QueueUrls") == [url]

    wrong = client(endpoint, protocol, key=key, secret="not-the-secret")
    with pytest.raises(ClientError) as info:
        await run(wrong.list_queues)
    assert error_code(info.value) == "SignatureDoesNotMatch"
    await app.state.keys.revoke(key)
    with pytest.raises(ClientError) as info:
        await run(sender.send_message, QueueUrl=url, MessageBody="after revoke")
    assert error_code(info.value) == "InvalidClientTokenId"


async def test_the_signature_date_must_be_within_15_minutes(keyed: tuple[str, Any]) -> None:
    endpoint, _ = keyed
    now = datetime.now(UTC)
    async with httpx.AsyncClient() as http:
        for when, ok in [(now - timedelta(minutes=10), True), (now + timedelta(minutes=10), True),
                         (datetime(2019, 1, 1, tzinfo=UTC), False),
                         (datetime(2099, 1, 1, tzinfo=UTC), False),
                         (now - timedelta(minutes=16), False)]:
            request = _signed(endpoint, body=b"{}", target="ListQueues", key=ADMIN_ID,
                              secret=ADMIN_SECRET, at=when)
            response = await http.post(endpoint + "/", content=b"{}",
                                       headers=dict(request.headers))
            if ok:
                assert response.status_code == 200, (when, response.text)
            else:
                assert response.status_code == 400, (when, response.text)
                assert response.headers["x-amzn-query-error"] == "RequestExpired;Sender"


async def test_target_and_content_type_must_be_signed(keyed: tuple[str, Any]) -> None:
    endpoint, _ = keyed
    # Signed over host and x-amz-date only: the target could be swapped.
    request = AWSRequest(method="POST", url=endpoint + "/", data=b"{}", headers={})
    SigV4Auth(Credentials(ADMIN_ID, ADMIN_SECRET), "sqs", "us-east-1").add_auth(request)
    headers = dict(request.headers)
    headers.update({"Content-Type": "application/x-amz-json-1.0",
                    "X-Amz-Target": "AmazonSQS.CreateQueue"})
    async with httpx.AsyncClient() as http:
        response = await http.post(endpoint + "/", content=b'{"QueueName": "swapped"}',
                                   headers=headers)
        assert response.status_code == 403
        assert response.headers["x-amzn-query-error"] == "SignatureDoesNotMatch;Sender"
        assert "x-amz-target" in response.json()["message"]
        # A captured GetQueueUrl re-sent as CreateQueue does not verify either.
        captured = _signed(endpoint, body=b'{"QueueName": "x"}', target="GetQueueUrl",
                           key=ADMIN_ID, secret=ADMIN_SECRET)
        replayed = dict(captured.headers)
        replayed["X-Amz-Target"] = "AmazonSQS.CreateQueue"
        response = await http.post(endpoint + "/", content=b'{"QueueName": "x"}',
                                   headers=replayed)
        assert response.status_code == 403
        listed = _signed(endpoint, body=b"{}", target="ListQueues", key=ADMIN_ID,
                         secret=ADMIN_SECRET)
        queues = await http.post(endpoint + "/", content=b"{}", headers=dict(listed.headers))
        assert "swapped" not in queues.text and '"x"' not in queues.text


async def test_unsigned_bodies_are_refused_before_parsing(keyed: tuple[str, Any]) -> None:
    endpoint, _ = keyed
    hostile = [
        "&".join(f"f{i}=v" for i in range(200_000)).encode(),
        ("Action=ListQueues&" + ".".join(["a"] * 2_000) + "=1").encode(),
        ("Action=GetQueueAttributes&Attribute." + "9" * 5_000 + ".Name=x").encode(),
    ]
    async with httpx.AsyncClient(timeout=30) as http:
        for body in hostile:
            started = time.monotonic()
            response = await http.post(
                endpoint + "/", content=body,
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )
            assert response.status_code == 403, response.text[:300]
            assert "<Code>MissingAuthenticationToken</Code>" in response.text
            assert time.monotonic() - started < 5  # a guard against a hang, not a benchmark


async def test_a_presigned_query_url_is_honoured_for_fifteen_minutes_at_most(
    keyed: tuple[str, Any],
) -> None:
    endpoint, _ = keyed
    sqs = client(endpoint, "query", key=ADMIN_ID, secret=ADMIN_SECRET)
    url = (await run(sqs.create_queue, QueueName="presigned"))["QueueUrl"]
    send = sqs.generate_presigned_url(
        "send_message", Params={"QueueUrl": url, "MessageBody": "by a link"}, ExpiresIn=600,
        HttpMethod="GET",
    )
    assert "X-Amz-Signature=" in send and "Authorization" not in send
    async with httpx.AsyncClient() as http:
        sent = await http.get(send)
        assert sent.status_code == 200, sent.text
        assert "<MessageId>" in sent.text
        # Any parameter changed breaks the signature; so does another secret.
        tampered = send.replace("by+a+link", "by+another").replace("by%20a%20link", "by%20x")
        assert tampered != send
        refused = await http.get(tampered)
        assert refused.status_code == 403 and "SignatureDoesNotMatch" in refused.text
        forged = client(endpoint, "query", key=ADMIN_ID, secret="not-the-secret")
        refused = await http.get(forged.generate_presigned_url(
            "list_queues", Params={}, ExpiresIn=60, HttpMethod="GET"))
        assert refused.status_code == 403 and "SignatureDoesNotMatch" in refused.text
        # Asked for an hour, made 20 minutes ago: past the 15 minutes honoured.
        with time_machine.travel(datetime.now(UTC) - timedelta(minutes=20), tick=False):
            old = sqs.generate_presigned_url("list_queues", Params={}, ExpiresIn=3600,
                                             HttpMethod="GET")
        expired = await http.get(old)
        assert expired.status_code == 400 and "RequestExpired" in expired.text
        # Asked for 1 second, made 5 seconds ago: its own expiry ends first.
        with time_machine.travel(datetime.now(UTC) - timedelta(seconds=5), tick=False):
            brief = sqs.generate_presigned_url("list_queues", Params={}, ExpiresIn=1,
                                               HttpMethod="GET")
        assert (await http.get(brief)).status_code == 400
        malformed = await http.get(
            f"{endpoint}/000000000000/q?Action=ListQueues&X-Amz-Algorithm=AWS4-HMAC-SHA256"
            f"&X-Amz-Credential={ADMIN_ID}%2F20261201%2Fus-east-1%2Fsqs%2Faws4_request"
            "&X-Amz-Signature=" + "0" * 64)
        assert malformed.status_code == 403 and "IncompleteSignature" in malformed.text
    got = await run(sqs.receive_message, QueueUrl=url)
    assert [m["Body"] for m in got["Messages"]] == ["by a link"]


async def test_a_presigned_url_takes_no_parameters_from_a_body(
    keyed: tuple[str, Any], db: Any,
) -> None:
    """A URL presigned for GetQueueAttributes, posted with Action=PurgeQueue in
    its body, must not purge: a presigned request has no body at all."""
    endpoint, _ = keyed
    sqs = client(endpoint, "query", key=ADMIN_ID, secret=ADMIN_SECRET)
    url = (await run(sqs.create_queue, QueueName="presigned-body"))["QueueUrl"]
    await run(sqs.send_message, QueueUrl=url, MessageBody="keep me")
    link = sqs.generate_presigned_url(
        "get_queue_attributes", Params={"QueueUrl": url, "AttributeNames": ["All"]},
        ExpiresIn=600, HttpMethod="GET")
    async with httpx.AsyncClient() as http:
        for method in ("POST", "GET"):
            smuggled = await http.request(
                method, link, content=b"Action=PurgeQueue&QueueUrl=" + url.encode(),
                headers={"Content-Type": "application/x-www-form-urlencoded"})
            assert smuggled.status_code == 403, smuggled.text
            assert "<Code>AccessDenied</Code>" in smuggled.text
        assert (await http.get(link)).status_code == 200  # the link itself still works
    held = await db.fetchval("SELECT count(*) FROM leaseq.messages")
    assert held == 1


async def test_sqs_requests_are_rate_limited(keyed: tuple[str, Any]) -> None:
    endpoint, app = keyed
    info, secret = await app.state.keys.create("slow", ["read:*"], rate_per_second=1)
    async with httpx.AsyncClient() as http:
        codes = []
        for _ in range(3):
            request = _signed(endpoint, body=b"{}", target="ListQueues", key=info.id,
                              secret=secret)
            response = await http.post(endpoint + "/", content=b"{}",
                                       headers=dict(request.headers))
            codes.append(response.headers.get("x-amzn-query-error"))
    assert codes[:2] == [None, None]
    assert codes[2] == "RequestThrottled;Sender"
