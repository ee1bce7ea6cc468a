"""FIFO queues through the SQS door, with boto3 on both protocols (JSON and Query)
and once with the AWS CLI: queue attributes, message groups in order and held while
in flight, deduplication (explicit and by content), sequence numbers, receive request
attempt ids, dead-letter queues of the same type, and every FIFO error SQS answers."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from sqs_clients import ACCOUNT, client, run
from support import eventually, wait_until

PROTOCOLS = ["json", "query"]
AWS = str(Path(sys.executable).parent / "aws")


@pytest.fixture(params=PROTOCOLS)
def sqs(request: pytest.FixtureRequest, served: tuple[str, Any]) -> Any:
    return client(served[0], request.param)


async def refused(call: Any, **kwargs: Any) -> tuple[str, str]:
    """(code, message) of the error a call gets."""
    with pytest.raises(ClientError) as info:
        await run(call, **kwargs)
    error = info.value.response["Error"]
    return str(error["Code"]), str(error["Message"])


async def fifo_queue(sqs: Any, name: str = "orders.fifo", **attributes: str) -> str:
    url: str = (await run(sqs.create_queue, QueueName=name,
                          Attributes={"FifoQueue": "true", **attributes}))["QueueUrl"]
    return url


async def send(sqs: Any, url: str, body: str, group: str, dedup: str | None = None,
               **extra: Any) -> dict[str, Any]:
    sent: dict[str, Any] = await run(
        sqs.send_message, QueueUrl=url, MessageBody=body, MessageGroupId=group,
        MessageDeduplicationId=body if dedup is None else dedup, **extra,
    )
    return sent


async def receive(sqs: Any, url: str, **kwargs: Any) -> list[dict[str, Any]]:
    got = await run(sqs.receive_message, QueueUrl=url, **{"MaxNumberOfMessages": 10, **kwargs})
    messages: list[dict[str, Any]] = got.get("Messages", [])
    return messages


async def delete(sqs: Any, url: str, *messages: dict[str, Any]) -> None:
    for message in messages:
        await run(sqs.delete_message, QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


def bodies(messages: list[dict[str, Any]]) -> list[str]:
    return [m["Body"] for m in messages]


async def test_fifo_queue_attributes(sqs: Any, served: tuple[str, Any]) -> None:
    base, _ = served
    url = await fifo_queue(sqs)
    assert url == f"{base}/{ACCOUNT}/orders.fifo"
    # Created again with the same attributes: the same queue; with others, refused.
    assert await fifo_queue(sqs) == url
    assert (await run(sqs.get_queue_url, QueueName="orders.fifo"))["QueueUrl"] == url
    assert await refused(sqs.create_queue, QueueName="orders.fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true",
    }) == ("QueueAlreadyExists", "A queue already exists with the same name and a different "
           "value for attribute ContentBasedDeduplication")

    attributes = (await run(sqs.get_queue_attributes, QueueUrl=url,
                            AttributeNames=["All"]))["Attributes"]
    assert {k: attributes[k] for k in (
        "FifoQueue", "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit",
    )} == {"FifoQueue": "true", "ContentBasedDeduplication": "false",
           "DeduplicationScope": "queue", "FifoThroughputLimit": "perQueue"}
    assert attributes["QueueArn"] == f"arn:aws:sqs:us-east-1:{ACCOUNT}:orders.fifo"

    # High throughput: both settings, in SQS's spellings; FifoQueue true again is no change.
    await run(sqs.set_queue_attributes, QueueUrl=url, Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true",
        "DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId",
    })
    named = (await run(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=[
        "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit", "FifoQueue",
    ]))["Attributes"]
    assert named == {"FifoQueue": "true", "ContentBasedDeduplication": "true",
                     "DeduplicationScope": "messageGroup",
                     "FifoThroughputLimit": "perMessageGroupId"}
    # Created at once with them, the same.
    other = await fifo_queue(sqs, "fast.fifo", DeduplicationScope="messageGroup",
                             FifoThroughputLimit="perMessageGroupId")
    fast = (await run(sqs.get_queue_attributes, QueueUrl=other,
                      AttributeNames=["All"]))["Attributes"]
    assert (fast["DeduplicationScope"], fast["FifoThroughputLimit"]) == (
        "messageGroup", "perMessageGroupId")

    # A standard queue has none of them.
    standard = (await run(sqs.create_queue, QueueName="plain"))["QueueUrl"]
    everything = (await run(sqs.get_queue_attributes, QueueUrl=standard,
                            AttributeNames=["All"]))["Attributes"]
    assert not {"FifoQueue", "ContentBasedDeduplication", "DeduplicationScope",
                "FifoThroughputLimit"} & set(everything)
    assert "VisibilityTimeout" in everything
    # FifoQueue false is what a standard queue is (accepted here; see docs/sqs.md).
    await run(sqs.create_queue, QueueName="plain", Attributes={"FifoQueue": "false"})
    listed = await run(sqs.list_queues)
    assert sorted(listed["QueueUrls"]) == [
        f"{base}/{ACCOUNT}/fast.fifo", url, standard,
    ]


async def test_queue_attribute_errors(sqs: Any) -> None:
    fifo_url = await fifo_queue(sqs)
    standard = (await run(sqs.create_queue, QueueName="plain"))["QueueUrl"]
    fifo_name_message = (
        "The name of a FIFO queue can only include alphanumeric characters, hyphens, or "
        "underscores, must end with .fifo suffix and be 1 to 80 in length."
    )
    name_message = (
        "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
    )
    assert await refused(sqs.create_queue, QueueName="jobs",
                         Attributes={"FifoQueue": "true"}) == (
        "InvalidParameterValue", fifo_name_message)
    assert await refused(sqs.create_queue, QueueName=f"{'x' * 76}.fifo",
                         Attributes={"FifoQueue": "true"}) == (
        "InvalidParameterValue", fifo_name_message)
    assert await refused(sqs.create_queue, QueueName="jobs.fifo") == (
        "InvalidParameterValue", name_message)
    assert await refused(sqs.create_queue, QueueName="jobs.fifo",
                         Attributes={"FifoQueue": "false"}) == (
        "InvalidParameterValue", name_message)
    assert await refused(sqs.create_queue, QueueName="jobs.fifo",
                         Attributes={"FifoQueue": "maybe"}) == (
        "InvalidParameterValue", name_message)
    assert await refused(sqs.create_queue, QueueName="jobs",
                         Attributes={"FifoQueue": "maybe"}) == (
        "InvalidAttributeValue", "Invalid value for the parameter FifoQueue. Valid values: "
        "true, false.")
    # FIFO-only attributes on a standard queue.
    assert await refused(sqs.create_queue, QueueName="jobs",
                         Attributes={"ContentBasedDeduplication": "false"}) == (
        "InvalidAttributeName", "Unknown Attribute ContentBasedDeduplication.")
    for name in ("DeduplicationScope", "FifoThroughputLimit"):
        assert await refused(sqs.create_queue, QueueName="jobs",
                             Attributes={name: "queue"}) == (
            "InvalidAttributeName",
            f"You can specify the {name} only when FifoQueue is set to true.")
        assert await refused(sqs.set_queue_attributes, QueueUrl=standard,
                             Attributes={name: "queue"}) == (
            "InvalidAttributeName",
            f"You can specify the {name} only when FifoQueue is set to true.")
    assert await refused(sqs.set_queue_attributes, QueueUrl=standard,
                         Attributes={"ContentBasedDeduplication": "true"}) == (
        "InvalidAttributeName", "Unknown Attribute ContentBasedDeduplication.")
    assert await refused(sqs.get_queue_attributes, QueueUrl=standard,
                         AttributeNames=["FifoQueue"]) == (
        "InvalidAttributeName", "Unknown Attribute FifoQueue.")
    assert await refused(sqs.get_queue_attributes, QueueUrl=standard,
                         AttributeNames=["VisibilityTimeout", "DeduplicationScope"]) == (
        "InvalidAttributeName", "Unknown Attribute DeduplicationScope.")
    # The queue type is fixed.
    assert await refused(sqs.set_queue_attributes, QueueUrl=standard,
                         Attributes={"FifoQueue": "true"}) == (
        "InvalidAttributeName", "Unknown Attribute FifoQueue.")
    assert await refused(sqs.set_queue_attributes, QueueUrl=fifo_url,
                         Attributes={"FifoQueue": "false"}) == (
        "InvalidAttributeValue", "Invalid value for the parameter FifoQueue. Reason: "
        "Modifying queue type is not supported.")
    # Values outside SQS's spellings, the engine's included.
    for name, value, allowed in (
        ("DeduplicationScope", "message_group", "queue, messageGroup"),
        ("FifoThroughputLimit", "per_queue", "perQueue, perMessageGroupId"),
    ):
        assert await refused(sqs.set_queue_attributes, QueueUrl=fifo_url,
                             Attributes={name: value}) == (
            "InvalidAttributeValue",
            f"Invalid value for the parameter {name}. Valid values: {allowed}.")
    assert await refused(sqs.create_queue, QueueName="x.fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "yes",
    }) == ("InvalidAttributeValue",
           "Invalid value for the parameter ContentBasedDeduplication. Valid values: true, "
           "false.")
    # Nothing above changed the FIFO queue.
    attributes = (await run(sqs.get_queue_attributes, QueueUrl=fifo_url,
                            AttributeNames=["All"]))["Attributes"]
    assert (attributes["DeduplicationScope"], attributes["FifoThroughputLimit"]) == (
        "queue", "perQueue")
    assert "Messages" not in await run(sqs.receive_message, QueueUrl=standard)


async def test_per_message_group_throughput_needs_the_message_group_scope(sqs: Any) -> None:
    rule = ("InvalidAttributeValue", "Invalid value for the parameter FifoThroughputLimit. "
            "Reason: The perMessageGroupId value is allowed only when the value for "
            "DeduplicationScope is messageGroup.")
    # Created with it alone (the scope is queue by default) or with the queue scope.
    assert await refused(sqs.create_queue, QueueName="fast.fifo", Attributes={
        "FifoQueue": "true", "FifoThroughputLimit": "perMessageGroupId",
    }) == rule
    assert await refused(sqs.create_queue, QueueName="fast.fifo", Attributes={
        "FifoQueue": "true", "FifoThroughputLimit": "perMessageGroupId",
        "DeduplicationScope": "queue",
    }) == rule
    assert not (await run(sqs.list_queues)).get("QueueUrls")  # nothing was created
    # Set on a queue whose scope is queue; judged with the queue's other values.
    url = await fifo_queue(sqs)
    assert await refused(sqs.set_queue_attributes, QueueUrl=url,
                         Attributes={"FifoThroughputLimit": "perMessageGroupId"}) == rule
    await run(sqs.set_queue_attributes, QueueUrl=url,
              Attributes={"DeduplicationScope": "messageGroup"})
    await run(sqs.set_queue_attributes, QueueUrl=url,
              Attributes={"FifoThroughputLimit": "perMessageGroupId"})
    # The scope cannot go back to queue while the limit is per message group.
    assert await refused(sqs.set_queue_attributes, QueueUrl=url,
                         Attributes={"DeduplicationScope": "queue"}) == rule
    await run(sqs.set_queue_attributes, QueueUrl=url, Attributes={
        "DeduplicationScope": "queue", "FifoThroughputLimit": "perQueue",
    })
    attributes = (await run(sqs.get_queue_attributes, QueueUrl=url,
                            AttributeNames=["All"]))["Attributes"]
    assert (attributes["DeduplicationScope"], attributes["FifoThroughputLimit"]) == (
        "queue", "perQueue")


async def test_dead_letter_queues_keep_their_type(sqs: Any) -> None:
    fifo_dlq = await fifo_queue(sqs, "dead.fifo")
    standard_dlq = (await run(sqs.create_queue, QueueName="dead"))["QueueUrl"]
    fifo_arn = f"arn:aws:sqs:us-east-1:{ACCOUNT}:dead.fifo"
    standard_arn = f"arn:aws:sqs:us-east-1:{ACCOUNT}:dead"

    def policy(arn: str) -> str:
        return json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 1})

    def mismatch(arn: str) -> tuple[str, str]:
        return ("InvalidParameterValue",
                f"Value {policy(arn)} for parameter RedrivePolicy is invalid. Reason: "
                f"Dead-letter queue must be same type of queue as the source..")

    assert await refused(sqs.create_queue, QueueName="work.fifo", Attributes={
        "FifoQueue": "true", "RedrivePolicy": policy(standard_arn),
    }) == mismatch(standard_arn)
    assert await refused(sqs.create_queue, QueueName="work", Attributes={
        "RedrivePolicy": policy(fifo_arn),
    }) == mismatch(fifo_arn)
    work = await fifo_queue(sqs, "work.fifo")
    assert await refused(sqs.set_queue_attributes, QueueUrl=work,
                         Attributes={"RedrivePolicy": policy(standard_arn)}) == (
        mismatch(standard_arn))
    # A FIFO dead-letter queue that does not exist: the engine's refusal, as SQS's code.
    code, _ = await refused(sqs.set_queue_attributes, QueueUrl=work, Attributes={
        "RedrivePolicy": policy(f"arn:aws:sqs:us-east-1:{ACCOUNT}:missing.fifo"),
    })
    assert code == "InvalidParameterValue"

    # Of the same type: a message received once too often moves there, its group,
    # deduplication id and sequence number with it.
    await run(sqs.set_queue_attributes, QueueUrl=work,
              Attributes={"RedrivePolicy": policy(fifo_arn)})
    assert (await run(sqs.list_dead_letter_source_queues, QueueUrl=fifo_dlq))[
        "queueUrls"] == [work]
    sent = await send(sqs, work, "poison", "G", dedup="p-1")
    await send(sqs, work, "next", "G")
    (first,) = await receive(sqs, work, MaxNumberOfMessages=1, VisibilityTimeout=0)
    assert first["Body"] == "poison"
    # Received once already: this receive moves it and delivers the group's next.
    (nxt,) = await receive(sqs, work)
    assert nxt["Body"] == "next"
    (dead,) = await receive(sqs, fifo_dlq, AttributeNames=["All"])
    assert dead["Body"] == "poison"
    assert dead["MessageId"] == sent["MessageId"]
    assert dead["Attributes"]["MessageGroupId"] == "G"
    assert dead["Attributes"]["MessageDeduplicationId"] == "p-1"
    assert "SequenceNumber" in dead["Attributes"]
    assert "Messages" not in await run(sqs.receive_message, QueueUrl=standard_dlq)

    # Moved back by a move task: to the end of its group, with a new sequence number.
    await run(sqs.change_message_visibility, QueueUrl=fifo_dlq,
              ReceiptHandle=dead["ReceiptHandle"], VisibilityTimeout=0)
    await send(sqs, work, "after", "G")
    await run(sqs.start_message_move_task, SourceArn=fifo_arn)

    async def completed() -> bool:
        tasks = (await run(sqs.list_message_move_tasks, SourceArn=fifo_arn))["Results"]
        return bool(tasks[0]["Status"] == "COMPLETED")

    await eventually(completed)
    assert await receive(sqs, work) == []  # the group waits for "next", held until now
    await delete(sqs, work, nxt)
    back = await receive(sqs, work, AttributeNames=["SequenceNumber", "MessageGroupId"])
    assert bodies(back) == ["after", "poison"]
    assert back[1]["MessageId"] == sent["MessageId"]
    assert back[1]["Attributes"]["MessageGroupId"] == "G"
    assert int(back[1]["Attributes"]["SequenceNumber"]) > int(
        back[0]["Attributes"]["SequenceNumber"]) > int(dead["Attributes"]["SequenceNumber"])


async def test_a_group_in_order_and_held_while_in_flight(sqs: Any) -> None:
    url = await fifo_queue(sqs)
    sequence = []
    for n in range(4):
        sent = await send(sqs, url, f"a{n}", "A")
        assert set(sent) >= {"MessageId", "MD5OfMessageBody", "SequenceNumber"}
        assert sent["MD5OfMessageBody"] == hashlib.md5(f"a{n}".encode()).hexdigest()
        sequence.append(int(sent["SequenceNumber"]))
    assert sequence == sorted(sequence) and len(set(sequence)) == 4

    first = await receive(sqs, url, MaxNumberOfMessages=2, AttributeNames=["All"])
    assert bodies(first) == ["a0", "a1"]
    assert [m["Attributes"]["MessageGroupId"] for m in first] == ["A", "A"]
    assert [int(m["Attributes"]["SequenceNumber"]) for m in first] == sequence[:2]
    assert [m["Attributes"]["MessageDeduplicationId"] for m in first] == ["a0", "a1"]
    assert first[0]["Attributes"]["ApproximateReceiveCount"] == "1"
    # While any of group A is in flight, nothing later of it is delivered.
    assert await receive(sqs, url) == []
    await delete(sqs, url, first[0])
    assert await receive(sqs, url) == []
    # Released, a message comes back first in its group.
    await run(sqs.change_message_visibility, QueueUrl=url,
              ReceiptHandle=first[1]["ReceiptHandle"], VisibilityTimeout=0)
    again = await receive(sqs, url, AttributeNames=["ApproximateReceiveCount"])
    assert bodies(again) == ["a1", "a2", "a3"]
    assert again[0]["Attributes"] == {"ApproximateReceiveCount": "2"}
    await delete(sqs, url, *again)
    assert await receive(sqs, url) == []


async def test_one_receive_takes_groups_whole_and_in_order(sqs: Any) -> None:
    url = await fifo_queue(sqs)
    entries = [
        {"Id": f"{group}{n}", "MessageBody": f"{group}{n}", "MessageGroupId": group,
         "MessageDeduplicationId": f"{group}{n}"}
        for n in range(3) for group in "AB"
    ]
    batch = await run(sqs.send_message_batch, QueueUrl=url, Entries=entries)
    assert batch.get("Failed", []) == []
    assert [e["Id"] for e in batch["Successful"]] == [e["Id"] for e in entries]
    numbers = [int(e["SequenceNumber"]) for e in batch["Successful"]]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    # As many of one group as there are, then the next group.
    got = await receive(sqs, url, AttributeNames=["MessageGroupId"])
    assert bodies(got) == ["A0", "A1", "A2", "B0", "B1", "B2"]
    assert [m["Attributes"] for m in got] == [{"MessageGroupId": g} for g in "AAABBB"]
    # A receive of two takes one group's first two; another group is free meanwhile.
    for group in "CD":
        for n in range(3):
            await send(sqs, url, f"{group}{n}", group)
    await delete(sqs, url, *got)
    two = await receive(sqs, url, MaxNumberOfMessages=2)
    assert bodies(two) == ["C0", "C1"]
    assert bodies(await receive(sqs, url)) == ["D0", "D1", "D2"]


async def test_deduplication(sqs: Any) -> None:
    url = await fifo_queue(sqs)
    first = await send(sqs, url, "x", "G", dedup="d-1")
    again = await send(sqs, url, "x changed", "G", dedup="d-1")
    other = await send(sqs, url, "y", "G", dedup="d-2")
    assert again["MessageId"] == first["MessageId"]
    assert again["SequenceNumber"] == first["SequenceNumber"]
    assert again["MD5OfMessageBody"] == hashlib.md5(b"x changed").hexdigest()
    assert int(other["SequenceNumber"]) > int(first["SequenceNumber"])
    # The same id in another group is a duplicate too (the scope is the queue).
    assert (await send(sqs, url, "z", "H", dedup="d-1"))["MessageId"] == first["MessageId"]
    # In a batch, twice: stored once.
    batch = await run(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": "a", "MessageBody": "b1", "MessageGroupId": "G", "MessageDeduplicationId": "d-3"},
        {"Id": "b", "MessageBody": "b2", "MessageGroupId": "G", "MessageDeduplicationId": "d-3"},
    ])
    (a, b) = batch["Successful"]
    assert a["MessageId"] == b["MessageId"] and a["SequenceNumber"] == b["SequenceNumber"]
    got = await receive(sqs, url)
    assert bodies(got) == ["x", "y", "b1"]
    assert got[0]["MessageId"] == first["MessageId"]
    # A duplicate of a message already received and deleted is still a duplicate,
    # and so is one of a purged message.
    await delete(sqs, url, *got)
    assert (await send(sqs, url, "x", "G", dedup="d-1"))["MessageId"] == first["MessageId"]
    assert await receive(sqs, url) == []
    purged = await send(sqs, url, "purged", "G", dedup="d-4")
    await run(sqs.purge_queue, QueueUrl=url)
    assert (await send(sqs, url, "purged", "G", dedup="d-4"))["MessageId"] == (
        purged["MessageId"])
    assert await receive(sqs, url) == []

    # Scope message group: the same id in two groups is two messages.
    scoped = await fifo_queue(sqs, "scoped.fifo", DeduplicationScope="messageGroup")
    one = await send(sqs, scoped, "a", "A", dedup="d")
    two = await send(sqs, scoped, "b", "B", dedup="d")
    assert one["MessageId"] != two["MessageId"]
    assert (await send(sqs, scoped, "c", "A", dedup="d"))["MessageId"] == one["MessageId"]
    assert bodies(await receive(sqs, scoped)) == ["a", "b"]


async def test_content_based_deduplication(sqs: Any) -> None:
    url = await fifo_queue(sqs, ContentBasedDeduplication="true")
    one = await run(sqs.send_message, QueueUrl=url, MessageBody="same body", MessageGroupId="G")
    two = await run(sqs.send_message, QueueUrl=url, MessageBody="same body", MessageGroupId="G")
    assert one["MessageId"] == two["MessageId"]
    # An explicit id still wins over the body's hash.
    three = await send(sqs, url, "same body", "G", dedup="explicit")
    assert three["MessageId"] != one["MessageId"]
    batch = await run(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": "a", "MessageBody": "same body", "MessageGroupId": "G"},
        {"Id": "b", "MessageBody": "another", "MessageGroupId": "G"},
    ])
    assert batch["Successful"][0]["MessageId"] == one["MessageId"]
    got = await receive(sqs, url, AttributeNames=["MessageDeduplicationId"])
    assert bodies(got) == ["same body", "same body", "another"]
    assert [m["Attributes"]["MessageDeduplicationId"] for m in got] == [
        hashlib.sha256(b"same body").hexdigest(), "explicit",
        hashlib.sha256(b"another").hexdigest(),
    ]


async def test_receive_request_attempt_id(sqs: Any) -> None:
    url = await fifo_queue(sqs)
    for n in range(3):
        await send(sqs, url, f"m{n}", "G")
    first = await receive(sqs, url, MaxNumberOfMessages=2, ReceiveRequestAttemptId="try-1")
    assert bodies(first) == ["m0", "m1"]
    # A retry (a lost answer): the same messages with the same receipt handles.
    retried = await receive(sqs, url, MaxNumberOfMessages=2, ReceiveRequestAttemptId="try-1")
    assert [(m["MessageId"], m["ReceiptHandle"]) for m in retried] == [
        (m["MessageId"], m["ReceiptHandle"]) for m in first
    ]
    assert [m["Body"] for m in retried] == ["m0", "m1"]
    # Another attempt finds the group in flight.
    assert await receive(sqs, url, ReceiveRequestAttemptId="try-2") == []
    # The handles the retry gave work.
    await delete(sqs, url, *retried)
    (last,) = await receive(sqs, url, ReceiveRequestAttemptId="try-3")
    assert last["Body"] == "m2"
    assert await refused(sqs.receive_message, QueueUrl=url,
                         ReceiveRequestAttemptId="no spaces here") == (
        "InvalidParameterValue", "Value no spaces here for parameter ReceiveRequestAttemptId is "
        "invalid. Reason: It can only include alphanumeric and punctuation characters. 1 to 128 "
        "in length.")
    # A standard queue ignores it, whatever it is.
    standard = (await run(sqs.create_queue, QueueName="plain"))["QueueUrl"]
    await run(sqs.send_message, QueueUrl=standard, MessageBody="s")
    assert bodies(await receive(sqs, standard, ReceiveRequestAttemptId="no spaces")) == ["s"]


async def test_long_poll_wakes_on_a_fifo_send(sqs: Any, served: tuple[str, Any]) -> None:
    _, app = served
    url = await fifo_queue(sqs)
    waiting = asyncio.create_task(receive(sqs, url, WaitTimeSeconds=15))
    await wait_until(lambda: app.state.hub.parked() >= 1)
    await send(sqs, url, "wake", "G")
    assert bodies(await waiting) == ["wake"]


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

    # A standard queue: no deduplication id; a group id is accepted and ignored.
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
    assert not {"MessageGroupId", "MessageDeduplicationId", "SequenceNumber"} & set(
        fair["Attributes"])
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
    # A standard queue: a deduplication id fails its entry; a group id is ignored.
    standard = (await run(sqs.create_queue, QueueName="plain"))["QueueUrl"]
    mixed = await run(sqs.send_message_batch, QueueUrl=standard, Entries=[
        {"Id": "a", "MessageBody": "x", "MessageGroupId": "G"},
        {"Id": "b", "MessageBody": "y", "MessageDeduplicationId": "d"},
    ])
    assert [e["Id"] for e in mixed["Successful"]] == ["a"]
    assert "SequenceNumber" not in mixed["Successful"][0]
    assert [(e["Id"], e["Code"]) for e in mixed["Failed"]] == [("b", "InvalidParameterValue")]


@pytest.mark.e2e
@pytest.mark.skipif(not Path(AWS).exists(), reason="the awscli package is not installed")
async def test_aws_cli_with_a_fifo_queue(served: tuple[str, Any], tmp_path: Path) -> None:
    base, _ = served
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID="AKIDCLI", AWS_SECRET_ACCESS_KEY="secret",
        AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=str(tmp_path / "aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true", AWS_MAX_ATTEMPTS="1", AWS_PAGER="",
    )

    async def aws(*args: str, ok: bool = True) -> Any:
        proc = await asyncio.create_subprocess_exec(
            AWS, "sqs", *args, "--endpoint-url", base, "--output", "json",
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
        assert (proc.returncode == 0) == ok, err.decode()
        return json.loads(out) if ok and out.strip() else err.decode()

    url = (await aws("create-queue", "--queue-name", "cli.fifo", "--attributes",
                     json.dumps({"FifoQueue": "true", "ContentBasedDeduplication": "false"})))[
        "QueueUrl"]
    assert url == f"{base}/{ACCOUNT}/cli.fifo"
    first = await aws("send-message", "--queue-url", url, "--message-body", "one",
                      "--message-group-id", "g", "--message-deduplication-id", "d-1")
    duplicate = await aws("send-message", "--queue-url", url, "--message-body", "one",
                          "--message-group-id", "g", "--message-deduplication-id", "d-1")
    second = await aws("send-message", "--queue-url", url, "--message-body", "two",
                       "--message-group-id", "g", "--message-deduplication-id", "d-2")
    assert duplicate["MessageId"] == first["MessageId"]
    assert int(second["SequenceNumber"]) > int(first["SequenceNumber"])
    got = await aws("receive-message", "--queue-url", url, "--max-number-of-messages", "10",
                    "--attribute-names", "All", "--receive-request-attempt-id", "cli-try")
    assert [m["Body"] for m in got["Messages"]] == ["one", "two"]
    assert [m["Attributes"]["MessageGroupId"] for m in got["Messages"]] == ["g", "g"]
    assert [m["Attributes"]["SequenceNumber"] for m in got["Messages"]] == [
        first["SequenceNumber"], second["SequenceNumber"]]
    retried = await aws("receive-message", "--queue-url", url, "--max-number-of-messages",
                        "10", "--receive-request-attempt-id", "cli-try")
    assert [m["ReceiptHandle"] for m in retried["Messages"]] == [
        m["ReceiptHandle"] for m in got["Messages"]]
    attributes = (await aws("get-queue-attributes", "--queue-url", url, "--attribute-names",
                            "All"))["Attributes"]
    assert attributes["FifoQueue"] == "true"
    assert "MissingParameter" in await aws(
        "send-message", "--queue-url", url, "--message-body", "x",
        "--message-deduplication-id", "d-3", ok=False)
