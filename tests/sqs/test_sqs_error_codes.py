"""SQS error codes and messages as AWS records them, with boto3 on both protocols:
receive parameters out of range, an empty body, handles of deleted messages or of
no message of ours, queues that do not exist, and the Query protocol's empty
results and unknown actions."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqs_clients import ACCOUNT, NO_QUEUE, refusal, run


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
