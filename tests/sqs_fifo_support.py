"""What the SQS FIFO tests share (tests/sqs/test_sqs_fifo_*.py): a FIFO queue made,
sends, receives and deletes through boto3, and the error a call gets."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError
from sqs_clients import run


async def refused(call: Any, **kwargs: Any) -> tuple[str, str]:
    """(code, message) of the error a call gets."""
    with pytest.raises(ClientError) as info:
        await run(call, **kwargs)
    error = info.value.response["Error"]
    return str(error["Code"]), str(error["Message"])


async def refusal(call: Any, **kwargs: Any) -> tuple[str, str, int]:
    """(code, message, HTTP status) of a call that must fail."""
    with pytest.raises(ClientError) as info:
        await run(call, **kwargs)
    response = info.value.response
    return (str(response["Error"]["Code"]), str(response["Error"]["Message"]),
            int(response["ResponseMetadata"]["HTTPStatusCode"]))


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
