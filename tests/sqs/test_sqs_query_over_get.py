"""The SQS Query protocol over GET: the actions that change nothing are answered;
those that would are taken when the GET is signed, as SQS takes them, and refused
when it carries no signature (what another site's page can make a browser send)
or comes from another site's page; with keys a GET is signed as a POST is."""

from __future__ import annotations

from typing import Any

import httpx
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from conftest import ServeApp
from sqs_clients import ACCOUNT, client, run


async def test_a_state_changing_get_from_another_sites_page_is_refused(
    served: tuple[str, Any], db: Any,
) -> None:
    """What a GET could be abused for is a page of another site making the browser
    send one (an <img> on a loopback service that runs open). The Guard refuses
    those on the SQS door too, before any action runs, read-only ones included."""
    base, _ = served
    async with httpx.AsyncClient(base_url=base) as http:
        for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}):
            for params in ({"Action": "CreateQueue", "QueueName": "csrf"},
                           {"Action": "ListQueues"}):
                answer = await http.get("/", params=params, headers=headers)
                assert answer.status_code == 403, answer.text
    assert await db.fetchval("SELECT count(*) FROM leaseq.queues WHERE name = 'csrf'") == 0


_CHANGES_OVER_GET = [
    ({"Action": "CreateQueue", "QueueName": "made-by-get"}, "/"),
    ({"Action": "SendMessage", "MessageBody": "x"}, f"/{ACCOUNT}/got"),
    ({"Action": "SendMessageBatch", "SendMessageBatchRequestEntry.1.Id": "a",
      "SendMessageBatchRequestEntry.1.MessageBody": "x"}, f"/{ACCOUNT}/got"),
    ({"Action": "ReceiveMessage", "QueueUrl": "got"}, "/"),
    ({"Action": "PurgeQueue"}, f"/{ACCOUNT}/got"),
    ({"Action": "DeleteQueue", "QueueUrl": "got"}, "/"),
    ({"Action": "SetQueueAttributes", "Attribute.1.Name": "DelaySeconds",
      "Attribute.1.Value": "5"}, f"/{ACCOUNT}/got"),
    ({"Action": "TagQueue", "Tag.1.Key": "k", "Tag.1.Value": "v"}, f"/{ACCOUNT}/got"),
]


async def test_query_protocol_over_get(served: tuple[str, Any], db: Any) -> None:
    """GET with the parameters in the query string, at the root or the queue URL,
    for the actions that change nothing; one that changes state is refused over an
    unsigned GET (signed: test_sqs_http_edges.py; presigned:
    tests/auth/test_sqs_auth.py) and changes nothing."""
    base, _ = served
    async with httpx.AsyncClient(base_url=base) as http:
        listed = await http.get("/?Action=ListQueues&Version=2012-11-05")
        assert listed.status_code == 200, listed.text
        assert listed.headers["content-type"].startswith("text/xml")
        assert "<ListQueuesResponse" in listed.text and "<ListQueuesResult/>" in listed.text
        created = await http.post("/", data={"Action": "CreateQueue", "QueueName": "got",
                                             "Version": "2012-11-05"})
        assert created.status_code == 200, created.text
        sent = await http.post("/", data={"Action": "SendMessage", "QueueUrl": "got",
                                          "MessageBody": "y"})
        assert sent.status_code == 200, sent.text
        before = await db.fetch("SELECT * FROM leaseq.messages ORDER BY id")
        for params, path in _CHANGES_OVER_GET:
            answer = await http.get(path, params=params)
            assert answer.status_code == 400, (params, answer.text)
            assert "<Code>AWS.SimpleQueueService.UnsupportedOperation</Code>" in answer.text
        assert await db.fetch("SELECT * FROM leaseq.messages ORDER BY id") == before
        assert await db.fetchval("SELECT count(*) FROM leaseq.queues") == 1
        found = await http.get(f"/{ACCOUNT}/got?Action=GetQueueUrl&QueueName=got")
        assert f"<QueueUrl>{base}/{ACCOUNT}/got</QueueUrl>" in found.text
        attributes = await http.get("/", params={
            "Action": "GetQueueAttributes", "QueueUrl": "got", "AttributeName.1": "All"})
        assert "<Name>DelaySeconds</Name><Value>0</Value>" in attributes.text
        assert "<Name>ApproximateNumberOfMessages</Name><Value>1</Value>" in attributes.text
        tags = await http.get("/", params={"Action": "ListQueueTags", "QueueUrl": "got"})
        assert tags.status_code == 200 and "<Tag>" not in tags.text
        listed = await http.get("/?Action=ListQueues")
        assert f"<QueueUrl>{base}/{ACCOUNT}/got</QueueUrl>" in listed.text
        # No action: SQS's 404 (test_sqs_http_edges.py).
        for query in ("", "?Version=2012-11-05"):
            answer = await http.get("/" + query)
            assert answer.status_code == 404, (query, answer.text)
            assert answer.text == "<UnknownOperationException/>"
        # Refusals in XML, as a POST gets them.
        for query, status, code in [
            ("?Action=Frobnicate", 400, "InvalidAction"),
            ("?Action=GetQueueUrl", 400, "MissingParameter"),
            ("?Action=GetQueueUrl&QueueName=nope", 400,
             "AWS.SimpleQueueService.NonExistentQueue"),
            ("?Action=GetQueueAttributes&QueueUrl=got&AttributeName.1=Nope", 400,
             "InvalidAttributeName"),
        ]:
            answer = await http.get("/" + query)
            assert answer.status_code == status, (query, answer.text)
            assert f"<Code>{code}</Code>" in answer.text, (query, answer.text)
        # Another method: 405 naming the ones allowed, not a 500.
        for method, path in [("PUT", "/"), ("DELETE", "/"), ("PATCH", "/"),
                             ("PUT", f"/{ACCOUNT}/got"), ("DELETE", f"/{ACCOUNT}/got")]:
            answer = await http.request(method, path + "?Action=ListQueues")
            assert answer.status_code == 405, (method, path, answer.text)
            assert set(answer.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}


async def test_open_mode_takes_a_changing_get_only_with_a_whole_presigned_signature(
    served: tuple[str, Any], db: Any,
) -> None:
    """Open (no key exists), no signature is checked, so what makes a GET "signed"
    is its form: a page of another site can name a query parameter, so a GET whose
    query string merely mentions X-Amz-Signature is an unsigned one. A complete
    presigned signature (as botocore writes one) is taken, as SQS takes it."""
    base, _ = served
    sqs = client(base, "query")
    url = (await run(sqs.create_queue, QueueName="kept"))["QueueUrl"]
    await run(sqs.send_message, QueueUrl=url, MessageBody="keep me")
    credential = "AKIDLEASEQTEST%2F20261201%2Fus-east-1%2Fsqs%2Faws4_request"
    async with httpx.AsyncClient() as http:
        for signature in (
            "X-Amz-Signature=x",
            "X-Amz-Algorithm=AWS4-HMAC-SHA256",
            # Every part but one, or every part out of form or time.
            f"X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={credential}"
            "&X-Amz-Date=20261201T000000Z&X-Amz-SignedHeaders=host&X-Amz-Signature="
            + "0" * 64,
            f"X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={credential}"
            "&X-Amz-Date=20261201T000000Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host"
            "&X-Amz-Signature=" + "0" * 64,  # long expired
            "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=x&X-Amz-Date=x"
            "&X-Amz-Expires=60&X-Amz-SignedHeaders=x&X-Amz-Signature=x",
        ):
            answer = await http.get(f"{base}/?Action=PurgeQueue&QueueUrl={url}&{signature}")
            assert answer.status_code == 400, (signature, answer.text)
            assert "<Code>AWS.SimpleQueueService.UnsupportedOperation</Code>" in answer.text
        assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 1
        link = sqs.generate_presigned_url(
            "send_message", Params={"QueueUrl": url, "MessageBody": "by a link"},
            ExpiresIn=600, HttpMethod="GET")
        sent = await http.get(link)
        assert sent.status_code == 200 and "<MessageId>" in sent.text, sent.text
        purge = sqs.generate_presigned_url(
            "purge_queue", Params={"QueueUrl": url}, ExpiresIn=600, HttpMethod="GET")
        assert (await http.get(purge)).status_code == 200
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 0


KEY_ID = "LQBOOTSTRAPADMIN0001"
KEY_SECRET = "admin-secret-0123456789abcdefghij"


def _signed_get(url: str, secret: str = KEY_SECRET) -> dict[str, str]:
    """The headers of a GET signed in its Authorization header, as the SDKs sign."""
    request = AWSRequest(method="GET", url=url)
    SigV4Auth(Credentials(KEY_ID, secret), "sqs", "us-east-1").add_auth(request)
    return dict(request.headers)


async def test_query_over_get_is_signed(serve_factory: ServeApp) -> None:
    """With keys, a GET needs the same header SigV4 as a POST, over its query string
    (or a presigned signature: tests/auth/test_sqs_auth.py); half a presigned one is refused.
    Signed, a GET may change state, as on SQS; unsigned, it is refused."""
    base, _ = await serve_factory(admin_key=f"{KEY_ID}.{KEY_SECRET}")
    async with httpx.AsyncClient() as http:
        url = f"{base}/?Action=GetQueueUrl&QueueName=signed"
        answer = await http.get(url, headers=_signed_get(url))
        assert "NonExistentQueue" in answer.text, answer.text
        url = f"{base}/?Action=CreateQueue&QueueName=signed&Version=2012-11-05"
        answer = await http.get(url, headers=_signed_get(url))
        assert answer.status_code == 200, answer.text
        assert f"<QueueUrl>{base}/{ACCOUNT}/signed</QueueUrl>" in answer.text
        body = b"Action=CreateQueue&QueueName=signed&Version=2012-11-05"
        request = AWSRequest(method="POST", url=f"{base}/", data=body, headers={
            "Content-Type": "application/x-www-form-urlencoded"})
        SigV4Auth(Credentials(KEY_ID, KEY_SECRET), "sqs", "us-east-1").add_auth(request)
        answer = await http.post(f"{base}/", content=body, headers=dict(request.headers))
        assert answer.status_code == 200, answer.text
        for unsigned_change in (f"{base}/?Action=PurgeQueue&QueueUrl=signed",
                                f"{base}/{ACCOUNT}/signed?Action=DeleteQueue"):
            answer = await http.get(unsigned_change)
            assert answer.status_code == 403, answer.text
            assert "<Code>MissingAuthenticationToken</Code>" in answer.text
        unsigned = await http.get(f"{base}/?Action=ListQueues")
        assert unsigned.status_code == 403
        assert "<Code>MissingAuthenticationToken</Code>" in unsigned.text
        signed = f"{base}/?Action=ListQueues"
        for sent, headers, code in [
            # Another query string than the one signed, or another secret.
            (f"{base}/?Action=ListQueues&QueueNamePrefix=s", _signed_get(signed),
             "SignatureDoesNotMatch"),
            (f"{base}/?Action=DeleteQueue&QueueUrl=signed", _signed_get(signed),
             "SignatureDoesNotMatch"),
            (signed, _signed_get(signed, "not-the-secret"), "SignatureDoesNotMatch"),
            (f"{base}/?Action=ListQueues&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential="
             f"{KEY_ID}%2F20261201%2Fus-east-1%2Fsqs%2Faws4_request&X-Amz-Signature="
             + "0" * 64, {}, "IncompleteSignature"),
        ]:
            answer = await http.get(sent, headers=headers)
            assert answer.status_code == 403, (sent, answer.text)
            assert f"<Code>{code}</Code>" in answer.text, (sent, answer.text)
        url = f"{base}/?Action=GetQueueUrl&QueueName=signed"
        answer = await http.get(url, headers=_signed_get(url))
        assert answer.status_code == 200, answer.text  # not deleted by the refused GET
