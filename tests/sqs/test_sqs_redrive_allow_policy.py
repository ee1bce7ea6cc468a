"""RedriveAllowPolicy through the SQS door, with boto3 on both protocols: stored
and returned as given, refused in SQS's words when malformed, and enforced when a
queue names a dead-letter queue (by SQS and by the REST API alike)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from sqs_clients import ACCOUNT, PROTOCOLS, client, run
from sqs_fifo_support import refused

ARN = f"arn:aws:sqs:us-east-1:{ACCOUNT}"
NOT_ALLOWED = (
    "InvalidParameterValue",
    "Value for parameter RedrivePolicy is invalid. Reason: The dead-letter queue's "
    "RedriveAllowPolicy does not allow this queue as a source queue.",
)
UNSUPPORTED = (
    "InvalidAttributeValue",
    "Invalid value for the parameter RedriveAllowPolicy. Reason: Amazon SQS can't create "
    "the redrive allow policy, as it\u2019s in an unsupported format.",
)


@pytest.fixture(params=PROTOCOLS)
def sqs(request: pytest.FixtureRequest, served: tuple[str, Any]) -> Any:
    return client(served[0], request.param)


async def _queue(sqs: Any, name: str, **attributes: str) -> str:
    url: str = (await run(sqs.create_queue, QueueName=name, Attributes=attributes))["QueueUrl"]
    return url


async def _allow_policy(sqs: Any, url: str) -> str | None:
    got = await run(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["All"])
    value: str | None = got["Attributes"].get("RedriveAllowPolicy")
    return value


def _redrive(dead_letter_queue: str) -> str:
    return json.dumps({"deadLetterTargetArn": f"{ARN}:{dead_letter_queue}",
                       "maxReceiveCount": 3})


async def test_stored_returned_and_removed(sqs: Any) -> None:
    by_queue = json.dumps({"redrivePermission": "byQueue",
                           "sourceQueueArns": [f"{ARN}:a", "arn:aws:sqs:eu-west-1:1:b"]})
    url = await _queue(sqs, "dlq", RedriveAllowPolicy=by_queue)
    assert await _allow_policy(sqs, url) == by_queue  # the very text given
    got = await run(sqs.get_queue_attributes, QueueUrl=url,
                    AttributeNames=["RedriveAllowPolicy"])
    assert got["Attributes"] == {"RedriveAllowPolicy": by_queue}
    # Created again with the same policy: the same queue; with another: refused.
    assert await _queue(sqs, "dlq", RedriveAllowPolicy=by_queue) == url
    assert await refused(sqs.create_queue, QueueName="dlq",
                         Attributes={"RedriveAllowPolicy": '{"redrivePermission":"denyAll"}'}
                         ) == ("QueueAlreadyExists",
                               "A queue already exists with the same name and a different "
                               "value for attribute RedriveAllowPolicy")
    for permission in ("allowAll", "denyAll"):
        text = json.dumps({"redrivePermission": permission})
        await run(sqs.set_queue_attributes, QueueUrl=url,
                  Attributes={"RedriveAllowPolicy": text})
        assert await _allow_policy(sqs, url) == text
    await run(sqs.set_queue_attributes, QueueUrl=url, Attributes={"RedriveAllowPolicy": ""})
    assert await _allow_policy(sqs, url) is None
    # Asked for by name and unset: no map at all, as SQS leaves empty ones out.
    got = await run(sqs.get_queue_attributes, QueueUrl=url,
                    AttributeNames=["RedriveAllowPolicy"])
    assert "Attributes" not in got


async def test_malformed_policies(sqs: Any) -> None:
    url = await _queue(sqs, "dlq")
    for text in ("badjson", "[]", "{}", '{"redrivePermission": "dummy"}', "444",
                 '{"redrivePermission": "allowAll", "dummy": "value"}',
                 '{"redrivePermission": "byQueue", "sourceQueueArns": "arn:aws:sqs"}',
                 '{"redrivePermission": "byQueue", "sourceQueueArns": [{"dummy": 1}]}'):
        assert await refused(sqs.set_queue_attributes, QueueUrl=url,
                             Attributes={"RedriveAllowPolicy": text}) == UNSUPPORTED, text
        assert await refused(sqs.create_queue, QueueName="other",
                             Attributes={"RedriveAllowPolicy": text}) == UNSUPPORTED, text

    def reason(text: str, why: str) -> tuple[str, str]:
        return ("InvalidParameterValue",
                f"Value {text} for parameter RedriveAllowPolicy is invalid. Reason: Amazon "
                f"SQS can't create the redrive allow policy. {why}")

    need_arns = ("When you specify the byQueue permission type, you must also specify one "
                 "or more sourceQueueArns values.")
    only_by_queue = ("To specify one or more source queue ARNs, you must set "
                     "redrivePermission to byQueue.")
    eleven = json.dumps({"redrivePermission": "byQueue",
                         "sourceQueueArns": [f"{ARN}:x{i}" for i in range(11)]})
    for text, why in (
        ('{"redrivePermission":"byQueue"}', need_arns),
        ('{"redrivePermission":"byQueue","sourceQueueArns":[]}', need_arns),
        (f'{{"redrivePermission":"allowAll","sourceQueueArns":["{ARN}:x"]}}', only_by_queue),
        (f'{{"redrivePermission":"denyAll","sourceQueueArns":["{ARN}:x"]}}', only_by_queue),
        (eleven, "The maximum number of source queue ARNs you can specify is 10."),
    ):
        assert await refused(sqs.set_queue_attributes, QueueUrl=url,
                             Attributes={"RedriveAllowPolicy": text}) == reason(text, why)
    # Ten are fine; nothing was stored by the refusals.
    ten = json.dumps({"redrivePermission": "byQueue",
                      "sourceQueueArns": [f"{ARN}:x{i}" for i in range(10)]})
    assert await _allow_policy(sqs, url) is None
    await run(sqs.set_queue_attributes, QueueUrl=url, Attributes={"RedriveAllowPolicy": ten})
    assert await _allow_policy(sqs, url) == ten


async def test_enforced_when_a_queue_names_its_dead_letter_queue(sqs: Any) -> None:
    dlq = await _queue(sqs, "dlq", RedriveAllowPolicy='{"redrivePermission": "denyAll"}')
    assert await refused(sqs.create_queue, QueueName="source",
                         Attributes={"RedrivePolicy": _redrive("dlq")}) == NOT_ALLOWED
    source = await _queue(sqs, "source")
    assert await refused(sqs.set_queue_attributes, QueueUrl=source,
                         Attributes={"RedrivePolicy": _redrive("dlq")}) == NOT_ALLOWED

    # byQueue: the queues named, by their ARN in this region and account, only.
    await run(sqs.set_queue_attributes, QueueUrl=dlq, Attributes={"RedriveAllowPolicy": json.dumps(
        {"redrivePermission": "byQueue",
         "sourceQueueArns": [f"{ARN}:source", "arn:aws:sqs:eu-west-1:111111111111:other"]})})
    await run(sqs.set_queue_attributes, QueueUrl=source,
              Attributes={"RedrivePolicy": _redrive("dlq")})
    other = await _queue(sqs, "other")
    assert await refused(sqs.set_queue_attributes, QueueUrl=other,
                         Attributes={"RedrivePolicy": _redrive("dlq")}) == NOT_ALLOWED
    # A policy refused changed nothing; removing a redrive policy is always allowed.
    got = await run(sqs.get_queue_attributes, QueueUrl=other, AttributeNames=["All"])
    assert "RedrivePolicy" not in got["Attributes"]
    await run(sqs.set_queue_attributes, QueueUrl=source, Attributes={"RedrivePolicy": ""})

    # allowAll, or no policy at all: any queue.
    await run(sqs.set_queue_attributes, QueueUrl=dlq,
              Attributes={"RedriveAllowPolicy": '{"redrivePermission": "allowAll"}'})
    await run(sqs.set_queue_attributes, QueueUrl=other,
              Attributes={"RedrivePolicy": _redrive("dlq")})
    await run(sqs.set_queue_attributes, QueueUrl=dlq, Attributes={"RedriveAllowPolicy": ""})
    await _queue(sqs, "third", RedrivePolicy=_redrive("dlq"))
    # Denying afterwards leaves the queues that already name it as they are (SQS's
    # policy is checked when a redrive policy is set).
    await run(sqs.set_queue_attributes, QueueUrl=dlq,
              Attributes={"RedriveAllowPolicy": '{"redrivePermission": "denyAll"}'})
    sources = await run(sqs.list_dead_letter_source_queues, QueueUrl=dlq)
    assert sorted(url.rsplit("/", 1)[1] for url in sources["queueUrls"]) == ["other", "third"]


async def test_enforced_on_the_rest_api(sqs: Any, served: tuple[str, Any]) -> None:
    await _queue(sqs, "dlq", RedriveAllowPolicy=json.dumps(
        {"redrivePermission": "byQueue", "sourceQueueArns": [f"{ARN}:allowed"]}))
    async with httpx.AsyncClient(base_url=served[0]) as rest:
        refused_rest = await rest.post("/v1/queues", json={
            "name": "denied", "dead_letter_queue": "dlq", "max_receive_count": 2})
        assert refused_rest.status_code == 400
        assert refused_rest.json()["code"] == "invalid_redrive_policy"
        created = await rest.post("/v1/queues", json={
            "name": "allowed", "dead_letter_queue": "dlq", "max_receive_count": 2})
        assert created.status_code == 201, created.text


async def test_a_redrive_policy_naming_no_arn(sqs: Any) -> None:
    url = await _queue(sqs, "source")
    for target in ("dead", "arn:aws:sqs:us-east-1", 5):
        policy = json.dumps({"deadLetterTargetArn": target, "maxReceiveCount": 3})
        assert await refused(sqs.set_queue_attributes, QueueUrl=url,
                             Attributes={"RedrivePolicy": policy}) == (
            "InvalidParameterValue",
            f"Value {policy} for parameter RedrivePolicy is invalid. Reason: Invalid value for "
            f"deadLetterTargetArn.")


async def test_empty_batch_lists_are_left_out(sqs: Any) -> None:
    url = await _queue(sqs, "batches")
    sent = await run(sqs.send_message_batch, QueueUrl=url,
                     Entries=[{"Id": "a", "MessageBody": "x"}])
    assert [e["Id"] for e in sent["Successful"]] == ["a"]
    assert "Failed" not in sent  # as SQS answers now: no empty list
    failed = await run(sqs.delete_message_batch, QueueUrl=url,
                       Entries=[{"Id": "b", "ReceiptHandle": "garbled"}])
    assert [e["Id"] for e in failed["Failed"]] == ["b"]
    assert "Successful" not in failed
