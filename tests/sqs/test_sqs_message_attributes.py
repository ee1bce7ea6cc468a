"""SQS message attributes as AWS records them, with boto3 on both protocols: the
MessageAttributeNames filters on receive, and the attribute values SQS refuses."""

from __future__ import annotations

from typing import Any

import pytest
from sqs_clients import reference_md5_of_attributes, refusal, run

ATTRIBUTES = {
    "order.id": {"DataType": "String", "StringValue": "o-1"},
    "order.total": {"DataType": "Number", "StringValue": "12.5"},
    "orderly": {"DataType": "String", "StringValue": "yes"},
    "customer": {"DataType": "String", "StringValue": "c-9"},
    "blob.png": {"DataType": "Binary", "BinaryValue": b"\x89PNG"},
}


@pytest.mark.parametrize(("names", "expected"), [
    (None, []),
    (["All"], sorted(ATTRIBUTES)),
    ([".*"], sorted(ATTRIBUTES)),
    (["order.*"], ["order.id", "order.total"]),
    (["customer"], ["customer"]),
    (["order.*", "customer"], ["customer", "order.id", "order.total"]),
    (["blob.*", "orderly"], ["blob.png", "orderly"]),
    (["order"], []),  # a name, not a prefix
    (["nothing.*", "absent"], []),
])
async def test_message_attribute_names_filter(
    sqs: Any, names: list[str] | None, expected: list[str]
) -> None:
    url = (await run(sqs.create_queue, QueueName="filters"))["QueueUrl"]
    await run(sqs.send_message, QueueUrl=url, MessageBody="m", MessageAttributes=ATTRIBUTES)
    kwargs: dict[str, Any] = {} if names is None else {"MessageAttributeNames": names}
    (message,) = (await run(sqs.receive_message, QueueUrl=url, **kwargs))["Messages"]
    got = message.get("MessageAttributes", {})
    assert sorted(got) == expected
    assert got == {name: ATTRIBUTES[name] for name in expected}
    if expected:
        assert message["MD5OfMessageAttributes"] == reference_md5_of_attributes(got)
    else:
        assert "MD5OfMessageAttributes" not in message


async def test_message_attribute_values_refused(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="values"))["QueueUrl"]

    async def send(attribute: dict[str, Any]) -> tuple[str, str]:
        return await refusal(sqs.send_message, QueueUrl=url, MessageBody="m",
                             MessageAttributes={"ErrorDetails": attribute})

    assert await send({"DataType": "String", "StringValue": ""}) == (
        "InvalidParameterValue",
        "Message (user) attribute 'ErrorDetails' must contain a non-empty value of type "
        "'String'.",
    )
    assert await send({"DataType": "Number", "StringValue": ""}) == (
        "InvalidParameterValue",
        "Message (user) attribute 'ErrorDetails' must contain a non-empty value of type "
        "'Number'.",
    )
    assert await send({"DataType": "String.custom", "StringValue": ""}) == (
        "InvalidParameterValue",
        "Message (user) attribute 'ErrorDetails' must contain a non-empty value of type "
        "'String'.",
    )
    # Characters outside SQS's set: InvalidParameterValue in an attribute (a body's
    # are InvalidMessageContents).
    code, message = await send({"DataType": "String", "StringValue": f"bad-{chr(8)},{chr(11)}"})
    assert code == "InvalidParameterValue"
    assert message.startswith("Invalid characters found in the message attribute 'ErrorDetails'.")
    code, _ = await refusal(sqs.send_message, QueueUrl=url, MessageBody=f"bad {chr(8)}")
    assert code == "InvalidMessageContents"
    # In a batch, the entry fails alone, with the same code and message.
    batch = await run(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": "ok", "MessageBody": "m"},
        {"Id": "empty", "MessageBody": "m",
         "MessageAttributes": {"a": {"DataType": "String", "StringValue": ""}}},
    ])
    assert [e["Id"] for e in batch["Successful"]] == ["ok"]
    (failed,) = batch["Failed"]
    assert (failed["Id"], failed["Code"], failed["SenderFault"]) == (
        "empty", "InvalidParameterValue", True
    )
    assert failed["Message"] == (
        "Message (user) attribute 'a' must contain a non-empty value of type 'String'."
    )
    # Nothing refused was stored: only the batch's good message is there.
    got = await run(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=10)
    assert [m["Body"] for m in got["Messages"]] == ["m"]
