"""SQS visibility as AWS records it, with boto3 on both protocols: a handle whose
message was made visible again (visibility 0) still changes its visibility while no
other receive has claimed the message, and messages whose leases lapse come back in
the order they were sent."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError
from sqs_clients import client, run


@pytest.fixture(params=["json", "query"])
def sqs(request: pytest.FixtureRequest, served: tuple[str, Any]) -> Any:
    return client(served[0], str(request.param))


async def test_a_handle_made_visible_changes_again_until_another_receive(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="again"))["QueueUrl"]
    await run(sqs.send_message, QueueUrl=url, MessageBody="job")
    (first,) = (await run(sqs.receive_message, QueueUrl=url))["Messages"]
    handle = first["ReceiptHandle"]
    await run(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=handle,
              VisibilityTimeout=0)
    # Nobody has claimed it since: the same handle takes it back out of sight.
    await run(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=handle,
              VisibilityTimeout=60)
    assert "Messages" not in await run(sqs.receive_message, QueueUrl=url)
    await run(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=handle,
              VisibilityTimeout=0)
    (second,) = (await run(sqs.receive_message, QueueUrl=url))["Messages"]
    assert second["MessageId"] == first["MessageId"]
    # Claimed again by a receive: the first handle is stale now.
    with pytest.raises(ClientError) as info:
        await run(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=handle,
                  VisibilityTimeout=60)
    assert info.value.response["Error"]["Code"] == "InvalidParameterValue"
    await run(sqs.delete_message, QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])


async def test_lapsed_leases_come_back_in_send_order(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="lapse"))["QueueUrl"]
    bodies = [f"m{i}" for i in range(8)]
    for body in bodies:
        await run(sqs.send_message, QueueUrl=url, MessageBody=body)
    first = (await run(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=10,
                       VisibilityTimeout=1))["Messages"]
    assert [m["Body"] for m in first] == bodies
    # A long poll wakes when the leases lapse, all at the same instant.
    again = (await run(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=10,
                       WaitTimeSeconds=10))["Messages"]
    assert [m["Body"] for m in again] == bodies
