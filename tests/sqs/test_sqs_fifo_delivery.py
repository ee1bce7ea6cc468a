"""FIFO queues through the SQS door, with boto3 on both protocols (JSON and Query):
message groups in order and held while in flight, whole groups per receive,
deduplication (explicit and by content), sequence numbers, receive request attempt
ids, and a long poll woken by a FIFO send."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest
from sqs_clients import PROTOCOLS, client, run
from sqs_fifo_support import bodies, delete, fifo_queue, receive, refused, send
from support import wait_until


@pytest.fixture(params=PROTOCOLS)
def sqs(request: pytest.FixtureRequest, served: tuple[str, Any]) -> Any:
    return client(served[0], request.param)


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
    # A duplicate of a message already received and deleted is still a duplicate;
    # one of a purged message is not (SQS's recorded answer: a purge forgets them).
    await delete(sqs, url, *got)
    assert (await send(sqs, url, "x", "G", dedup="d-1"))["MessageId"] == first["MessageId"]
    assert await receive(sqs, url) == []
    purged = await send(sqs, url, "purged", "G", dedup="d-4")
    await run(sqs.purge_queue, QueueUrl=url)
    again = await send(sqs, url, "sent again", "G", dedup="d-4")
    assert again["MessageId"] != purged["MessageId"]
    assert bodies(await receive(sqs, url)) == ["sent again"]

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
