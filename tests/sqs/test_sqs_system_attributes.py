"""SQS's message system attributes and size limits, with boto3 on both protocols:
an AWSTraceHeader sent (alone and in batches, standard and FIFO queues) comes
back with its MD5OfMessageSystemAttributes and on receive when asked for, other
system attributes are refused; an oversized message or batch gets SQS's error,
also after MaximumMessageSize has been lowered."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqs_clients import reference_md5_of_attributes, refusal, run

TRACE = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
SYSTEM = {"AWSTraceHeader": {"DataType": "String", "StringValue": TRACE}}
ATTRIBUTES = {"kind": {"DataType": "String", "StringValue": "order"}}
TRACE_MD5 = reference_md5_of_attributes(SYSTEM)


async def receive_one(sqs: Any, url: str, **kwargs: Any) -> dict[str, Any]:
    (message,) = (await run(sqs.receive_message, QueueUrl=url, VisibilityTimeout=0,
                            **kwargs))["Messages"]
    return dict(message)


async def test_trace_header_sent_and_received(sqs: Any, protocol: str) -> None:
    url = (await run(sqs.create_queue, QueueName="traced"))["QueueUrl"]
    sent = await run(sqs.send_message, QueueUrl=url, MessageBody="m",
                     MessageSystemAttributes=SYSTEM)
    assert sent["MD5OfMessageSystemAttributes"] == TRACE_MD5
    assert "MD5OfMessageAttributes" not in sent  # system attributes are not message ones
    # Not asked for: not given.
    assert "Attributes" not in await receive_one(sqs, url)
    asked = await receive_one(sqs, url, AttributeNames=["AWSTraceHeader"])
    assert asked["Attributes"] == {"AWSTraceHeader": TRACE}
    everything = await receive_one(sqs, url, AttributeNames=["All"])
    assert everything["Attributes"]["AWSTraceHeader"] == TRACE
    assert "SentTimestamp" in everything["Attributes"]
    assert "MD5OfMessageAttributes" not in everything
    if protocol == "json":  # the Query model predates MessageSystemAttributeNames
        named = await receive_one(sqs, url, MessageSystemAttributeNames=["AWSTraceHeader"])
        assert named["Attributes"] == {"AWSTraceHeader": TRACE}


async def test_trace_header_beside_message_attributes(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="both"))["QueueUrl"]
    sent = await run(sqs.send_message, QueueUrl=url, MessageBody="m",
                     MessageAttributes=ATTRIBUTES, MessageSystemAttributes=SYSTEM)
    assert sent["MD5OfMessageAttributes"] == reference_md5_of_attributes(ATTRIBUTES)
    assert sent["MD5OfMessageSystemAttributes"] == TRACE_MD5
    message = await receive_one(sqs, url, AttributeNames=["All"],
                                MessageAttributeNames=["All"])
    assert message["MessageAttributes"] == ATTRIBUTES
    assert message["MD5OfMessageAttributes"] == reference_md5_of_attributes(ATTRIBUTES)
    assert message["Attributes"]["AWSTraceHeader"] == TRACE


async def test_message_without_a_trace_header(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="plain"))["QueueUrl"]
    sent = await run(sqs.send_message, QueueUrl=url, MessageBody="m")
    assert "MD5OfMessageSystemAttributes" not in sent
    message = await receive_one(sqs, url, AttributeNames=["All"])
    assert "AWSTraceHeader" not in message["Attributes"]
    asked = await receive_one(sqs, url, AttributeNames=["AWSTraceHeader"])
    assert "Attributes" not in asked


async def test_trace_headers_in_a_batch(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="batched"))["QueueUrl"]
    other = "Root=1-00000000-000000000000000000000001"
    result = await run(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": "traced", "MessageBody": "a", "MessageSystemAttributes": SYSTEM},
        {"Id": "plain", "MessageBody": "b"},
        {"Id": "other", "MessageBody": "c", "MessageSystemAttributes": {
            "AWSTraceHeader": {"DataType": "String", "StringValue": other}}},
        {"Id": "bad", "MessageBody": "d", "MessageSystemAttributes": {
            "SenderId": {"DataType": "String", "StringValue": "x"}}},
    ])
    successful = {entry["Id"]: entry for entry in result["Successful"]}
    assert set(successful) == {"traced", "plain", "other"}
    assert successful["traced"]["MD5OfMessageSystemAttributes"] == TRACE_MD5
    assert "MD5OfMessageSystemAttributes" not in successful["plain"]
    assert successful["other"]["MD5OfMessageSystemAttributes"] == reference_md5_of_attributes(
        {"AWSTraceHeader": {"DataType": "String", "StringValue": other}}
    )
    (failed,) = result["Failed"]
    assert (failed["Id"], failed["Code"], failed["SenderFault"]) == (
        "bad", "InvalidParameterValue", True
    )
    assert failed["Message"] == "Message system attribute name 'SenderId' is invalid."
    received = (await run(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=10,
                          AttributeNames=["AWSTraceHeader"]))["Messages"]
    by_body = {m["Body"]: m.get("Attributes", {}).get("AWSTraceHeader") for m in received}
    assert by_body == {"a": TRACE, "b": None, "c": other}


async def test_trace_header_on_a_fifo_queue(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="traced.fifo",
                     Attributes={"FifoQueue": "true"}))["QueueUrl"]
    sent = await run(sqs.send_message, QueueUrl=url, MessageBody="m", MessageGroupId="g",
                     MessageDeduplicationId="d1", MessageSystemAttributes=SYSTEM)
    assert sent["MD5OfMessageSystemAttributes"] == TRACE_MD5
    batch = await run(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": "1", "MessageBody": "n", "MessageGroupId": "g", "MessageDeduplicationId": "d2",
         "MessageSystemAttributes": SYSTEM},
    ])
    assert batch["Successful"][0]["MD5OfMessageSystemAttributes"] == TRACE_MD5
    # A receive and its retry (the same ReceiveRequestAttemptId: answered again
    # from what the first claimed) both carry the header.
    for _ in range(2):
        received = (await run(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=2,
                              AttributeNames=["AWSTraceHeader", "MessageGroupId"],
                              ReceiveRequestAttemptId="try-1"))["Messages"]
        assert [(m["Body"], m["Attributes"]) for m in received] == [
            ("m", {"AWSTraceHeader": TRACE, "MessageGroupId": "g"}),
            ("n", {"AWSTraceHeader": TRACE, "MessageGroupId": "g"}),
        ]


async def test_trace_header_follows_a_message_to_its_dead_letter_queue(sqs: Any) -> None:
    dlq = (await run(sqs.create_queue, QueueName="dead"))["QueueUrl"]
    dlq_arn = (await run(sqs.get_queue_attributes, QueueUrl=dlq,
                         AttributeNames=["QueueArn"]))["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "1"})
    url = (await run(sqs.create_queue, QueueName="work",
                     Attributes={"RedrivePolicy": policy}))["QueueUrl"]
    await run(sqs.send_message, QueueUrl=url, MessageBody="poison",
              MessageSystemAttributes=SYSTEM)
    await receive_one(sqs, url)
    # Received once already: the next receive moves it to the dead-letter queue.
    assert "Messages" not in await run(sqs.receive_message, QueueUrl=url)
    dead = await receive_one(sqs, dlq, AttributeNames=["AWSTraceHeader"])
    assert (dead["Body"], dead["Attributes"]) == ("poison", {"AWSTraceHeader": TRACE})


@pytest.mark.parametrize(("system", "message"), [
    ({"SenderId": {"DataType": "String", "StringValue": "x"}},
     "Message system attribute name 'SenderId' is invalid."),
    ({"AWSTraceHeader": {"DataType": "Number", "StringValue": "1"}},
     "The message system attribute 'AWSTraceHeader' is reserved for AWS X-Ray trace header. "
     "The type must be 'String'."),
    ({"AWSTraceHeader": {"DataType": "Binary", "BinaryValue": b"x"}},
     "The message system attribute 'AWSTraceHeader' is reserved for AWS X-Ray trace header. "
     "The type must be 'String'."),
    ({"AWSTraceHeader": {"DataType": "String", "StringValue": ""}},
     "Message (system) attribute 'AWSTraceHeader' must contain a non-empty value of type "
     "'String'."),
    ({"AWSTraceHeader": {"DataType": "String", "StringValue": "a\x01b"}},
     "Invalid characters found in the message system attribute 'AWSTraceHeader'. Valid "
     "characters are #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to "
     "#x10FFFF."),
    ({"AWSTraceHeader": {"DataType": "String", "StringValue": "R" * 8193}},
     "The message system attribute 'AWSTraceHeader' is reserved for AWS X-Ray trace header. "
     "It must be at most 8192 bytes long."),
])
async def test_system_attributes_refused(
    sqs: Any, system: dict[str, Any], message: str
) -> None:
    url = (await run(sqs.create_queue, QueueName="refusing"))["QueueUrl"]
    assert await refusal(sqs.send_message, QueueUrl=url, MessageBody="m",
                         MessageSystemAttributes=system) == ("InvalidParameterValue", message)
    # Nothing was stored.
    assert "Messages" not in await run(sqs.receive_message, QueueUrl=url)


async def test_trace_header_is_not_counted_in_the_size(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="tight",
                     Attributes={"MaximumMessageSize": "1024"}))["QueueUrl"]
    await run(sqs.send_message, QueueUrl=url, MessageBody="x" * 1024,
              MessageSystemAttributes=SYSTEM)
    assert await refusal(sqs.send_message, QueueUrl=url, MessageBody="x" * 1025,
                         MessageSystemAttributes=SYSTEM) == (
        "InvalidParameterValue",
        "One or more parameters are invalid. Reason: Message must be shorter than 1024 bytes.",
    )


async def test_oversized_after_the_limit_is_lowered(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="shrinking"))["QueueUrl"]
    await run(sqs.send_message, QueueUrl=url, MessageBody="x" * 2000)
    await run(sqs.set_queue_attributes, QueueUrl=url, Attributes={"MaximumMessageSize": "1024"})
    too_long = (
        "InvalidParameterValue",
        "One or more parameters are invalid. Reason: Message must be shorter than 1024 bytes.",
    )
    assert await refusal(sqs.send_message, QueueUrl=url, MessageBody="x" * 2000) == too_long
    # In a batch, the oversized entry fails on its own; the others are sent.
    result = await run(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": "big", "MessageBody": "x" * 2000},
        {"Id": "small", "MessageBody": "y" * 1024},
    ])
    assert [entry["Id"] for entry in result["Successful"]] == ["small"]
    (failed,) = result["Failed"]
    assert (failed["Id"], failed["Code"], failed["Message"], failed["SenderFault"]) == (
        "big", *too_long, True
    )
    bodies = (await run(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=10))["Messages"]
    assert sorted(len(m["Body"]) for m in bodies) == [1024, 2000]  # sent before the change


async def test_batch_too_long(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="bulky"))["QueueUrl"]
    entries = [{"Id": str(i), "MessageBody": "x" * 400_000} for i in range(3)]
    assert await refusal(sqs.send_message_batch, QueueUrl=url, Entries=entries) == (
        "AWS.SimpleQueueService.BatchRequestTooLong",
        "Batch requests cannot be longer than 1048576 bytes. You have sent 1200000 bytes.",
    )
    assert "Messages" not in await run(sqs.receive_message, QueueUrl=url)
