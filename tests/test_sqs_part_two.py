"""SQS behaviours clients meet, as AWS records them, with boto3 on both protocols:
the MessageAttributeNames filters on receive, message attribute refusals, error codes
and messages, the Query protocol's empty results and unknown actions, the forms of a
QueueUrl, and the Query protocol over GET (signed, when keys exist)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from conftest import ServeApp
from sqs_clients import ACCOUNT, client, reference_md5_of_attributes, refusal, run

PROTOCOLS = ["json", "query"]
NO_QUEUE = {
    "json": "The specified queue does not exist.",
    "query": "The specified queue does not exist for this wsdl version.",
}


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def sqs(protocol: str, served: tuple[str, Any]) -> Any:
    return client(served[0], protocol)


ATTRIBUTES = {
    "order.id": {"DataType": "String", "StringValue": "o-1"},
    "order.total": {"DataType": "Number", "StringValue": "12.5"},
    "orderly": {"DataType": "String", "StringValue": "yes"},
    "customer": {"DataType": "String", "StringValue": "c-9"},
    "blob.png": {"DataType": "Binary", "BinaryValue": b"\x89PNG"},
}


@pytest.mark.parametrize(("names", "expected"), [
    (None, []),
    (["All"], sorted(ATTRIBUTES)),
    ([".*"], sorted(ATTRIBUTES)),
    (["order.*"], ["order.id", "order.total"]),
    (["customer"], ["customer"]),
    (["order.*", "customer"], ["customer", "order.id", "order.total"]),
    (["blob.*", "orderly"], ["blob.png", "orderly"]),
    (["order"], []),  # a name, not a prefix
    (["nothing.*", "absent"], []),
])
async def test_message_attribute_names_filter(
    sqs: Any, names: list[str] | None, expected: list[str]
) -> None:
    url = (await run(sqs.create_queue, QueueName="filters"))["QueueUrl"]
    await run(sqs.send_message, QueueUrl=url, MessageBody="m", MessageAttributes=ATTRIBUTES)
    kwargs: dict[str, Any] = {} if names is None else {"MessageAttributeNames": names}
    (message,) = (await run(sqs.receive_message, QueueUrl=url, **kwargs))["Messages"]
    got = message.get("MessageAttributes", {})
    assert sorted(got) == expected
    assert got == {name: ATTRIBUTES[name] for name in expected}
    if expected:
        assert message["MD5OfMessageAttributes"] == reference_md5_of_attributes(got)
    else:
        assert "MD5OfMessageAttributes" not in message


async def test_message_attribute_values_refused(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="values"))["QueueUrl"]

    async def send(attribute: dict[str, Any]) -> tuple[str, str]:
        return await refusal(sqs.send_message, QueueUrl=url, MessageBody="m",
                             MessageAttributes={"ErrorDetails": attribute})

    assert await send({"DataType": "String", "StringValue": ""}) == (
        "InvalidParameterValue",
        "Message (user) attribute 'ErrorDetails' must contain a non-empty value of type "
        "'String'.",
    )
    assert await send({"DataType": "Number", "StringValue": ""}) == (
        "InvalidParameterValue",
        "Message (user) attribute 'ErrorDetails' must contain a non-empty value of type "
        "'Number'.",
    )
    assert await send({"DataType": "String.custom", "StringValue": ""}) == (
        "InvalidParameterValue",
        "Message (user) attribute 'ErrorDetails' must contain a non-empty value of type "
        "'String'.",
    )
    # Characters outside SQS's set: InvalidParameterValue in an attribute (a body's
    # are InvalidMessageContents).
    code, message = await send({"DataType": "String", "StringValue": f"bad-{chr(8)},{chr(11)}"})
    assert code == "InvalidParameterValue"
    assert message.startswith("Invalid characters found in the message attribute 'ErrorDetails'.")
    code, _ = await refusal(sqs.send_message, QueueUrl=url, MessageBody=f"bad {chr(8)}")
    assert code == "InvalidMessageContents"
    # In a batch, the entry fails alone, with the same code and message.
    batch = await run(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": "ok", "MessageBody": "m"},
        {"Id": "empty", "MessageBody": "m",
         "MessageAttributes": {"a": {"DataType": "String", "StringValue": ""}}},
    ])
    assert [e["Id"] for e in batch["Successful"]] == ["ok"]
    (failed,) = batch["Failed"]
    assert (failed["Id"], failed["Code"], failed["SenderFault"]) == (
        "empty", "InvalidParameterValue", True
    )
    assert failed["Message"] == (
        "Message (user) attribute 'a' must contain a non-empty value of type 'String'."
    )
    # Nothing refused was stored: only the batch's good message is there.
    got = await run(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=10)
    assert [m["Body"] for m in got["Messages"]] == ["m"]


@pytest.mark.parametrize(("parameter", "value", "reason"), [
    ("MaxNumberOfMessages", 0, "Must be between 1 and 10, if provided."),
    ("MaxNumberOfMessages", 11, "Must be between 1 and 10, if provided."),
    ("WaitTimeSeconds", -1, "Must be >= 0 and <= 20, if provided."),
    ("WaitTimeSeconds", 21, "Must be >= 0 and <= 20, if provided."),
])
async def test_receive_out_of_range(sqs: Any, parameter: str, value: int, reason: str) -> None:
    url = (await run(sqs.create_queue, QueueName="ranges"))["QueueUrl"]
    assert await refusal(sqs.receive_message, QueueUrl=url, **{parameter: value}) == (
        "InvalidParameterValue",
        f"Value {value} for parameter {parameter} is invalid. Reason: {reason}",
    )


async def test_empty_body(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="bodies"))["QueueUrl"]
    assert await refusal(sqs.send_message, QueueUrl=url, MessageBody="") == (
        "MissingParameter", "The request must contain the parameter MessageBody."
    )


async def test_change_visibility_of_a_deleted_message(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="gone"))["QueueUrl"]
    await run(sqs.send_message, QueueUrl=url, MessageBody="m")
    (message,) = (await run(sqs.receive_message, QueueUrl=url))["Messages"]
    handle = message["ReceiptHandle"]
    await run(sqs.delete_message, QueueUrl=url, ReceiptHandle=handle)
    expected = (
        f"Value {handle} for parameter ReceiptHandle is invalid. Reason: Message does not "
        f"exist or is not available for visibility timeout change."
    )
    assert await refusal(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=handle,
                         VisibilityTimeout=10) == ("InvalidParameterValue", expected)
    batch = await run(sqs.change_message_visibility_batch, QueueUrl=url, Entries=[
        {"Id": "gone", "ReceiptHandle": handle, "VisibilityTimeout": 10},
    ])
    assert batch.get("Successful", []) == []
    assert batch["Failed"] == [{"Id": "gone", "SenderFault": True,
                                "Code": "InvalidParameterValue", "Message": expected}]
    # Deleting it again succeeds and deletes nothing, as SQS documents.
    await run(sqs.delete_message, QueueUrl=url, ReceiptHandle=handle)


async def test_receipt_handle_not_ours(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="handles"))["QueueUrl"]
    expected = ("ReceiptHandleIsInvalid",
                'The input receipt handle "garbage" is not a valid receipt handle.')
    assert await refusal(sqs.delete_message, QueueUrl=url, ReceiptHandle="garbage") == expected
    assert await refusal(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle="garbage",
                         VisibilityTimeout=5) == expected
    batch = await run(sqs.delete_message_batch, QueueUrl=url, Entries=[
        {"Id": "x", "ReceiptHandle": "garbage"}])
    assert batch["Failed"] == [{"Id": "x", "SenderFault": True, "Code": expected[0],
                                "Message": expected[1]}]
    # One of another queue is not this queue's.
    other = (await run(sqs.create_queue, QueueName="handles-other"))["QueueUrl"]
    await run(sqs.send_message, QueueUrl=other, MessageBody="m")
    (message,) = (await run(sqs.receive_message, QueueUrl=other))["Messages"]
    handle = message["ReceiptHandle"]
    assert await refusal(sqs.delete_message, QueueUrl=url, ReceiptHandle=handle) == (
        "ReceiptHandleIsInvalid", f'The input receipt handle "{handle}" is not a valid receipt '
        f"handle."
    )


async def test_queue_that_does_not_exist(
    sqs: Any, protocol: str, served: tuple[str, Any]
) -> None:
    base, _ = served
    expected = ("AWS.SimpleQueueService.NonExistentQueue", NO_QUEUE[protocol])
    # Refused by the engine (no such queue) and by the URL (not one of ours).
    assert await refusal(sqs.get_queue_url, QueueName="nope") == expected
    assert await refusal(sqs.send_message, QueueUrl=f"{base}/{ACCOUNT}/nope",
                         MessageBody="m") == expected
    assert await refusal(sqs.receive_message, QueueUrl=f"{base}/123456789012/nope") == expected
    assert await refusal(sqs.get_queue_attributes, QueueUrl=f"{base}/nope") == expected


async def test_list_queues_without_a_match(sqs: Any) -> None:
    await run(sqs.create_queue, QueueName="listed")
    assert "QueueUrls" not in await run(sqs.list_queues, QueueNamePrefix="unlisted")
    assert "QueueUrls" not in await run(sqs.list_queues, QueueNamePrefix="unlisted",
                                        MaxResults=5)
    assert len((await run(sqs.list_queues, QueueNamePrefix="list"))["QueueUrls"]) == 1


async def test_empty_results_on_the_wire(served: tuple[str, Any]) -> None:
    base, _ = served
    async with httpx.AsyncClient(base_url=base) as http:
        created = await http.post("/", data={"Action": "CreateQueue", "QueueName": "empty"})
        assert created.status_code == 200, created.text
        url = f"{base}/{ACCOUNT}/empty"
        received = await http.post("/", data={"Action": "ReceiveMessage", "QueueUrl": url})
        assert received.status_code == 200
        assert "<ReceiveMessageResult/>" in received.text
        listed = await http.post("/", data={"Action": "ListQueues", "QueueNamePrefix": "zz"})
        assert "<ListQueuesResult/>" in listed.text
        tags = await http.post("/", data={"Action": "ListQueueTags", "QueueUrl": url})
        assert "<ListQueueTagsResult/>" in tags.text
        missing = await http.post("/", data={"Action": "GetQueueUrl", "QueueName": "nope"})
        assert missing.status_code == 400
        assert ("<Code>AWS.SimpleQueueService.NonExistentQueue</Code>"
                "<Message>The specified queue does not exist for this wsdl version.</Message>"
                ) in missing.text
        headers = {"Content-Type": "application/x-amz-json-1.0"}
        received = await http.post("/", json={"QueueUrl": url},
                                   headers={**headers, "X-Amz-Target": "AmazonSQS.ReceiveMessage"})
        assert received.status_code == 200
        assert received.json() == {}
        listed = await http.post("/", json={"QueueNamePrefix": "zz"},
                                 headers={**headers, "X-Amz-Target": "AmazonSQS.ListQueues"})
        assert listed.json() == {}


async def test_unknown_operations(served: tuple[str, Any]) -> None:
    base, _ = served
    async with httpx.AsyncClient(base_url=base) as http:
        query = await http.post("/", data={"Action": "Frobnicate"})
        assert query.status_code == 400
        assert ("<Code>InvalidAction</Code>"
                "<Message>The action Frobnicate is not valid for this endpoint.</Message>"
                ) in query.text
        headers = {"Content-Type": "application/x-amz-json-1.0"}
        for target in ("AmazonSQS.Frobnicate", "DynamoDB_20120810.ListTables", None):
            sent = headers if target is None else {**headers, "X-Amz-Target": target}
            answer = await http.post("/", content=b"{}", headers=sent)
            assert answer.status_code == 400, target
            assert answer.json()["__type"] == "com.amazon.coral.service#UnknownOperationException"
            assert answer.headers["x-amzn-query-error"] == "UnknownOperationException;Sender"
        # A known action is still answered.
        known = await http.post("/", content=b"{}",
                                headers={**headers, "X-Amz-Target": "AmazonSQS.ListQueues"})
        assert known.status_code == 200


QUEUE_URL_FORMS = [
    "forms",  # a bare queue name
    f"https://sqs.eu-west-1.amazonaws.com/{ACCOUNT}/forms",  # another host and region
    f"http://localhost:4566/{ACCOUNT}/forms",  # LocalStack's, ElasticMQ's
    f"http://sqs.us-east-1.localhost.localstack.cloud:4566/{ACCOUNT}/forms",
    f"http://localhost:4566/queue/us-east-1/{ACCOUNT}/forms",  # LocalStack path-style
    "http://localhost:9324/queue/forms",  # ElasticMQ's old form
    f"{ACCOUNT}/forms",
]


async def test_queue_url_forms(sqs: Any, protocol: str, served: tuple[str, Any]) -> None:
    """A QueueUrl of any host, port or region, or a bare name, names the queue."""
    url = (await run(sqs.create_queue, QueueName="forms"))["QueueUrl"]
    await run(sqs.create_queue, QueueName="forms-other")
    for form in QUEUE_URL_FORMS:
        await run(sqs.send_message, QueueUrl=form, MessageBody=form)
    received: list[str] = []
    for _ in range(len(QUEUE_URL_FORMS)):
        got = await run(sqs.receive_message, QueueUrl="forms", MaxNumberOfMessages=10)
        received += [m["Body"] for m in got.get("Messages", [])]
        if len(received) == len(QUEUE_URL_FORMS):
            break
    assert sorted(received) == sorted(QUEUE_URL_FORMS)
    attributes = await run(sqs.get_queue_attributes, QueueUrl="forms-other",
                           AttributeNames=["ApproximateNumberOfMessages"])
    assert attributes["Attributes"]["ApproximateNumberOfMessages"] == "0"
    assert (await run(sqs.get_queue_url, QueueName="forms"))["QueueUrl"] == url
    expected = ("AWS.SimpleQueueService.NonExistentQueue", NO_QUEUE[protocol])
    for refused in [
        "https://sqs.eu-west-1.amazonaws.com/123456789012/forms",  # another account
        "http://localhost:4566/queue/us-east-1/123456789012/forms",
        "nope",  # a bare name of no queue
        "no such name!",
        "http://[::1/000000000000/forms",  # not a URL (urlsplit refuses it)
        f"http://localhost:4566/{ACCOUNT}/forms/extra",
        f"http://localhost:4566/{ACCOUNT}/",
    ]:
        assert await refusal(sqs.send_message, QueueUrl=refused, MessageBody="m") == expected


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
    assert await db.fetchval("SELECT count(*) FROM queues WHERE name = 'csrf'") == 0


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
    for the actions that change nothing; one that changes state is refused over a
    GET (unless presigned: tests/test_sqs_auth.py) and changes nothing."""
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
        before = await db.fetch("SELECT * FROM messages ORDER BY id")
        for params, path in _CHANGES_OVER_GET:
            answer = await http.get(path, params=params)
            assert answer.status_code == 400, (params, answer.text)
            assert "<Code>AWS.SimpleQueueService.UnsupportedOperation</Code>" in answer.text
        assert await db.fetch("SELECT * FROM messages ORDER BY id") == before
        assert await db.fetchval("SELECT count(*) FROM queues") == 1
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
        # Refusals in XML, as a POST gets them.
        for query, status, code in [
            ("", 400, "MissingAction"),
            ("?Version=2012-11-05", 400, "MissingAction"),
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


KEY_ID = "LQBOOTSTRAPADMIN0001"
KEY_SECRET = "admin-secret-0123456789abcdefghij"


def _signed_get(url: str, secret: str = KEY_SECRET) -> dict[str, str]:
    """The headers of a GET signed in its Authorization header, as the SDKs sign."""
    request = AWSRequest(method="GET", url=url)
    SigV4Auth(Credentials(KEY_ID, secret), "sqs", "us-east-1").add_auth(request)
    return dict(request.headers)


async def test_query_over_get_is_signed(serve_factory: ServeApp) -> None:
    """With keys, a GET needs the same header SigV4 as a POST, over its query string
    (or a presigned signature: tests/test_sqs_auth.py); half a presigned one is refused.
    Signed or not, a GET that would change state is refused."""
    base, _ = await serve_factory(admin_key=f"{KEY_ID}.{KEY_SECRET}")
    async with httpx.AsyncClient() as http:
        url = f"{base}/?Action=CreateQueue&QueueName=signed&Version=2012-11-05"
        answer = await http.get(url, headers=_signed_get(url))
        assert answer.status_code == 400, answer.text
        assert "<Code>AWS.SimpleQueueService.UnsupportedOperation</Code>" in answer.text
        url = f"{base}/?Action=GetQueueUrl&QueueName=signed"
        answer = await http.get(url, headers=_signed_get(url))
        assert "NonExistentQueue" in answer.text, answer.text
        body = b"Action=CreateQueue&QueueName=signed&Version=2012-11-05"
        request = AWSRequest(method="POST", url=f"{base}/", data=body, headers={
            "Content-Type": "application/x-www-form-urlencoded"})
        SigV4Auth(Credentials(KEY_ID, KEY_SECRET), "sqs", "us-east-1").add_auth(request)
        answer = await http.post(f"{base}/", content=body, headers=dict(request.headers))
        assert answer.status_code == 200, answer.text
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
