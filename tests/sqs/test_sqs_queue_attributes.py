"""SQS queue attributes as AWS has them, with boto3 on both protocols: what
GetQueueAttributes All returns, the queue policy (AddPermission and
RemovePermission: test_sqs_permissions.py), the encryption settings, CreateQueue's
idempotence, and the refusals, with their codes and messages."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqs_clients import ACCOUNT, refusal, run

ARN = f"arn:aws:sqs:us-east-1:{ACCOUNT}"
STANDARD_ALL = {
    "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed",
    "ApproximateNumberOfMessagesNotVisible", "CreatedTimestamp", "DelaySeconds",
    "LastModifiedTimestamp", "MaximumMessageSize", "MessageRetentionPeriod", "QueueArn",
    "ReceiveMessageWaitTimeSeconds", "VisibilityTimeout", "SqsManagedSseEnabled",
}
FIFO_ALL = STANDARD_ALL | {
    "FifoQueue", "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit",
}
TWO_ENCRYPTIONS = (
    "You can use one type of server-side encryption (SSE) at one time. You can either "
    "enable KMS SSE or SQS SSE."
)


async def everything(sqs: Any, url: str) -> dict[str, str]:
    result = await run(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["All"])
    return dict(result["Attributes"])


async def test_all_is_what_sqs_returns(sqs: Any) -> None:
    standard = (await run(sqs.create_queue, QueueName="plain"))["QueueUrl"]
    attributes = await everything(sqs, standard)
    assert set(attributes) == STANDARD_ALL
    assert attributes["SqsManagedSseEnabled"] == "true"  # SQS's default for a new queue
    fifo = (await run(sqs.create_queue, QueueName="plain.fifo",
                      Attributes={"FifoQueue": "true"}))["QueueUrl"]
    assert set(await everything(sqs, fifo)) == FIFO_ALL

    # The optional ones appear once set.
    dead = (await run(sqs.create_queue, QueueName="dead"))["QueueUrl"]
    policy = json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": "*", "Action": "SQS:SendMessage",
         "Resource": f"{ARN}:plain"}]})
    await run(sqs.set_queue_attributes, QueueUrl=standard, Attributes={
        "Policy": policy, "KmsMasterKeyId": "alias/aws/sqs",
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": f"{ARN}:dead",
                                     "maxReceiveCount": 3}),
    })
    attributes = await everything(sqs, standard)
    assert set(attributes) == STANDARD_ALL | {
        "Policy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds", "RedrivePolicy",
    }
    assert attributes["SqsManagedSseEnabled"] == "false"  # the KMS key replaced it
    # Removed again: gone from All.
    await run(sqs.set_queue_attributes, QueueUrl=standard, Attributes={
        "Policy": "", "KmsMasterKeyId": "", "RedrivePolicy": "",
    })
    assert set(await everything(sqs, standard)) == STANDARD_ALL
    assert (await everything(sqs, dead))["SqsManagedSseEnabled"] == "true"


async def test_the_policy_is_kept_as_given(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="guarded"))["QueueUrl"]
    # Spacing, key order and a single statement as an object: returned as sent.
    policy = ('{ "Statement": {"Effect": "Deny", "Principal": "*", "Action": "sqs:*",'
              '  "Resource": "*"},\n  "Version": "2008-10-17" }')
    await run(sqs.set_queue_attributes, QueueUrl=url, Attributes={"Policy": policy})
    got = await run(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["Policy"])
    assert got["Attributes"] == {"Policy": policy}
    # Given at creation, the same.
    other = (await run(sqs.create_queue, QueueName="guarded-too",
                       Attributes={"Policy": policy}))["QueueUrl"]
    assert (await everything(sqs, other))["Policy"] == policy
    # An empty policy removes it.
    await run(sqs.set_queue_attributes, QueueUrl=url, Attributes={"Policy": ""})
    assert "Policy" not in await everything(sqs, url)


@pytest.mark.parametrize("policy", [
    "not json", "[]", "{}", '{"Statement": []}', '{"Statement": [{"Effect": "Maybe"}]}',
    '{"Statement": "Allow"}', json.dumps({"Statement": {"Effect": "Allow", "Sid": "x" * 9000}}),
    '{"Statement": {"Effect": "Allow", "Sid": "nul\u0000"}}',  # a raw NUL, not an escape
])
async def test_a_policy_sqs_would_refuse(sqs: Any, policy: str) -> None:
    url = (await run(sqs.create_queue, QueueName="guarded"))["QueueUrl"]
    invalid = ("InvalidAttributeValue", "Invalid value for the parameter Policy.")
    assert await refusal(sqs.set_queue_attributes, QueueUrl=url,
                         Attributes={"Policy": policy}) == invalid
    assert await refusal(sqs.create_queue, QueueName="unguarded",
                         Attributes={"Policy": policy}) == invalid
    assert "Policy" not in await everything(sqs, url)


async def test_a_policy_of_more_than_twenty_statements(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="guarded"))["QueueUrl"]
    policy = json.dumps({"Statement": [{"Effect": "Allow", "Sid": f"s{i}"} for i in range(21)]})
    assert await refusal(sqs.set_queue_attributes, QueueUrl=url,
                         Attributes={"Policy": policy}) == (
        "OverLimit", "21 statements were found in the submitted policy, max allowed is 20")


async def test_encryption_settings(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="secret"))["QueueUrl"]
    await run(sqs.set_queue_attributes, QueueUrl=url, Attributes={"KmsMasterKeyId": "alias/k"})
    attributes = await everything(sqs, url)
    assert (attributes["KmsMasterKeyId"], attributes["KmsDataKeyReusePeriodSeconds"],
            attributes["SqsManagedSseEnabled"]) == ("alias/k", "300", "false")
    for period in ("60", "86400"):
        await run(sqs.set_queue_attributes, QueueUrl=url,
                  Attributes={"KmsDataKeyReusePeriodSeconds": period})
        got = await run(sqs.get_queue_attributes, QueueUrl=url,
                        AttributeNames=["KmsDataKeyReusePeriodSeconds"])
        assert got["Attributes"] == {"KmsDataKeyReusePeriodSeconds": period}
    # SQS's own encryption turned on replaces the KMS key.
    await run(sqs.set_queue_attributes, QueueUrl=url, Attributes={"SqsManagedSseEnabled": "true"})
    attributes = await everything(sqs, url)
    assert attributes["SqsManagedSseEnabled"] == "true"
    assert "KmsMasterKeyId" not in attributes and "KmsDataKeyReusePeriodSeconds" not in attributes
    # Off: no encryption claimed at all.
    await run(sqs.set_queue_attributes, QueueUrl=url,
              Attributes={"SqsManagedSseEnabled": "false"})
    assert (await everything(sqs, url))["SqsManagedSseEnabled"] == "false"
    # Given at creation.
    made = (await run(sqs.create_queue, QueueName="secret-too", Attributes={
        "KmsMasterKeyId": "arn:aws:kms:us-east-1:111122223333:key/abc",
        "KmsDataKeyReusePeriodSeconds": "600",
    }))["QueueUrl"]
    attributes = await everything(sqs, made)
    assert (attributes["KmsMasterKeyId"], attributes["KmsDataKeyReusePeriodSeconds"],
            attributes["SqsManagedSseEnabled"]) == (
        "arn:aws:kms:us-east-1:111122223333:key/abc", "600", "false")


@pytest.mark.parametrize(("attributes", "expected"), [
    ({"SqsManagedSseEnabled": "true", "KmsMasterKeyId": "alias/k"},
     ("InvalidAttributeName", TWO_ENCRYPTIONS)),
    ({"SqsManagedSseEnabled": "maybe"}, (
        "InvalidAttributeValue",
        "Invalid value for the parameter SqsManagedSseEnabled. Valid values: true, false.")),
    *[({"KmsDataKeyReusePeriodSeconds": value}, (
        "InvalidAttributeValue", "Invalid value for the parameter KmsDataKeyReusePeriodSeconds."))
      for value in ("59", "86401", "", "five", "3.5", "-60", "9" * 30)],
    ({"KmsMasterKeyId": "k" * 2049},
     ("InvalidAttributeValue", "Invalid value for the parameter KmsMasterKeyId.")),
    ({"KmsMasterKeyId": "alias/\u0000"},
     ("InvalidAttributeValue", "Invalid value for the parameter KmsMasterKeyId.")),
])
async def test_encryption_settings_refused(
    sqs: Any, attributes: dict[str, str], expected: tuple[str, str]
) -> None:
    url = (await run(sqs.create_queue, QueueName="secret"))["QueueUrl"]
    assert await refusal(sqs.set_queue_attributes, QueueUrl=url, Attributes=attributes) == (
        expected)
    assert await refusal(sqs.create_queue, QueueName="not-made", Attributes=attributes) == (
        expected)
    after = await everything(sqs, url)
    assert after["SqsManagedSseEnabled"] == "true" and "KmsMasterKeyId" not in after
    assert (await run(sqs.list_queues)).get("QueueUrls") == [url]


async def test_create_queue_is_idempotent_on_the_attributes_given(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="again"))["QueueUrl"]
    # Defaults given explicitly are the queue's values: the same queue.
    for attributes in ({}, {"VisibilityTimeout": "30"}, {"SqsManagedSseEnabled": "true"},
                       {"DelaySeconds": "0", "MaximumMessageSize": "1048576",
                        "MessageRetentionPeriod": "345600", "RedrivePolicy": ""}):
        assert (await run(sqs.create_queue, QueueName="again",
                          Attributes=attributes))["QueueUrl"] == url
    await run(sqs.set_queue_attributes, QueueUrl=url,
              Attributes={"VisibilityTimeout": "60", "Policy": json.dumps(
                  {"Statement": {"Effect": "Allow"}})})
    # Attributes left out are not compared; those given are.
    assert (await run(sqs.create_queue, QueueName="again"))["QueueUrl"] == url
    assert (await run(sqs.create_queue, QueueName="again",
                      Attributes={"VisibilityTimeout": "60"}))["QueueUrl"] == url
    for name, value in (("VisibilityTimeout", "30"), ("Policy", ""),
                        ("Policy", '{"Statement": {"Effect": "Deny"}}'),
                        ("KmsMasterKeyId", "alias/k"), ("SqsManagedSseEnabled", "false"),
                        ("KmsDataKeyReusePeriodSeconds", "301")):
        assert await refusal(sqs.create_queue, QueueName="again", Attributes={
            "DelaySeconds": "0", name: value}) == (
            "QueueAlreadyExists", "A queue already exists with the same name and a different "
            f"value for attribute {name}")
    # Nothing was changed by the refusals.
    attributes = await everything(sqs, url)
    assert (attributes["VisibilityTimeout"], attributes["SqsManagedSseEnabled"]) == ("60", "true")
    assert "KmsMasterKeyId" not in attributes


async def test_unknown_and_unsupported_attributes(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="names"))["QueueUrl"]
    for call, kwargs in ((sqs.create_queue, {"QueueName": "names"}),
                         (sqs.set_queue_attributes, {"QueueUrl": url})):
        assert await refusal(call, **kwargs, Attributes={"Bogus": "1"}) == (
            "InvalidAttributeName", "Unknown Attribute Bogus.")
        # A FIFO queue's own attributes are unknown to a standard queue.
        assert await refusal(call, **kwargs, Attributes={"ContentBasedDeduplication": "true"}) == (
            "InvalidAttributeName", "Unknown Attribute ContentBasedDeduplication.")
    assert await refusal(sqs.get_queue_attributes, QueueUrl=url,
                         AttributeNames=["Bogus"]) == (
        "InvalidAttributeName", "Unknown Attribute Bogus.")
    assert await refusal(sqs.get_queue_attributes, QueueUrl=url,
                         AttributeNames=["FifoThroughputLimit"]) == (
        "InvalidAttributeName", "Unknown Attribute FifoThroughputLimit.")
    # Named but never set: left out, as SQS leaves unset ones out.
    got = await run(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=[
        "Policy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds", "RedrivePolicy",
        "RedriveAllowPolicy", "SqsManagedSseEnabled"])
    assert got["Attributes"] == {"SqsManagedSseEnabled": "true"}


async def test_redrive_policy_removed_by_an_empty_string(sqs: Any) -> None:
    await run(sqs.create_queue, QueueName="dead")
    url = (await run(sqs.create_queue, QueueName="live", Attributes={
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": f"{ARN}:dead",
                                     "maxReceiveCount": "5"})}))["QueueUrl"]
    assert json.loads((await everything(sqs, url))["RedrivePolicy"]) == {
        "deadLetterTargetArn": f"{ARN}:dead", "maxReceiveCount": 5}
    await run(sqs.set_queue_attributes, QueueUrl=url, Attributes={"RedrivePolicy": ""})
    assert "RedrivePolicy" not in await everything(sqs, url)
    sources = await run(sqs.list_dead_letter_source_queues,
                        QueueUrl=url.replace("live", "dead"))
    assert sources.get("queueUrls", []) == []
