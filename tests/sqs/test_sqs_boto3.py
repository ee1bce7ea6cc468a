"""boto3 against the real service, with a JSON-protocol client (current boto3) and a
Query-protocol client (the last Query service model): the whole SQS cycle, long
polling, visibility, redrive to a dead-letter queue and back, and the error codes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError
from sqs_clients import ACCOUNT, PROTOCOLS, client, error_code, reference_md5_of_attributes, run
from support import eventually, wait_until


@pytest.fixture(params=PROTOCOLS)
def sqs(request: pytest.FixtureRequest, served: tuple[str, Any]) -> Any:
    return client(served[0], request.param)


async def test_whole_cycle(sqs: Any, served: tuple[str, Any]) -> None:
    base, app = served
    created = await run(sqs.create_queue, QueueName="orders",
                        Attributes={"VisibilityTimeout": "30", "DelaySeconds": "0"},
                        tags={"team": "billing"})
    url = created["QueueUrl"]
    assert url == f"{base}/{ACCOUNT}/orders"
    # Same attributes again: the same queue.
    again = await run(sqs.create_queue, QueueName="orders", Attributes={"VisibilityTimeout": "30"})
    assert again["QueueUrl"] == url
    assert (await run(sqs.get_queue_url, QueueName="orders"))["QueueUrl"] == url
    assert (await run(sqs.list_queue_tags, QueueUrl=url))["Tags"] == {"team": "billing"}

    attributes = {
        "kind": {"DataType": "String", "StringValue": "invoice ✓"},
        "amount": {"DataType": "Number.float", "StringValue": "12.50"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
    }
    sent = await run(sqs.send_message, QueueUrl=url, MessageBody="first",
                     MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] == hashlib.md5(b"first").hexdigest()
    assert sent["MD5OfMessageAttributes"] == reference_md5_of_attributes(attributes)

    batch = await run(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": f"m{i}", "MessageBody": f"batch {i}"} for i in range(3)
    ])
    assert sorted(e["Id"] for e in batch["Successful"]) == ["m0", "m1", "m2"]
    assert batch.get("Failed", []) == []

    got = await run(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=10,
                    MessageAttributeNames=["All"], AttributeNames=["All"])
    messages = got["Messages"]
    assert len(messages) == 4
    first = next(m for m in messages if m["Body"] == "first")
    assert first["MessageAttributes"] == attributes
    assert first["MD5OfMessageAttributes"] == reference_md5_of_attributes(attributes)
    assert first["Attributes"]["ApproximateReceiveCount"] == "1"
    assert first["Attributes"]["SenderId"] == "AKIDLEASEQTEST"
    sent_ms = int(first["Attributes"]["SentTimestamp"])
    assert abs(sent_ms / 1000 - time.time()) < 120
    assert int(first["Attributes"]["ApproximateFirstReceiveTimestamp"]) >= sent_ms

    stats = (await run(sqs.get_queue_attributes, QueueUrl=url,
                       AttributeNames=["All"]))["Attributes"]
    assert stats["ApproximateNumberOfMessagesNotVisible"] == "4"
    assert stats["ApproximateNumberOfMessages"] == "0"
    assert stats["QueueArn"] == f"arn:aws:sqs:us-east-1:{ACCOUNT}:orders"
    assert stats["VisibilityTimeout"] == "30"

    # Release one (visibility 0), extend one, delete the rest in a batch.
    others = [m for m in messages if m is not first]
    await run(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=first["ReceiptHandle"],
              VisibilityTimeout=0)
    changed = await run(sqs.change_message_visibility_batch, QueueUrl=url, Entries=[
        {"Id": "a", "ReceiptHandle": others[0]["ReceiptHandle"], "VisibilityTimeout": 60},
        {"Id": "bad", "ReceiptHandle": "garbage", "VisibilityTimeout": 60},
    ])
    assert [e["Id"] for e in changed["Successful"]] == ["a"]
    assert [(e["Id"], e["Code"]) for e in changed["Failed"]] == [("bad", "ReceiptHandleIsInvalid")]
    again_first = await run(sqs.receive_message, QueueUrl=url,
                            AttributeNames=["ApproximateReceiveCount"])
    (redelivered,) = again_first["Messages"]
    assert redelivered["Body"] == "first"
    assert redelivered["Attributes"] == {"ApproximateReceiveCount": "2"}
    # The first handle is dead now: its change is refused, its delete deletes nothing.
    with pytest.raises(ClientError) as info:
        await run(sqs.change_message_visibility, QueueUrl=url,
                  ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=10)
    assert error_code(info.value) == "InvalidParameterValue"
    await run(sqs.delete_message, QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    deleted = await run(sqs.delete_message_batch, QueueUrl=url, Entries=[
        {"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]}
        for i, m in enumerate([*others, redelivered])
    ])
    assert len(deleted["Successful"]) == 4
    stats = (await run(sqs.get_queue_attributes, QueueUrl=url,
                       AttributeNames=["ApproximateNumberOfMessages",
                                       "ApproximateNumberOfMessagesNotVisible"]))["Attributes"]
    assert stats == {"ApproximateNumberOfMessages": "0",
                     "ApproximateNumberOfMessagesNotVisible": "0"}

    # Long polling: a waiting receive wakes on a send, through the engine's wait.
    started = time.monotonic()
    waiting = asyncio.create_task(run(sqs.receive_message, QueueUrl=url, WaitTimeSeconds=15))
    await wait_until(lambda: app.state.hub.parked() >= 1)
    await run(sqs.send_message, QueueUrl=url, MessageBody="wake up")
    woke = await waiting
    assert [m["Body"] for m in woke["Messages"]] == ["wake up"]
    assert time.monotonic() - started < 10
    await run(sqs.delete_message, QueueUrl=url, ReceiptHandle=woke["Messages"][0]["ReceiptHandle"])

    await run(sqs.set_queue_attributes, QueueUrl=url, Attributes={"DelaySeconds": "5"})
    stats = (await run(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["DelaySeconds"]))
    assert stats["Attributes"] == {"DelaySeconds": "5"}
    await run(sqs.send_message, QueueUrl=url, MessageBody="later")
    delayed = await run(sqs.get_queue_attributes, QueueUrl=url,
                        AttributeNames=["ApproximateNumberOfMessagesDelayed"])
    assert delayed["Attributes"] == {"ApproximateNumberOfMessagesDelayed": "1"}
    await run(sqs.purge_queue, QueueUrl=url)

    await run(sqs.tag_queue, QueueUrl=url, Tags={"env": "test"})
    await run(sqs.untag_queue, QueueUrl=url, TagKeys=["team"])
    assert (await run(sqs.list_queue_tags, QueueUrl=url))["Tags"] == {"env": "test"}

    await run(sqs.create_queue, QueueName="other")
    page = await run(sqs.list_queues, QueueNamePrefix="o", MaxResults=1)
    assert page["QueueUrls"] == [f"{base}/{ACCOUNT}/orders"]
    page2 = await run(sqs.list_queues, QueueNamePrefix="o", MaxResults=1,
                      NextToken=page["NextToken"])
    assert page2["QueueUrls"] == [f"{base}/{ACCOUNT}/other"]
    assert "NextToken" not in page2
    await run(sqs.delete_queue, QueueUrl=url)
    with pytest.raises(ClientError) as info:
        await run(sqs.get_queue_url, QueueName="orders")
    assert error_code(info.value) == "AWS.SimpleQueueService.NonExistentQueue"


async def test_redrive_to_a_dead_letter_queue_and_back(sqs: Any) -> None:
    dlq = (await run(sqs.create_queue, QueueName="dead"))["QueueUrl"]
    dlq_arn = (await run(sqs.get_queue_attributes, QueueUrl=dlq,
                         AttributeNames=["QueueArn"]))["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "1"})
    url = (await run(sqs.create_queue, QueueName="work",
                     Attributes={"RedrivePolicy": policy}))["QueueUrl"]
    stored = json.loads((await run(sqs.get_queue_attributes, QueueUrl=url,
                                   AttributeNames=["RedrivePolicy"]))["Attributes"]["RedrivePolicy"])
    assert stored == {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1}
    assert (await run(sqs.list_dead_letter_source_queues, QueueUrl=dlq))["queueUrls"] == [url]

    await run(sqs.send_message, QueueUrl=url, MessageBody="poison")
    first = await run(sqs.receive_message, QueueUrl=url, VisibilityTimeout=0)
    assert first["Messages"][0]["Body"] == "poison"
    # Received once already: the next receive moves it to the dead-letter queue.
    assert "Messages" not in await run(sqs.receive_message, QueueUrl=url)
    dead = await run(sqs.receive_message, QueueUrl=dlq, VisibilityTimeout=0)
    assert dead["Messages"][0]["Body"] == "poison"

    handle = (await run(sqs.start_message_move_task, SourceArn=dlq_arn))["TaskHandle"]
    assert handle

    async def completed() -> bool:
        tasks = (await run(sqs.list_message_move_tasks, SourceArn=dlq_arn))["Results"]
        return tasks[0]["Status"] == "COMPLETED"

    await eventually(completed)
    (task,) = (await run(sqs.list_message_move_tasks, SourceArn=dlq_arn, MaxResults=10))["Results"]
    assert task["ApproximateNumberOfMessagesMoved"] == 1
    assert task["SourceArn"] == dlq_arn
    back = await run(sqs.receive_message, QueueUrl=url, AttributeNames=["ApproximateReceiveCount"])
    assert back["Messages"][0]["Body"] == "poison"
    with pytest.raises(ClientError) as info:
        await run(sqs.cancel_message_move_task, TaskHandle=handle)
    assert error_code(info.value) == "ResourceNotFoundException"
    # A running task can be cancelled: hold one back with a message in flight... a
    # rate-limited task over several messages is still running when cancelled.
    for i in range(3):
        await run(sqs.send_message, QueueUrl=dlq, MessageBody=f"d{i}")
    other = (await run(sqs.create_queue, QueueName="elsewhere"))["QueueUrl"]
    slow = await run(sqs.start_message_move_task, SourceArn=dlq_arn,
                     DestinationArn=dlq_arn.replace(":dead", ":elsewhere"),
                     MaxNumberOfMessagesPerSecond=1)
    cancelled = await run(sqs.cancel_message_move_task, TaskHandle=slow["TaskHandle"])
    assert cancelled["ApproximateNumberOfMessagesMoved"] <= 3
    (latest,) = (await run(sqs.list_message_move_tasks, SourceArn=dlq_arn))["Results"]
    assert latest["Status"] in ("CANCELLED", "COMPLETED")
    assert latest["DestinationArn"].endswith(":elsewhere")
    assert other


async def test_errors(sqs: Any, served: tuple[str, Any]) -> None:
    base, _ = served
    missing = f"{base}/{ACCOUNT}/nope"

    async def code(call: Any, **kwargs: Any) -> str:
        with pytest.raises(ClientError) as info:
            await run(call, **kwargs)
        return error_code(info.value)

    assert await code(sqs.send_message, QueueUrl=missing, MessageBody="x") == (
        "AWS.SimpleQueueService.NonExistentQueue"
    )
    try:
        await run(sqs.get_queue_url, QueueName="nope")
    except sqs.exceptions.QueueDoesNotExist:
        pass  # botocore maps the error to its modeled exception
    url = (await run(sqs.create_queue, QueueName="q", Attributes={"VisibilityTimeout": "10"}))[
        "QueueUrl"
    ]
    assert await code(sqs.create_queue, QueueName="q",
                      Attributes={"VisibilityTimeout": "20"}) == "QueueAlreadyExists"
    # FIFO queues: tests/sqs/test_sqs_fifo_*.py; a FIFO queue's name ends in .fifo.
    assert await code(sqs.create_queue, QueueName="jobs",
                      Attributes={"FifoQueue": "true"}) == "InvalidParameterValue"
    assert await code(sqs.create_queue, QueueName="bad name!") == "InvalidParameterValue"
    assert await code(sqs.create_queue, QueueName="q2",
                      Attributes={"VisibilityTimeout": "99999"}) == "InvalidAttributeValue"
    assert await code(sqs.create_queue, QueueName="q2",
                      Attributes={"Bogus": "1"}) == "InvalidAttributeName"
    assert await code(sqs.get_queue_attributes, QueueUrl=url,
                      AttributeNames=["Bogus"]) == "InvalidAttributeName"
    assert await code(sqs.delete_message, QueueUrl=url,
                      ReceiptHandle="not-a-handle") == "ReceiptHandleIsInvalid"
    assert await code(sqs.receive_message, QueueUrl=url,
                      MaxNumberOfMessages=11) == "InvalidParameterValue"
    assert await code(sqs.send_message, QueueUrl=url, MessageBody="x",
                      MessageAttributes={"n": {"DataType": "Number",
                                               "StringValue": "abc"}}) == "InvalidParameterValue"
    assert await code(sqs.send_message, QueueUrl=url,
                      MessageBody="bad \x00 char") == "InvalidMessageContents"
    assert await code(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": str(i), "MessageBody": "x"} for i in range(11)
    ]) == "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
    assert await code(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": "same", "MessageBody": "x"}, {"Id": "same", "MessageBody": "y"}
    ]) == "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
    assert await code(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": "no spaces", "MessageBody": "x"}
    ]) == "AWS.SimpleQueueService.InvalidBatchEntryId"
    assert await code(sqs.delete_message_batch, QueueUrl=url, Entries=[]) == (
        "AWS.SimpleQueueService.EmptyBatchRequest"
    )
    big = "x" * 200_000
    assert await code(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": str(i), "MessageBody": big} for i in range(6)
    ]) == "AWS.SimpleQueueService.BatchRequestTooLong"
    assert await code(sqs.tag_queue, QueueUrl=url,
                      Tags={f"k{i}": "v" for i in range(51)}) == "OverLimit"
    # A message over the queue's MaximumMessageSize, counting attribute names,
    # types and values as SQS does.
    small = (await run(sqs.create_queue, QueueName="small",
                       Attributes={"MaximumMessageSize": "1024"}))["QueueUrl"]
    fits = {"ab": {"DataType": "String", "StringValue": "v" * 10}}  # 2 + 6 + 10
    await run(sqs.send_message, QueueUrl=small, MessageBody="x" * (1024 - 18),
              MessageAttributes=fits)
    assert await code(sqs.send_message, QueueUrl=small, MessageBody="x" * (1024 - 17),
                      MessageAttributes=fits) == "InvalidParameterValue"


async def test_unknown_and_missing(served: tuple[str, Any]) -> None:
    base, _ = served
    async with httpx.AsyncClient(base_url=base) as http:
        response = await http.post("/", data={"Action": "Frobnicate"})
        assert response.status_code == 400
        assert "<Code>InvalidAction</Code>" in response.text
        response = await http.post("/", data={"Action": "GetQueueUrl"})
        assert response.status_code == 400
        assert "<Code>MissingParameter</Code>" in response.text
        response = await http.post(
            "/", content=b"{}",
            headers={"X-Amz-Target": "AmazonSQS.Frobnicate",
                     "Content-Type": "application/x-amz-json-1.0"},
        )
        assert response.status_code == 400
        assert response.json()["__type"].endswith("#UnknownOperationException")
        # A Query client posting to the queue URL, the queue named by the path.
        await http.post("/", data={"Action": "CreateQueue", "QueueName": "byurl"})
        response = await http.post(f"/{ACCOUNT}/byurl", data={
            "Action": "SendMessage", "MessageBody": "hi"})
        assert response.status_code == 200, response.text
        assert "<MessageId>" in response.text
        response = await http.post(f"/{ACCOUNT}/byurl", data={
            "Action": "ReceiveMessage", "AttributeName": "All"})
        assert "<Body>hi</Body>" in response.text
        assert "<Name>SenderId</Name>" in response.text
        # The REST API's paths are untouched by the queue URL route.
        assert (await http.get("/v1/queues")).status_code == 200
        assert (await http.get("/v1/nothing")).status_code == 404


async def test_rest_and_sqs_share_messages(served: tuple[str, Any]) -> None:
    base, _ = served
    sqs = client(base)
    async with httpx.AsyncClient(base_url=base) as http:
        assert (await http.post("/v1/queues", json={"name": "shared"})).status_code == 201
        response = await http.post("/v1/queues/shared/messages",
                                   json={"body": "from rest", "attributes": {"a": "1"}})
        assert response.status_code == 201
        url = f"{base}/{ACCOUNT}/shared"
        got = await run(sqs.receive_message, QueueUrl=url, MessageAttributeNames=["a"])
        (message,) = got["Messages"]
        assert message["MessageAttributes"] == {"a": {"DataType": "String", "StringValue": "1"}}
        await run(sqs.delete_message, QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        await run(sqs.send_message, QueueUrl=url, MessageBody="from sqs", MessageAttributes={
            "n": {"DataType": "Number", "StringValue": "7"},
            "b": {"DataType": "Binary", "BinaryValue": b"\x01"},
            "s.x": {"DataType": "String", "StringValue": "y"},
        })
        rest = (await http.get("/v1/queues/shared/receive")).json()["messages"]
        # Binary attributes are not shown by the REST API (docs/sqs.md).
        assert rest[0]["attributes"] == {"n": "7", "s.x": "y"}
        # The receive filter: a prefix with .*
        await http.patch(f"/v1/queues/shared/messages/{rest[0]['receipt_handle']}/visibility",
                         json={"timeout": 0})
        got = await run(sqs.receive_message, QueueUrl=url, MessageAttributeNames=["s.*"])
        assert got["Messages"][0]["MessageAttributes"] == {
            "s.x": {"DataType": "String", "StringValue": "y"}
        }
