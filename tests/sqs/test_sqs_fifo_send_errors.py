"""FIFO queues through the SQS door, with boto3 on both protocols (JSON and Query):
every FIFO error SQS answers to SendMessage and SendMessageBatch."""

from __future__ import annotations

from typing import Any

import pytest
from sqs_clients import PROTOCOLS, client, run
from sqs_fifo_support import bodies, fifo_queue, receive, refused, send


@pytest.fixture(params=PROTOCOLS)
def sqs(request: pytest.FixtureRequest, served: tuple[str, Any]) -> Any:
    return client(served[0], request.param)


async def test_send_errors(sqs: Any) -> None:
    url = await fifo_queue(sqs)
    assert await refused(sqs.send_message, QueueUrl=url, MessageBody="x",
                         MessageDeduplicationId="d") == (
        "MissingParameter", "The request must contain the parameter MessageGroupId.")
    assert await refused(sqs.send_message, QueueUrl=url, MessageBody="x",
                         MessageGroupId="G") == (
        "InvalidParameterValue", "The queue should either have ContentBasedDeduplication "
        "enabled or MessageDeduplicationId provided explicitly")
    assert await refused(sqs.send_message, QueueUrl=url, MessageBody="x", MessageGroupId="G",
                         MessageDeduplicationId="d", DelaySeconds=5) == (
        "InvalidParameterValue", "Value 5 for parameter DelaySeconds is invalid. Reason: The "
        "request include parameter that is not valid for this queue type.")
    for name in ("MessageGroupId", "MessageDeduplicationId"):
        ids = {"MessageGroupId": "G", "MessageDeduplicationId": "d", name: "not valid"}
        assert await refused(sqs.send_message, QueueUrl=url, MessageBody="x", **ids) == (
            "InvalidParameterValue", f"Value not valid for parameter {name} is invalid. "
            f"Reason: {name} can only include alphanumeric and punctuation characters. 1 to "
            f"128 in length.")
        ids[name] = "x" * 129
        code, _ = await refused(sqs.send_message, QueueUrl=url, MessageBody="x", **ids)
        assert code == "InvalidParameterValue"
    # 128 letters and digits and punctuation are fine; so is DelaySeconds 0.
    longest = "a!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~" + "z" * 95
    assert len(longest) == 128
    await send(sqs, url, "ok", longest, dedup=longest, DelaySeconds=0)
    (got,) = await receive(sqs, url, AttributeNames=["MessageGroupId"])
    assert got["Attributes"] == {"MessageGroupId": longest}

    # A standard queue: no deduplication id; a group id names the message's
    # tenant (fair queues), and comes back as its MessageGroupId.
    standard = (await run(sqs.create_queue, QueueName="plain"))["QueueUrl"]
    assert await refused(sqs.send_message, QueueUrl=standard, MessageBody="x",
                         MessageDeduplicationId="d") == (
        "InvalidParameterValue", "Value d for parameter MessageDeduplicationId is invalid. "
        "Reason: The request includes a parameter that is not valid for this queue type.")
    sent = await run(sqs.send_message, QueueUrl=standard, MessageBody="fair",
                     MessageGroupId="tenant-1", DelaySeconds=0)
    assert "SequenceNumber" not in sent
    (fair,) = await receive(sqs, standard, AttributeNames=["All"])
    assert fair["Body"] == "fair"
    assert fair["Attributes"]["MessageGroupId"] == "tenant-1"
    assert not {"MessageDeduplicationId", "SequenceNumber"} & set(fair["Attributes"])
    # Asked for by name on a standard queue's message: absent, no Attributes at all.
    await run(sqs.change_message_visibility, QueueUrl=standard,
              ReceiptHandle=fair["ReceiptHandle"], VisibilityTimeout=0)
    (again,) = await receive(sqs, standard, AttributeNames=["SequenceNumber"])
    assert "Attributes" not in again


async def test_send_batch_errors(sqs: Any) -> None:
    url = await fifo_queue(sqs)
    ok = {"MessageBody": "x", "MessageGroupId": "G", "MessageDeduplicationId": "d"}
    # These two refuse the whole batch, as SQS does.
    assert await refused(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": "a", **ok}, {"Id": "b", "MessageBody": "y", "MessageDeduplicationId": "e"},
    ]) == ("InvalidParameterValue", "The request must contain the parameter MessageGroupId.")
    assert await refused(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": "a", **ok}, {"Id": "b", "MessageBody": "y", "MessageGroupId": "G"},
    ]) == ("InvalidParameterValue", "The queue should either have ContentBasedDeduplication "
           "enabled or MessageDeduplicationId provided explicitly")
    assert await receive(sqs, url) == []
    # The others fail their entry alone.
    batch = await run(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": "a", **ok},
        {"Id": "delayed", **ok, "MessageDeduplicationId": "e", "DelaySeconds": 3},
        {"Id": "bad", **ok, "MessageGroupId": "bad group"},
    ])
    assert [e["Id"] for e in batch["Successful"]] == ["a"]
    assert "SequenceNumber" in batch["Successful"][0]
    assert [(e["Id"], e["Code"], e["SenderFault"]) for e in batch["Failed"]] == [
        ("delayed", "InvalidParameterValue", True), ("bad", "InvalidParameterValue", True),
    ]
    assert batch["Failed"][0]["Message"] == (
        "Value 3 for parameter DelaySeconds is invalid. Reason: The request include "
        "parameter that is not valid for this queue type.")
    assert bodies(await receive(sqs, url)) == ["x"]
    # A standard queue: a deduplication id fails its entry; a group id is kept.
    standard = (await run(sqs.create_queue, QueueName="plain"))["QueueUrl"]
    mixed = await run(sqs.send_message_batch, QueueUrl=standard, Entries=[
        {"Id": "a", "MessageBody": "x", "MessageGroupId": "G"},
        {"Id": "b", "MessageBody": "y", "MessageDeduplicationId": "d"},
    ])
    assert [e["Id"] for e in mixed["Successful"]] == ["a"]
    assert "SequenceNumber" not in mixed["Successful"][0]
    assert [(e["Id"], e["Code"]) for e in mixed["Failed"]] == [("b", "InvalidParameterValue")]
    (kept,) = await receive(sqs, standard, AttributeNames=["MessageGroupId"])
    assert kept["Attributes"] == {"MessageGroupId": "G"}
