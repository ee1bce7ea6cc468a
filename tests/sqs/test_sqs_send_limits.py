"""SendMessage, SendMessageBatch and ReceiveMessage refusals as AWS answers them
(LocalStack's AWS-recorded snapshots: codes and words), with boto3 on both
protocols: sizes, the receive parameters' ranges, batch entries and their ids,
FIFO send parameters, and what a message keeps in its dead-letter queue."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqs_clients import refusal, run

MAX = 1_048_576  # leaseq's MaximumMessageSize default, SQS's since 2025
ATTRIBUTE = {"k": {"DataType": "String", "StringValue": "x"}}
ATTRIBUTE_BYTES = len("k") + len("String") + len("x")  # what SQS counts of it
TRACE = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
TRACE_MD5 = "5ae4d5d7636402d80f4eb6d213245a88"  # AWS's answer for TRACE
ENTRY_ID_WORDS = (
    "A batch entry id can only contain alphanumeric characters, hyphens and "
    "underscores. It can be at most 80 letters long."
)
NO_DEDUPLICATION = (
    "The queue should either have ContentBasedDeduplication enabled or "
    "MessageDeduplicationId provided explicitly"
)
NO_GROUP = "The request must contain the parameter MessageGroupId."


async def queue(sqs: Any, name: str, **attributes: str) -> str:
    if name.endswith(".fifo"):
        attributes = {"FifoQueue": "true", **attributes}
    return str((await run(sqs.create_queue, QueueName=name, Attributes=attributes))["QueueUrl"])


async def test_oversized_message(sqs: Any) -> None:
    url = await queue(sqs, "big")
    body = "a" * (MAX - ATTRIBUTE_BYTES + 1)
    assert await refusal(sqs.send_message, QueueUrl=url, MessageBody=body,
                         MessageAttributes=ATTRIBUTE) == (
        "InvalidParameterValue",
        f"One or more parameters are invalid. Reason: Message must be shorter than {MAX} "
        f"bytes.",
    )
    await run(sqs.set_queue_attributes, QueueUrl=url, Attributes={"MaximumMessageSize": "1024"})
    await run(sqs.send_message, QueueUrl=url, MessageBody="a" * 1024)  # exactly the limit
    assert await refusal(sqs.send_message, QueueUrl=url,
                         MessageBody="a" * (1024 - ATTRIBUTE_BYTES + 1),
                         MessageAttributes=ATTRIBUTE) == (
        "InvalidParameterValue",
        "One or more parameters are invalid. Reason: Message must be shorter than 1024 bytes.",
    )


async def test_oversized_batch(sqs: Any) -> None:
    url = await queue(sqs, "big")
    entries = [
        {"Id": "1", "MessageBody": "a" * (MAX - ATTRIBUTE_BYTES), "MessageAttributes": ATTRIBUTE},
        {"Id": "2", "MessageBody": "a"},
    ]
    assert await refusal(sqs.send_message_batch, QueueUrl=url, Entries=entries) == (
        "AWS.SimpleQueueService.BatchRequestTooLong",
        f"Batch requests cannot be longer than {MAX} bytes. You have sent {MAX + 1} bytes.",
    )
    # Each message at most the queue's lowered limit: the batch goes through whole.
    await run(sqs.set_queue_attributes, QueueUrl=url, Attributes={"MaximumMessageSize": "2048"})
    sent = await run(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": "1", "MessageBody": "a" * (2048 - ATTRIBUTE_BYTES), "MessageAttributes": ATTRIBUTE},
        {"Id": "2", "MessageBody": "a"},
    ])
    assert [e["Id"] for e in sent["Successful"]] == ["1", "2"]
    assert sent["Successful"][0]["MD5OfMessageAttributes"] == "a45daa70926828a2f0a1db3418e6feb4"
    assert sent["Successful"][1]["MD5OfMessageBody"] == "0cc175b9c0f1b6a831c399e269772661"
    assert not sent.get("Failed")


@pytest.mark.parametrize(("parameter", "value", "reason"), [
    ("MaxNumberOfMessages", 11, "Must be between 1 and 10, if provided."),
    ("MaxNumberOfMessages", 0, "Must be between 1 and 10, if provided."),
    ("WaitTimeSeconds", 21, "Must be >= 0 and <= 20, if provided."),
    ("WaitTimeSeconds", -1, "Must be >= 0 and <= 20, if provided."),
])
async def test_receive_parameters_out_of_range(
    sqs: Any, parameter: str, value: int, reason: str
) -> None:
    url = await queue(sqs, "ranges")
    assert await refusal(sqs.receive_message, QueueUrl=url, **{parameter: value}) == (
        "InvalidParameterValue",
        f"Value {value} for parameter {parameter} is invalid. Reason: {reason}",
    )


async def test_empty_body(sqs: Any) -> None:
    url = await queue(sqs, "empty")
    assert await refusal(sqs.send_message, QueueUrl=url, MessageBody="") == (
        "MissingParameter", "The request must contain the parameter MessageBody."
    )


async def test_batch_entry_counts(sqs: Any) -> None:
    url = await queue(sqs, "counts")
    twenty = [{"Id": f"message-{i}", "MessageBody": f"messageBody-{i}"} for i in range(20)]
    too_many = (
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        "Maximum number of entries per request are 10. You have sent 20.",
    )
    assert await refusal(sqs.send_message_batch, QueueUrl=url, Entries=twenty) == too_many
    handles = [{"Id": str(i), "ReceiptHandle": "h"} for i in range(20)]
    assert await refusal(sqs.delete_message_batch, QueueUrl=url, Entries=handles) == too_many
    assert await refusal(
        sqs.change_message_visibility_batch, QueueUrl=url,
        Entries=[{**h, "VisibilityTimeout": 123} for h in handles],
    ) == too_many
    code, _ = await refusal(sqs.send_message_batch, QueueUrl=url, Entries=[])
    assert code == "AWS.SimpleQueueService.EmptyBatchRequest"
    nothing = await run(sqs.receive_message, QueueUrl=url)
    assert "Messages" not in nothing


@pytest.mark.parametrize("entry_id", ["", "testLongId" * 10, "invalid:id", "message:x1"])
async def test_batch_entry_ids_refused(sqs: Any, entry_id: str) -> None:
    url = await queue(sqs, "ids")
    refused = ("AWS.SimpleQueueService.InvalidBatchEntryId", ENTRY_ID_WORDS)
    assert await refusal(sqs.send_message_batch, QueueUrl=url,
                         Entries=[{"Id": entry_id, "MessageBody": "m"}]) == refused
    assert await refusal(sqs.delete_message_batch, QueueUrl=url,
                         Entries=[{"Id": entry_id, "ReceiptHandle": "h"}]) == refused


async def test_batch_entry_ids_distinct(sqs: Any) -> None:
    url = await queue(sqs, "ids")
    code, _ = await refusal(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": "a", "MessageBody": "1"}, {"Id": "a", "MessageBody": "2"},
    ])
    assert code == "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
    sent = await run(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": "a" * 80, "MessageBody": "1"}, {"Id": "A_b-9", "MessageBody": "2"},
    ])
    assert sorted(e["Id"] for e in sent["Successful"]) == ["A_b-9", "a" * 80]


async def test_fifo_delay_of_its_own(sqs: Any) -> None:
    url = await queue(sqs, "delay.fifo", ContentBasedDeduplication="true")
    assert await refusal(sqs.send_message, QueueUrl=url, MessageBody="message-1",
                         MessageGroupId="1", DelaySeconds=2) == (
        "InvalidParameterValue",
        "Value 2 for parameter DelaySeconds is invalid. Reason: The request include parameter "
        "that is not valid for this queue type.",
    )
    sent = await run(sqs.send_message, QueueUrl=url, MessageBody="Hello World!",
                     MessageGroupId="test", MessageDeduplicationId="42", DelaySeconds=0)
    (message,) = (await run(sqs.receive_message, QueueUrl=url))["Messages"]
    assert message["MD5OfBody"] == sent["MD5OfMessageBody"]


async def test_fifo_missing_ids(sqs: Any) -> None:
    url = await queue(sqs, "ids.fifo", ContentBasedDeduplication="false")
    assert await refusal(sqs.send_message, QueueUrl=url, MessageBody="m",
                         MessageGroupId="g") == ("InvalidParameterValue", NO_DEDUPLICATION)
    assert await refusal(sqs.send_message, QueueUrl=url, MessageBody="m",
                         MessageDeduplicationId="d") == ("MissingParameter", NO_GROUP)
    # In a batch either refuses the whole request, the group as InvalidParameterValue.
    good = {"Id": "good", "MessageBody": "m", "MessageGroupId": "g", "MessageDeduplicationId": "d1"}
    assert await refusal(sqs.send_message_batch, QueueUrl=url, Entries=[
        good, {"Id": "bad", "MessageBody": "m", "MessageGroupId": "g"},
    ]) == ("InvalidParameterValue", NO_DEDUPLICATION)
    assert await refusal(sqs.send_message_batch, QueueUrl=url, Entries=[
        good, {"Id": "bad", "MessageBody": "m", "MessageDeduplicationId": "d2"},
    ]) == ("InvalidParameterValue", NO_GROUP)
    assert "Messages" not in await run(sqs.receive_message, QueueUrl=url)


@pytest.mark.parametrize("value", ["", " ", "x" * 129, f"bad{chr(8)}"])
@pytest.mark.parametrize("parameter", ["MessageGroupId", "MessageDeduplicationId"])
async def test_fifo_ids_refused(sqs: Any, parameter: str, value: str) -> None:
    ids = {"MessageGroupId": "g", "MessageDeduplicationId": "d", parameter: value}
    # The value is echoed without what XML cannot carry (a Query answer must parse).
    shown = value.replace(chr(8), "")
    words = (
        "InvalidParameterValue",
        f"Value {shown} for parameter {parameter} is invalid. Reason: {parameter} can only "
        f"include alphanumeric and punctuation characters. 1 to 128 in length.",
    )
    fifo = await queue(sqs, "ids.fifo")
    assert await refusal(sqs.send_message, QueueUrl=fifo, MessageBody="m", **ids) == words
    standard = await queue(sqs, "ids")
    assert await refusal(sqs.send_message, QueueUrl=standard, MessageBody="m",
                         **{parameter: value}) == words
    batch = await run(sqs.send_message_batch, QueueUrl=fifo, Entries=[
        {"Id": "ok", "MessageBody": "m", "MessageGroupId": "g", "MessageDeduplicationId": "ok"},
        {"Id": "bad", "MessageBody": "m", **ids},
    ])
    assert [e["Id"] for e in batch["Successful"]] == ["ok"]
    (failed,) = batch["Failed"]
    assert (failed["Id"], failed["Code"], failed["Message"]) == ("bad", *words)


async def test_receive_attempt_id_echoed_as_xml_can_carry_it(sqs: Any) -> None:
    url = await queue(sqs, "attempt.fifo")
    assert await refusal(sqs.receive_message, QueueUrl=url,
                         ReceiveRequestAttemptId=f"a{chr(1)}b") == (
        "InvalidParameterValue",
        "Value ab for parameter ReceiveRequestAttemptId is invalid. Reason: It can only "
        "include alphanumeric and punctuation characters. 1 to 128 in length.",
    )


async def test_trace_header_digest_is_aws_s(sqs: Any) -> None:
    url = await queue(sqs, "traced")
    number = {"timestamp": {"StringValue": "1493147359900", "DataType": "Number"}}
    plain = await run(sqs.send_message, QueueUrl=url, MessageBody="test",
                      MessageAttributes=number)
    traced = await run(sqs.send_message, QueueUrl=url, MessageBody="test",
                       MessageAttributes=number, MessageSystemAttributes={
                           "AWSTraceHeader": {"StringValue": TRACE, "DataType": "String"}})
    assert plain["MD5OfMessageAttributes"] == traced["MD5OfMessageAttributes"]
    assert "MD5OfMessageSystemAttributes" not in plain
    assert traced["MD5OfMessageSystemAttributes"] == TRACE_MD5


async def test_dead_letter_queue_keeps_attributes(sqs: Any) -> None:
    dlq = await queue(sqs, "dead")
    arn = (await run(sqs.get_queue_attributes, QueueUrl=dlq,
                     AttributeNames=["QueueArn"]))["Attributes"]["QueueArn"]
    source = await queue(sqs, "source", VisibilityTimeout="0", RedrivePolicy=json.dumps(
        {"deadLetterTargetArn": arn, "maxReceiveCount": 1}
    ))
    attributes = {
        "s": {"DataType": "String", "StringValue": "x"},
        "n": {"DataType": "Number.int", "StringValue": "7"},
        "b": {"DataType": "Binary", "BinaryValue": b"\x00\x01"},
    }
    sent = await run(sqs.send_message, QueueUrl=source, MessageBody="poison",
                     MessageAttributes=attributes, MessageSystemAttributes={
                         "AWSTraceHeader": {"StringValue": TRACE, "DataType": "String"}})
    await run(sqs.receive_message, QueueUrl=source)
    # Received once already: this receive moves it to the dead-letter queue.
    assert "Messages" not in await run(sqs.receive_message, QueueUrl=source)
    (dead,) = (await run(sqs.receive_message, QueueUrl=dlq, AttributeNames=["All"],
                         MessageAttributeNames=["All"]))["Messages"]
    assert dead["MessageId"] == sent["MessageId"]
    assert dead["MessageAttributes"] == attributes
    assert dead["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    system = dead["Attributes"]
    assert system["AWSTraceHeader"] == TRACE
    assert system["ApproximateReceiveCount"] == "2"  # the count goes on, as on SQS
    assert {"SenderId", "SentTimestamp", "ApproximateFirstReceiveTimestamp"} <= set(system)
    # Where it came from, as SQS tells (asked for by name too); a message sent to
    # the queue itself has none.
    assert system["DeadLetterQueueSourceArn"] == arn.replace(":dead", ":source")
    await run(sqs.change_message_visibility, QueueUrl=dlq,
              ReceiptHandle=dead["ReceiptHandle"], VisibilityTimeout=0)
    await run(sqs.send_message, QueueUrl=dlq, MessageBody="direct")
    got = (await run(sqs.receive_message, QueueUrl=dlq, MaxNumberOfMessages=10,
                     VisibilityTimeout=0, AttributeNames=["DeadLetterQueueSourceArn"]))["Messages"]
    assert sorted((m["Body"], m.get("Attributes")) for m in got) == [
        ("direct", None), ("poison", {"DeadLetterQueueSourceArn": system[
            "DeadLetterQueueSourceArn"]})]


async def test_body_characters_outside_sqs_s_set(sqs: Any) -> None:
    url = await queue(sqs, "chars")
    code, _ = await refusal(sqs.send_message, QueueUrl=url,
                            MessageBody=f"Invalid-{chr(0)}-{chr(8)}-{chr(19)}-{chr(65535)}")
    assert code == "InvalidMessageContents"
    entries = [{"Id": str(i), "MessageBody": str(i)} for i in range(9)]
    batch = await run(sqs.send_message_batch, QueueUrl=url,
                      Entries=[*entries, {"Id": "9", "MessageBody": chr(1)}])
    (failed,) = batch["Failed"]
    assert (failed["Id"], failed["Code"], failed["SenderFault"]) == (
        "9", "InvalidMessageContents", True
    )
    assert sorted(e["Id"] for e in batch["Successful"]) == [str(i) for i in range(9)]


async def test_system_attribute_names_on_a_standard_queue(sqs: Any) -> None:
    url = await queue(sqs, "system", VisibilityTimeout="0")
    await run(sqs.send_message, QueueUrl=url, MessageBody="msg",
              MessageAttributes={"Foo": {"DataType": "String", "StringValue": "Bar"}})

    async def receive(names: list[str], attributes: list[str] | None = None) -> Any:
        (message,) = (await run(sqs.receive_message, QueueUrl=url, AttributeNames=names,
                                MessageAttributeNames=attributes or []))["Messages"]
        return message

    everything = await receive(["All"])
    assert sorted(everything["Attributes"]) == [
        "ApproximateFirstReceiveTimestamp", "ApproximateReceiveCount", "SenderId",
        "SentTimestamp",
    ]
    assert "MessageAttributes" not in everything
    both = await receive(["All"], ["All"])
    assert both["Attributes"]["ApproximateReceiveCount"] == "2"
    assert both["MD5OfMessageAttributes"] == "ae7155c6026991b6d54b11589678bf9c"
    assert sorted((await receive(["SenderId"]))["Attributes"]) == ["SenderId"]
    # A FIFO queue's attribute, asked for on a standard queue: left out, no error.
    assert sorted((await receive(["SenderId", "SequenceNumber"]))["Attributes"]) == ["SenderId"]
