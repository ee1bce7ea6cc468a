"""Hostile input on the SQS door is refused with the protocol's own errors, never a
500: Query forms and JSON bodies past the parser's limits, and tags with characters
SQS refuses."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from conftest import AppClient
from sqs_clients import ACCOUNT, run
from sqs_clients import client as sqs_client

from app.sqs import protocol
from app.sqs.errors import SqsError

ADMIN_KEY = "LQHOSTILEADMIN000001.hostile-secret-0123456789abcdefghij"
FORM = {"content-type": "application/x-www-form-urlencoded"}
QUEUE_URL = f"http://leaseq.test/{ACCOUNT}/tagged"


def sqs_json(action: str, params: dict[str, Any]) -> dict[str, Any]:
    # ensure_ascii: lone surrogates travel as \ud800 escapes, as a client may send them.
    return {
        "content": json.dumps(params, ensure_ascii=True),
        "headers": {"x-amz-target": f"AmazonSQS.{action}",
                    "content-type": "application/x-amz-json-1.0"},
    }


def json_error(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text[:300]
    # The code SDKs read (`x-amzn-query-error`), beside the JSON body's type.
    assert "#" in response.json()["__type"]
    return response.headers["x-amzn-query-error"].split(";")[0]


def query_error(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text[:300]
    return response.text.split("<Code>")[1].split("</Code>")[0]


# -- SQS Query and JSON parsing -------------------------------------------------


HOSTILE_FORMS = {
    "2,001 fields": "&".join(f"F{i}=x" for i in range(2_001)),
    "2,000 dotted parts": "Action=CreateQueue&" + ".".join(["a"] * 2_000) + "=x",
    "17 dotted parts": "Action=CreateQueue&QueueName=q&" + ".".join(["a"] * 17) + "=x",
    "a 300-character name": f"Action=CreateQueue&{'A' * 300}=x",
    "an index of 5,000 digits": f"Action=CreateQueue&Attribute.{'9' * 5_000}.Name=x",
    "an index of 200 digits": f"Action=CreateQueue&Attribute.{'9' * 200}.Name=x",
    "index 0": "Action=CreateQueue&QueueName=q&Attribute.0.Name=DelaySeconds",
    "index 1001": "Action=CreateQueue&QueueName=q&Attribute.1001.Name=DelaySeconds",
}


@pytest.mark.parametrize("body", HOSTILE_FORMS.values(), ids=HOSTILE_FORMS.keys())
async def test_hostile_query_forms_are_invalid_parameters(
    client: httpx.AsyncClient, body: str
) -> None:
    response = await client.post("/", content=body, headers=FORM)
    assert query_error(response) == "InvalidParameterValue"


async def test_the_field_limit_counts_the_query_string_too(client: httpx.AsyncClient) -> None:
    query = "&".join(f"Q{i}=x" for i in range(1_500))
    body = "&".join(f"F{i}=x" for i in range(501))
    response = await client.post(f"/?{query}", content=body, headers=FORM)
    assert query_error(response) == "InvalidParameterValue"


def test_the_largest_sqs_request_fits_the_query_limits() -> None:
    # SendMessageBatch at SQS's limits: 10 entries of 10 list-valued attributes.
    fields = ["Action=SendMessageBatch", f"QueueUrl={QUEUE_URL}"]
    for i in range(1, 11):
        entry = f"SendMessageBatchRequestEntry.{i}"
        fields += [f"{entry}.Id=e{i}", f"{entry}.MessageBody=b"]
        for j in range(1, 11):
            attribute = f"{entry}.MessageAttribute.{j}"
            fields += [f"{attribute}.Name=a{j}", f"{attribute}.Value.DataType=String",
                       f"{attribute}.Value.StringListValue.1=v"]
    action, params = protocol.parse_form(protocol.form_pairs("&".join(fields).encode(), ""))
    assert action == "SendMessageBatch"
    assert len(params["Entries"]) == 10
    assert params["Entries"][9]["MessageAttributes"]["a10"] == {
        "DataType": "String", "StringListValues": ["v"]
    }


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


SEND = f'{{"QueueUrl": "{QUEUE_URL}", "MessageBody": "b", "DelaySeconds": '
HOSTILE_JSON = {
    "nested 100,000 deep": ("CreateQueue", "[" * 100_000 + "]" * 100_000),
    # An unknown parameter is otherwise ignored: only the depth is refused.
    "nested 17 deep": ("CreateQueue", json.dumps({"QueueName": "q", "Other": nested(16)})),
    "an integer of 5,000 digits": ("SendMessage", SEND + "9" * 5_000 + "}"),
    "an integer of 4,000 digits": ("SendMessage", SEND + "9" * 4_000 + "}"),
}


@pytest.mark.parametrize("action,body", HOSTILE_JSON.values(), ids=HOSTILE_JSON.keys())
async def test_hostile_json_bodies_are_invalid_parameters(
    client: httpx.AsyncClient, action: str, body: str
) -> None:
    response = await client.post("/", content=body, headers={
        "x-amz-target": f"AmazonSQS.{action}", "content-type": "application/x-amz-json-1.0",
    })
    assert json_error(response) == "InvalidParameterValue"


def test_json_nests_up_to_the_limit_and_not_a_level_more() -> None:
    assert protocol.parse_json(json.dumps({"A": nested(15)}).encode())
    with pytest.raises(SqsError) as refused:
        protocol.parse_json(json.dumps({"A": nested(16)}).encode())
    assert refused.value.name == "InvalidParameterValue"


async def test_a_full_batch_from_a_query_client_passes_the_limits(
    served: tuple[str, Any],
) -> None:
    sqs = sqs_client(served[0], "query")
    url = (await run(sqs.create_queue, QueueName="full"))["QueueUrl"]
    attributes = {f"a{j}": {"DataType": "String", "StringValue": "v" * 20} for j in range(10)}
    sent = await run(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": f"e{i}", "MessageBody": "b", "MessageAttributes": attributes} for i in range(10)
    ])
    assert len(sent["Successful"]) == 10


# -- SQS tags -------------------------------------------------------------------


BAD_TEXT = ["\x00", "\ud800", "ok\x01", "\ufffe"]


@pytest.mark.parametrize("bad", BAD_TEXT, ids=lambda t: f"U+{ord(t[-1]):04X}")
async def test_tags_with_characters_sqs_refuses_are_invalid_parameters(
    client: httpx.AsyncClient, bad: str
) -> None:
    created = await client.post("/", **sqs_json("CreateQueue", {"QueueName": "tagged"}))
    assert created.status_code == 200, created.text
    calls: list[tuple[str, dict[str, Any]]] = [
        ("TagQueue", {"QueueUrl": QUEUE_URL, "Tags": {bad: "v"}}),
        ("TagQueue", {"QueueUrl": QUEUE_URL, "Tags": {"k": bad}}),
        ("UntagQueue", {"QueueUrl": QUEUE_URL, "TagKeys": ["k", bad]}),
        ("CreateQueue", {"QueueName": "other", "tags": {"k": bad}}),
        ("CreateQueue", {"QueueName": "other", "tags": {bad: "v"}}),
    ]
    for action, params in calls:
        response = await client.post("/", **sqs_json(action, params))
        assert json_error(response) == "InvalidParameterValue", (action, params)
    listed = await client.post("/", **sqs_json("ListQueueTags", {"QueueUrl": QUEUE_URL}))
    assert listed.json() == {}
    queues = await client.post("/", **sqs_json("ListQueues", {}))
    assert queues.json()["QueueUrls"] == [QUEUE_URL]


async def test_query_tags_with_nul_are_invalid_parameters(client: httpx.AsyncClient) -> None:
    await client.post("/", content="Action=CreateQueue&QueueName=tagged", headers=FORM)
    for body in (
        f"Action=TagQueue&QueueUrl={QUEUE_URL}&Tag.1.Key=k%00&Tag.1.Value=v",
        f"Action=TagQueue&QueueUrl={QUEUE_URL}&Tag.1.Key=k&Tag.1.Value=%00",
        f"Action=UntagQueue&QueueUrl={QUEUE_URL}&TagKey.1=%00",
        "Action=CreateQueue&QueueName=other&Tag.1.Key=k&Tag.1.Value=%00",
    ):
        assert query_error(await client.post("/", content=body, headers=FORM)) == (
            "InvalidParameterValue"
        ), body


# -- numbers Python's str.isdigit() takes and int() refuses ---------------------

# "²" is a digit to str.isdigit() and not a number to int(); 5,000 digits are past
# int()'s limit on the digits it converts.
NOT_NUMBERS = {"superscript two": "\u00b2", "5,000 digits": "1" * 5_000,
               # str.strip() takes \x1c-\x1f for spaces; int() does not.
               "a separator": "\x1c5"}


@pytest.mark.parametrize("count", NOT_NUMBERS.values(), ids=NOT_NUMBERS.keys())
async def test_a_max_receive_count_that_is_no_number_is_an_invalid_attribute(
    client: httpx.AsyncClient, count: str
) -> None:
    policy = json.dumps({"deadLetterTargetArn": f"arn:aws:sqs:us-east-1:{ACCOUNT}:dlq",
                         "maxReceiveCount": count})
    answer = await client.post("/", **sqs_json("CreateQueue", {
        "QueueName": "redriven", "Attributes": {"RedrivePolicy": policy}}))
    assert json_error(answer) == "InvalidAttributeValue"


def presigned_get(expires: str) -> str:
    now = datetime.now(UTC)
    return "/?" + urlencode({
        "Action": "ListQueues", "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
        "X-Amz-Credential": f"LQ0000000000000000AA/{now:%Y%m%d}/us-east-1/sqs/aws4_request",
        "X-Amz-Date": f"{now:%Y%m%dT%H%M%SZ}", "X-Amz-Expires": expires,
        "X-Amz-SignedHeaders": "host", "X-Amz-Signature": "0" * 64,
    })


@pytest.mark.parametrize("expires", NOT_NUMBERS.values(), ids=NOT_NUMBERS.keys())
@pytest.mark.parametrize("keys", ["open", "keys"])
async def test_a_presigned_expiry_that_is_no_number_is_an_incomplete_signature(
    app_factory: AppClient, expires: str, keys: str
) -> None:
    # Open, the form of a presigned GET is checked (a changing GET needs a whole
    # one); with keys, before anything else.
    client = await app_factory(**({"admin_key": ADMIN_KEY} if keys == "keys" else {}))
    path = presigned_get(expires).replace("ListQueues", "PurgeQueue")
    answer = await client.get(path)
    assert answer.status_code in (400, 403), answer.text[:300]
    assert query_error_any(answer) in (
        "IncompleteSignature", "AWS.SimpleQueueService.UnsupportedOperation")


def query_error_any(response: httpx.Response) -> str:
    return response.text.split("<Code>")[1].split("</Code>")[0]


# Every number a Query or JSON parameter carries, between separator characters.
NUMBERS_IN_PARAMETERS = {
    "SendMessage DelaySeconds": ("SendMessage", {"MessageBody": "x", "DelaySeconds": "\x1c5"}),
    "ReceiveMessage WaitTimeSeconds": ("ReceiveMessage", {"WaitTimeSeconds": "\x1f0"}),
    "ReceiveMessage MaxNumberOfMessages": ("ReceiveMessage", {"MaxNumberOfMessages": "1\x1d"}),
    "ListQueues MaxResults": ("ListQueues", {"MaxResults": "\x1e5"}),
    "SetQueueAttributes VisibilityTimeout": (
        "SetQueueAttributes", {"Attributes": {"VisibilityTimeout": "\x1c30"}}),
    "SetQueueAttributes KmsDataKeyReusePeriodSeconds": (
        "SetQueueAttributes", {"Attributes": {"KmsDataKeyReusePeriodSeconds": "\x1c300"}}),
}


@pytest.mark.parametrize("case", NUMBERS_IN_PARAMETERS.values(),
                         ids=NUMBERS_IN_PARAMETERS.keys())
async def test_a_number_between_separators_is_a_client_error(
    client: httpx.AsyncClient, case: tuple[str, dict[str, Any]]
) -> None:
    made = await client.post("/", **sqs_json("CreateQueue", {"QueueName": "numbers"}))
    assert made.status_code == 200, made.text[:300]
    action, params = case
    params = {**params, "QueueUrl": f"http://leaseq.test/{ACCOUNT}/numbers"}
    if action == "ListQueues":
        params.pop("QueueUrl")
    answer = await client.post("/", **sqs_json(action, params))
    assert json_error(answer) in ("InvalidParameterValue", "InvalidAttributeValue")
