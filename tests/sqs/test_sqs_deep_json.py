"""JSON nested far past Python's recursion limit is the client's error on the
SQS door, in either protocol and in every field that holds JSON text (a queue's
Policy, RedrivePolicy, RedriveAllowPolicy; a move task's handle): SQS's own
error, never InternalError with a traceback in the log."""

from __future__ import annotations

import base64
from urllib.parse import urlencode

import httpx
import pytest

DEEP_LIST = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a":' * 50_000 + "1" + "}" * 50_000
FORM = {"content-type": "application/x-www-form-urlencoded"}


def _query(**params: str) -> bytes:
    return urlencode(params).encode()


@pytest.mark.parametrize("deep", [DEEP_LIST, DEEP_OBJECT], ids=["list", "object"])
@pytest.mark.parametrize("attribute", ["Policy", "RedrivePolicy", "RedriveAllowPolicy"])
async def test_a_deep_json_attribute_is_an_invalid_attribute_value(
    client: httpx.AsyncClient, attribute: str, deep: str,
) -> None:
    created = await client.post("/", headers=FORM, content=_query(
        Action="CreateQueue", QueueName="deep", **{
            "Attribute.1.Name": attribute, "Attribute.1.Value": deep}))
    assert created.status_code == 400, created.text[:300]
    assert b"<Code>InvalidAttributeValue</Code>" in created.content
    await client.post("/", headers=FORM, content=_query(Action="CreateQueue", QueueName="flat"))
    changed = await client.post("/", headers=FORM, content=_query(
        Action="SetQueueAttributes", QueueUrl="http://leaseq.test/000000000000/flat", **{
            "Attribute.1.Name": attribute, "Attribute.1.Value": deep}))
    assert changed.status_code == 400, changed.text[:300]
    assert b"<Code>InvalidAttributeValue</Code>" in changed.content


async def test_a_deep_json_task_handle_is_not_a_handle(client: httpx.AsyncClient) -> None:
    handle = base64.b64encode(DEEP_LIST.encode()).decode()
    answer = await client.post("/", headers=FORM, content=_query(
        Action="CancelMessageMoveTask", TaskHandle=handle))
    assert answer.status_code in (400, 404), answer.text[:300]
    assert b"InternalError" not in answer.content


@pytest.mark.parametrize("body", [DEEP_LIST, '{"QueueName":' + DEEP_LIST + "}", DEEP_OBJECT])
async def test_a_deep_json_protocol_body_is_invalid(client: httpx.AsyncClient, body: str) -> None:
    answer = await client.post("/", content=body.encode(), headers={
        "content-type": "application/x-amz-json-1.0", "x-amz-target": "AmazonSQS.CreateQueue"})
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["__type"].endswith("#InvalidParameterValueException")
