"""SQS queue permissions: AddPermission and RemovePermission, which edit the queue's
Policy as SQS does. The policy is stored and returned, never enforced: API keys and
their scopes decide who may do what (docs/sqs.md)."""

from __future__ import annotations

import json
import re
from typing import Any

from app.queue.models import QueueAttributes
from app.sqs.attributes import check_policy
from app.sqs.context import Context, param_required, param_str_list, queue_of
from app.sqs.errors import SqsError

# AddPermission: what another account may be let do (SQS's list), and what only the
# queue's owner may ever do. The policy it writes is stored, not enforced (docs/sqs.md).
GRANTABLE = (
    "*", "ChangeMessageVisibility", "DeleteMessage", "GetQueueAttributes", "GetQueueUrl",
    "ListDeadLetterSourceQueues", "PurgeQueue", "ReceiveMessage", "SendMessage",
)
OWNER_ONLY = (
    "AddPermission", "CancelMessageMoveTask", "CreateQueue", "DeleteQueue",
    "ListMessageMoveTasks", "ListQueues", "ListQueueTags", "RemovePermission",
    "SetQueueAttributes", "StartMessageMoveTask", "TagQueue", "UntagQueue",
)
PERMISSION_ACTIONS = 7  # SQS's most actions in one AddPermission
LABEL = re.compile(r"[A-Za-z0-9_-]{1,80}")
ACCOUNT_ID = re.compile(r"[0-9]{12}")


def _label(params: dict[str, Any]) -> str:
    label = param_required(params, "Label")
    if not LABEL.fullmatch(label):
        raise SqsError(
            "InvalidParameterValue",
            f"Value {label[:100]} for parameter Label is invalid. Reason: Can only include "
            "alphanumeric characters, hyphens, or underscores. 1 to 80 in length.",
        )
    return label


def _granted(params: dict[str, Any]) -> tuple[list[str], list[str]]:
    """AddPermission's (account ids, actions), checked in SQS's order. The Query
    protocol names them AWSAccountId.N and ActionName.N."""
    actions = param_str_list(params, "Actions") or param_str_list(params, "ActionName")
    accounts = param_str_list(params, "AWSAccountIds") or param_str_list(params, "AWSAccountId")
    if not actions:
        raise SqsError("MissingParameter", "The request must contain the parameter Actions.")
    for account in accounts or [""]:
        if not ACCOUNT_ID.fullmatch(account):
            shown = f"[{account[:20]}]" if account else "[]"
            raise SqsError(
                "InvalidParameterValue",
                f"Value {shown} for parameter PrincipalId is invalid. Reason: Unable to verify.",
            )
    if len(actions) > PERMISSION_ACTIONS:
        raise SqsError(
            "OverLimit",
            f"{len(actions)} Actions were found, maximum allowed is {PERMISSION_ACTIONS}.",
        )
    for action in actions:
        if action in OWNER_ONLY:
            reason = "Only the queue owner is allowed to invoke this action."
        elif action not in GRANTABLE:
            reason = "Please refer to the appropriate WSDL for a list of valid actions."
        else:
            continue
        raise SqsError(
            "InvalidParameterValue",
            f"Value SQS:{action[:100]} for parameter ActionName is invalid. Reason: {reason}",
        )
    return accounts, actions


def _one_or_many(values: list[str]) -> str | list[str]:
    # How SQS writes a statement's principals and actions: one alone, not in a list.
    return values[0] if len(values) == 1 else values


def _principals(accounts: list[str]) -> str | list[str]:
    # SQS lists several accounts last given first (as recorded against SQS itself).
    return _one_or_many([f"arn:aws:iam::{a}:root" for a in reversed(accounts)])


def _statements(policy: str | None) -> tuple[dict[str, Any], list[Any]]:
    """The queue's policy document ({} when it has none) and its statements as a
    list (a policy may give a single one as an object)."""
    if policy is None:
        return {}, []
    document = json.loads(policy)  # checked by check_policy when it was set
    statements = document.get("Statement", [])
    return document, statements if isinstance(statements, list) else [statements]


def _policy_text(document: dict[str, Any]) -> str:
    # Compact, as SQS writes the policies it makes; the rest of the text as it was.
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False)


async def add_permission(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = queue_of(ctx, params)
    label = _label(params)
    accounts, actions = _granted(params)
    statement = {
        "Sid": label,
        "Effect": "Allow",
        "Principal": {"AWS": _principals(accounts)},
        "Action": _one_or_many([f"SQS:{a}" for a in actions]),
        "Resource": ctx.arn(name),
    }

    def add(current: QueueAttributes) -> dict[str, Any]:
        document, statements = _statements(current.policy)
        if any(isinstance(s, dict) and s.get("Sid") == label for s in statements):
            raise SqsError(
                "InvalidParameterValue",
                f"Value {label} for parameter Label is invalid. Reason: Already exists.",
            )
        if not document:
            # SQS's own policies keep the old policy language version.
            document = {"Version": "2008-10-17", "Id": f"{ctx.arn(name)}/SQSDefaultPolicy"}
        policy = _policy_text({**document, "Statement": [*statements, statement]})
        check_policy(policy)  # SQS's quotas hold for the policy it writes too
        return {"policy": policy}

    await ctx.service.queues.edit_queue(name, add)
    return {}


async def remove_permission(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = queue_of(ctx, params)
    label = param_required(params, "Label")

    def remove(current: QueueAttributes) -> dict[str, Any]:
        document, statements = _statements(current.policy)
        kept = [s for s in statements if not (isinstance(s, dict) and s.get("Sid") == label)]
        if len(kept) == len(statements):
            # SQS words it apart for a queue with no policy at all.
            where = " on existing policy" if document else ""
            raise SqsError(
                "InvalidParameterValue",
                f"Value {label[:100]} for parameter Label is invalid. Reason: can't find "
                f"label{where}.",
            )
        # The last statement gone, so is the policy (a Get leaves it out).
        if not kept:
            return {"policy": None}
        return {"policy": _policy_text({**document, "Statement": kept})}

    await ctx.service.queues.edit_queue(name, remove)
    return {}
