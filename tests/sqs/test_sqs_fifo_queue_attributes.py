"""FIFO queues through the SQS door, with boto3 on both protocols (JSON and Query):
their queue attributes and the refusals of them, the per-message-group throughput
scope, and dead-letter queues of the same type."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqs_clients import ACCOUNT, PROTOCOLS, client, run
from sqs_fifo_support import bodies, delete, fifo_queue, receive, refused, send
from support import eventually

FIFO_NAME_MESSAGE = (
    "The name of a FIFO queue can only include alphanumeric characters, hyphens, or "
    "underscores, must end with .fifo suffix and be 1 to 80 in length."
)


@pytest.fixture(params=PROTOCOLS)
def sqs(request: pytest.FixtureRequest, served: tuple[str, Any]) -> Any:
    return client(served[0], request.param)


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
    # A standard queue has no FifoQueue attribute, not even "false" (SQS's answer).
    assert await refused(sqs.create_queue, QueueName="plain",
                         Attributes={"FifoQueue": "false"}) == (
        "InvalidAttributeName", "Unknown Attribute FifoQueue.")
    assert await refused(sqs.set_queue_attributes, QueueUrl=standard,
                         Attributes={"FifoQueue": "false"}) == (
        "InvalidAttributeName", "Unknown Attribute FifoQueue.")
    listed = await run(sqs.list_queues)
    assert sorted(listed["QueueUrls"]) == [
        f"{base}/{ACCOUNT}/fast.fifo", url, standard,
    ]


async def test_queue_attribute_errors(sqs: Any) -> None:
    fifo_url = await fifo_queue(sqs)
    standard = (await run(sqs.create_queue, QueueName="plain"))["QueueUrl"]
    fifo_name_message = FIFO_NAME_MESSAGE
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
        "InvalidAttributeName", "Unknown Attribute FifoQueue.")
    assert await refused(sqs.create_queue, QueueName="jobs",
                         Attributes={"FifoQueue": "false", "DeduplicationScope": "queue"}) == (
        "InvalidAttributeName", "Unknown Attribute FifoQueue.")
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
