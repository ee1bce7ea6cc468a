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
    ([], []),
    (["All"], sorted(ATTRIBUTES)),
    ([".*"], sorted(ATTRIBUTES)),
    (["*"], sorted(ATTRIBUTES)),  # AWS answers every attribute for "*" too
    # A prefix is the text before ".*": "order.*" takes "orderly" too, as AWS's
    # "Hel.*" takes "Hello" beside "Help.Me".
    (["order.*"], ["order.id", "order.total", "orderly"]),
    (["ord.*"], ["order.id", "order.total", "orderly"]),
    (["customer"], ["customer"]),
    (["order.id", "customer"], ["customer", "order.id"]),
    (["blob.*", "orderly"], ["blob.png", "orderly"]),
    (["order"], []),  # a name, not a prefix
    (["nothing.*", "absent"], []),
    # Names no attribute can bear match nothing, and are no error.
    (["AWS."], []),
    (["..foo"], []),
    (["..foo", "customer"], ["customer"]),
])
async def test_message_attribute_names_filter(
    sqs: Any, names: list[str] | None, expected: list[str]
) -> None:
    url = (await run(sqs.create_queue, QueueName="filters"))["QueueUrl"]
    sent = await run(sqs.send_message, QueueUrl=url, MessageBody="m",
                     MessageAttributes=ATTRIBUTES)
    assert sent["MD5OfMessageAttributes"] == reference_md5_of_attributes(ATTRIBUTES)
    kwargs: dict[str, Any] = {} if names is None else {"MessageAttributeNames": names}
    (message,) = (await run(sqs.receive_message, QueueUrl=url, **kwargs))["Messages"]
    if expected:
        got = message["MessageAttributes"]
        assert got == {name: ATTRIBUTES[name] for name in expected}
        assert message["MD5OfMessageAttributes"] == reference_md5_of_attributes(got)
    else:
        # None matching: neither the attributes (not even an empty map) nor their MD5.
        assert "MessageAttributes" not in message
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


@pytest.mark.parametrize("name", [
    "attr.1øßä",  # letters of any script: AWS's own baseline in its recording
    "Help.Me",
    "a_b-c.d",
    "L" * 256,
])
async def test_attribute_names_accepted(sqs: Any, name: str) -> None:
    url = (await run(sqs.create_queue, QueueName="names"))["QueueUrl"]
    attributes = {name: {"DataType": "String", "StringValue": "v"}}
    sent = await run(sqs.send_message, QueueUrl=url, MessageBody="m",
                     MessageAttributes=attributes)
    assert sent["MD5OfMessageAttributes"] == reference_md5_of_attributes(attributes)
    (message,) = (await run(sqs.receive_message, QueueUrl=url,
                            MessageAttributeNames=["All"]))["Messages"]
    assert message["MessageAttributes"] == attributes


@pytest.mark.parametrize("name", [
    "aWs.-Invalid-attr", "AMAZON.-Invalid-attr", ".-Invalid-attr", "Invalid.",
    "Invalid..Name", "Invalid-!-attr", 'Invalid-"-attr', "Invalid-§-attr",
    "Invalid-(-attr", "Invalid-?-attr", "L" * 257,
])
async def test_attribute_names_refused(sqs: Any, name: str) -> None:
    url = (await run(sqs.create_queue, QueueName="names"))["QueueUrl"]
    assert await refusal(
        sqs.send_message, QueueUrl=url, MessageBody="m",
        MessageAttributes={name: {"DataType": "String", "StringValue": "v"}},
    ) == ("InvalidParameterValue", f"Message attribute name '{name}' is invalid.")


async def test_refused_name_echoed_as_xml_can_carry_it(sqs: Any) -> None:
    # A control character in a refused name is left out of the error's words: a
    # Query answer echoing it would be no XML at all.
    url = (await run(sqs.create_queue, QueueName="names"))["QueueUrl"]
    assert await refusal(
        sqs.send_message, QueueUrl=url, MessageBody="m",
        MessageAttributes={f"bad{chr(8)}name": {"DataType": "String", "StringValue": "v"}},
    ) == ("InvalidParameterValue", "Message attribute name 'badname' is invalid.")


@pytest.mark.parametrize("data_type", ["Invalid", "Number." + "L" * 256, "string"])
async def test_attribute_types_refused(sqs: Any, data_type: str) -> None:
    url = (await run(sqs.create_queue, QueueName="types"))["QueueUrl"]
    assert await refusal(
        sqs.send_message, QueueUrl=url, MessageBody="m",
        MessageAttributes={"Attribute_name": {"DataType": data_type, "StringValue": "1"}},
    ) == (
        "InvalidParameterValue",
        "The type of message attribute 'Attribute_name' is invalid. You must use only the "
        "following supported type prefixes: Binary, Number, String.",
    )
