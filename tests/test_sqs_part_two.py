"""SQS behaviours clients meet, as AWS records them, with boto3 on both protocols:
the MessageAttributeNames filters on receive, message attribute refusals, error codes
and messages, and the Query protocol's empty results and unknown actions."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError
from sqs_clients import ACCOUNT, client, reference_md5_of_attributes, run

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


async def refusal(call: Any, **kwargs: Any) -> tuple[str, str]:
    """(code, message) of a call that must fail."""
    with pytest.raises(ClientError) as info:
        await run(call, **kwargs)
    error = info.value.response["Error"]
    return str(error["Code"]), str(error["Message"])


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
