"""AddPermission and RemovePermission as AWS answers them, with boto3 on both
protocols: the Policy text SQS writes (its key order, version, id, and one
principal or action alone, several in a list), what removing leaves, and the
refusals with their codes, words and HTTP status (as recorded against SQS itself)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from sqs_clients import ACCOUNT, run
from sqs_fifo_support import refusal

ARN = f"arn:aws:sqs:us-east-1:{ACCOUNT}"
OTHER = "111122223333"
THIRD = "444455556666"


async def policy(sqs: Any, url: str) -> str | None:
    got = await run(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["Policy"])
    # No policy: JSON answers an empty map, Query no element at all (so no key).
    return got.get("Attributes", {}).get("Policy")


def written(queue: str, *statements: tuple[str, str | list[str], str | list[str]]) -> str:
    """The Policy text SQS writes for (label, principals, actions) statements."""
    return json.dumps({
        "Version": "2008-10-17", "Id": f"{ARN}:{queue}/SQSDefaultPolicy",
        "Statement": [
            {"Sid": sid, "Effect": "Allow", "Principal": {"AWS": principals},
             "Action": actions, "Resource": f"{ARN}:{queue}"}
            for sid, principals, actions in statements
        ],
    }, separators=(",", ":"))


def root(account: str) -> str:
    return f"arn:aws:iam::{account}:root"


def bad_label(label: str, reason: str) -> tuple[str, str, int]:
    return ("InvalidParameterValue",
            f"Value {label} for parameter Label is invalid. Reason: {reason}", 400)


async def test_a_policy_through_its_life(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="shared"))["QueueUrl"]
    await run(sqs.add_permission, QueueUrl=url, Label="cross",
              AWSAccountIds=[ACCOUNT, OTHER], Actions=["ReceiveMessage"])
    # Several accounts: a list, the last given first. One action: alone.
    assert await policy(sqs, url) == written(
        "shared", ("cross", [root(OTHER), root(ACCOUNT)], "SQS:ReceiveMessage"))
    # The last statement removed, the policy goes with it.
    await run(sqs.remove_permission, QueueUrl=url, Label="cross")
    assert await policy(sqs, url) is None

    await run(sqs.add_permission, QueueUrl=url, Label="cross", AWSAccountIds=[ACCOUNT],
              Actions=["ReceiveMessage"])
    assert await policy(sqs, url) == written(
        "shared", ("cross", root(ACCOUNT), "SQS:ReceiveMessage"))
    # A label names one statement, whatever account a second one is for.
    assert await refusal(sqs.add_permission, QueueUrl=url, Label="cross",
                         AWSAccountIds=[OTHER], Actions=["ReceiveMessage"]) == (
        bad_label("cross", "Already exists."))
    await run(sqs.add_permission, QueueUrl=url, Label="cross2", AWSAccountIds=[ACCOUNT],
              Actions=["ReceiveMessage"])
    assert await policy(sqs, url) == written(
        "shared", ("cross", root(ACCOUNT), "SQS:ReceiveMessage"),
        ("cross2", root(ACCOUNT), "SQS:ReceiveMessage"))

    await run(sqs.remove_permission, QueueUrl=url, Label="cross")
    assert await policy(sqs, url) == written(
        "shared", ("cross2", root(ACCOUNT), "SQS:ReceiveMessage"))
    # A label the policy does not have.
    assert await refusal(sqs.remove_permission, QueueUrl=url, Label="cross") == (
        bad_label("cross", "can't find label on existing policy."))
    await run(sqs.remove_permission, QueueUrl=url, Label="cross2")
    assert await policy(sqs, url) is None
    # No policy left at all: SQS words it shorter.
    assert await refusal(sqs.remove_permission, QueueUrl=url, Label="cross2") == (
        bad_label("cross2", "can't find label."))


async def test_several_actions_are_a_list(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="shared"))["QueueUrl"]
    await run(sqs.add_permission, QueueUrl=url, Label="work_2", AWSAccountIds=[OTHER, THIRD],
              Actions=["ReceiveMessage", "DeleteMessage", "*"])
    assert await policy(sqs, url) == written("shared", (
        "work_2", [root(THIRD), root(OTHER)],
        ["SQS:ReceiveMessage", "SQS:DeleteMessage", "SQS:*"],
    ))


async def test_concurrent_permissions_are_all_kept(sqs: Any) -> None:
    # Each AddPermission edits the policy under the queue's lock: none is lost.
    url = (await run(sqs.create_queue, QueueName="busy"))["QueueUrl"]
    labels = [f"p{i}" for i in range(8)]
    await asyncio.gather(*(
        run(sqs.add_permission, QueueUrl=url, Label=label, AWSAccountIds=[OTHER],
            Actions=["SendMessage"])
        for label in labels
    ))
    document = json.loads(await policy(sqs, url) or "{}")
    assert sorted(s["Sid"] for s in document["Statement"]) == labels


async def test_add_permission_to_a_policy_set_by_hand(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="shared"))["QueueUrl"]
    mine = {"Sid": "mine", "Effect": "Deny", "Principal": "*", "Action": "sqs:*",
            "Resource": "*"}
    await run(sqs.set_queue_attributes, QueueUrl=url, Attributes={
        "Policy": json.dumps({"Version": "2012-10-17", "Id": "by-hand", "Statement": mine}),
    })
    await run(sqs.add_permission, QueueUrl=url, Label="read", AWSAccountIds=[OTHER],
              Actions=["GetQueueAttributes"])
    # Its own version and id are kept; the statement joins the one already there.
    document = json.loads(await policy(sqs, url) or "{}")
    assert (document["Version"], document["Id"]) == ("2012-10-17", "by-hand")
    assert [s["Sid"] for s in document["Statement"]] == ["mine", "read"]
    assert await refusal(sqs.add_permission, QueueUrl=url, Label="mine",
                         AWSAccountIds=[OTHER], Actions=["SendMessage"]) == (
        bad_label("mine", "Already exists."))
    assert await refusal(sqs.remove_permission, QueueUrl=url, Label="other") == (
        bad_label("other", "can't find label on existing policy."))


@pytest.mark.parametrize(("label", "accounts", "actions", "expected"), [
    ("l", [OTHER], [], (
        "MissingParameter", "The request must contain the parameter Actions.", 400)),
    ("l", [], ["SendMessage"], (
        "InvalidParameterValue",
        "Value [] for parameter PrincipalId is invalid. Reason: Unable to verify.", 400)),
    ("l", ["12345"], ["SendMessage"], (
        "InvalidParameterValue",
        "Value [12345] for parameter PrincipalId is invalid. Reason: Unable to verify.", 400)),
    ("l", [OTHER], ["SendMessage"] * 8, (
        "OverLimit", "8 Actions were found, maximum allowed is 7.", 403)),
    ("l", [OTHER], ["SendMessage", "DeleteQueue"], (
        "InvalidParameterValue", "Value SQS:DeleteQueue for parameter ActionName is invalid. "
        "Reason: Only the queue owner is allowed to invoke this action.", 400)),
    ("l", [OTHER], ["SendMessageBatch"], (
        "InvalidParameterValue", "Value SQS:SendMessageBatch for parameter ActionName is "
        "invalid. Reason: Please refer to the appropriate WSDL for a list of valid actions.",
        400)),
    ("bad label!", [OTHER], ["SendMessage"], bad_label(
        "bad label!", "Can only include alphanumeric characters, hyphens, or underscores. "
        "1 to 80 in length.")),
    ("x" * 81, [OTHER], ["SendMessage"], bad_label(
        "x" * 81, "Can only include alphanumeric characters, hyphens, or underscores. "
        "1 to 80 in length.")),
])
async def test_add_permission_refused(
    sqs: Any, label: str, accounts: list[str], actions: list[str],
    expected: tuple[str, str, int],
) -> None:
    url = (await run(sqs.create_queue, QueueName="shared"))["QueueUrl"]
    assert await refusal(sqs.add_permission, QueueUrl=url, Label=label,
                         AWSAccountIds=accounts, Actions=actions) == expected
    assert await policy(sqs, url) is None


async def test_permissions_of_a_missing_queue(sqs: Any) -> None:
    url = (await run(sqs.create_queue, QueueName="here"))["QueueUrl"].replace("/here", "/nowhere")
    code, _, status = await refusal(sqs.add_permission, QueueUrl=url, Label="l",
                                    AWSAccountIds=[OTHER], Actions=["SendMessage"])
    assert (code, status) == ("AWS.SimpleQueueService.NonExistentQueue", 400)
    code, _, status = await refusal(sqs.remove_permission, QueueUrl=url, Label="l")
    assert (code, status) == ("AWS.SimpleQueueService.NonExistentQueue", 400)
