"""SQS queue attributes and tags: their names, their checks, and the actions that
read and change them (the Policy's statements: permissions.py)."""

from __future__ import annotations

import json
from typing import Any

from app.auth.access import dead_letter_queues
from app.errors import InvalidRedrivePolicy, QueueError
from app.queue import limits
from app.queue.attributes import REDRIVE_NOT_ALLOWED, THROUGHPUT_NEEDS_GROUP_SCOPE
from app.queue.catalog import KMS_DATA_KEY_REUSE_PERIOD
from app.queue.models import Queue, QueueStats
from app.sqs.context import (
    Context,
    is_fifo_name,
    number_in,
    param_str_list,
    param_str_map,
    queue_of,
)
from app.sqs.errors import SqsError, from_engine

# SQS queue attribute <-> engine attribute, for the plain numbers.
QUEUE_NUMBERS = {
    "VisibilityTimeout": "visibility_timeout",
    "MessageRetentionPeriod": "message_retention",
    "DelaySeconds": "delay",
    "ReceiveMessageWaitTimeSeconds": "receive_wait",
    "MaximumMessageSize": "max_message_bytes",
}
READ_ONLY = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
)
# SQS value <-> engine value, for the FIFO attributes that are not booleans.
DEDUPLICATION_SCOPES = {"queue": "queue", "messageGroup": "message_group"}
THROUGHPUT_LIMITS = {"perQueue": "per_queue", "perMessageGroupId": "per_message_group_id"}
# What only FIFO queues have, SQS's name -> the engine's (FifoQueue itself is fixed
# when a queue is created).
FIFO_ONLY = {
    "ContentBasedDeduplication": "content_based_deduplication",
    "DeduplicationScope": "deduplication_scope",
    "FifoThroughputLimit": "fifo_throughput_limit",
}
FIFO_ATTRIBUTES = ("FifoQueue", *FIFO_ONLY)
# Stored and returned as given, applied to nothing (docs/sqs.md): SQS's name -> the
# engine's.
SETTINGS = {
    "Policy": "policy",
    "KmsMasterKeyId": "kms_master_key_id",
    "KmsDataKeyReusePeriodSeconds": "kms_data_key_reuse_period",
    "SqsManagedSseEnabled": "sqs_managed_sse",
}
ALL_QUEUE_ATTRIBUTES = (
    *READ_ONLY, *QUEUE_NUMBERS, "RedrivePolicy", "RedriveAllowPolicy", *FIFO_ATTRIBUTES,
    *SETTINGS,
)
# The engine's attributes behind each SQS one, to name the one a CreateQueue
# differs in.
ENGINE_NAMES = {
    **{sqs: (ours,) for sqs, ours in (*QUEUE_NUMBERS.items(), *FIFO_ONLY.items(),
                                      *SETTINGS.items())},
    "RedrivePolicy": ("dead_letter_queue", "max_receive_count"),
    "RedriveAllowPolicy": ("redrive_allow_policy", "redrive_sources"),
}
KMS_KEY_ID_CHARS = 2048  # KMS's longest key id, ARN or alias
POLICY_BYTES = 8192  # SQS's quota on a queue policy
POLICY_STATEMENTS = 20  # and on its statements
REDRIVE_PERMISSIONS = ("allowAll", "denyAll", "byQueue")
REDRIVE_SOURCE_ARNS = 10  # SQS's most source queues in a byQueue policy
TWO_ENCRYPTIONS = (
    "You can use one type of server-side encryption (SSE) at one time. You can either "
    "enable KMS SSE or SQS SSE."
)


def wants_fifo(given: dict[str, str]) -> bool:
    """Whether a CreateQueue's attributes ask for a FIFO queue (the value itself is
    checked by queue_changes)."""
    return given.get("FifoQueue", "").strip().lower() == "true"


def _boolean(name: str, value: str) -> bool:
    flag = value.strip().lower()
    if flag not in ("true", "false"):
        raise SqsError(
            "InvalidAttributeValue",
            f"Invalid value for the parameter {name}. Valid values: true, false.",
        )
    return flag == "true"


def _fifo_only(name: str, value: str) -> Any:
    """A FIFO-only attribute's engine value."""
    if name == "ContentBasedDeduplication":
        return _boolean(name, value)
    allowed = DEDUPLICATION_SCOPES if name == "DeduplicationScope" else THROUGHPUT_LIMITS
    if value not in allowed:
        raise SqsError(
            "InvalidAttributeValue",
            f"Invalid value for the parameter {name}. Valid values: {', '.join(allowed)}.",
        )
    return allowed[value]


def queue_changes(
    ctx: Context, given: dict[str, str], *, fifo: bool, creating: bool
) -> dict[str, Any]:
    """SQS queue attributes -> the engine's attribute changes, for a queue of that
    type (`fifo`) being created or changed."""
    changes: dict[str, Any] = {}
    for name, value in given.items():
        if name in QUEUE_NUMBERS:
            number = number_in(value)
            if number is None or number >= 10**10:
                raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
            changes[QUEUE_NUMBERS[name]] = number
        elif name == "RedrivePolicy":
            changes.update(_redrive_policy(ctx, value, fifo=fifo))
        elif name == "FifoQueue":
            if not fifo:
                # SQS: a standard queue has no such attribute, not even "false",
                # and no queue changes its type.
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
            wanted = _boolean(name, value)
            if not wanted:
                raise SqsError(
                    "InvalidAttributeValue",
                    "Invalid value for the parameter FifoQueue. Reason: Modifying queue type "
                    "is not supported.",
                )
            if creating:
                changes["fifo"] = True
        elif name in FIFO_ONLY:
            if not fifo:
                raise SqsError(
                    "InvalidAttributeName",
                    f"Unknown Attribute {name}." if name == "ContentBasedDeduplication"
                    else f"You can specify the {name} only when FifoQueue is set to true.",
                )
            changes[FIFO_ONLY[name]] = _fifo_only(name, value)
        elif name in SETTINGS:
            changes[SETTINGS[name]] = _setting(name, value)
        elif name == "RedriveAllowPolicy":
            changes.update(_redrive_allow_policy(ctx, value))
        else:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name[:100]}.")
    _one_encryption(changes)
    return changes


def _invalid(name: str) -> SqsError:
    return SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")


def _setting(name: str, value: str) -> Any:
    """A stored setting's engine value; "" removes the policy or the KMS key (SQS)."""
    if name == "SqsManagedSseEnabled":
        return _boolean(name, value)
    if name == "KmsDataKeyReusePeriodSeconds":
        low, high = KMS_DATA_KEY_REUSE_PERIOD
        number = number_in(value)
        if number is None or not low <= number <= high:
            raise _invalid(name)
        return number
    if not value.strip():
        return None
    # PostgreSQL's text refuses NUL and lone surrogates: refused here, not as a 500.
    if limits.NOT_TEXT_CHAR.search(value):
        raise _invalid(name)
    if name == "KmsMasterKeyId":
        if len(value) > KMS_KEY_ID_CHARS:
            raise _invalid(name)
        return value
    check_policy(value)
    return value  # as given: a Get returns the very text


def check_policy(text: str) -> None:
    """A policy SQS would take: a JSON object of 1 to 20 statements, each allowing or
    denying. Checked, not interpreted: nothing here enforces it."""
    try:
        policy = json.loads(text)
    except (ValueError, RecursionError):  # nested past the recursion limit
        policy = None
    statements = policy.get("Statement") if isinstance(policy, dict) else None
    if isinstance(statements, dict):
        statements = [statements]
    if (
        len(text.encode()) > POLICY_BYTES
        or not isinstance(statements, list)
        or not statements
        or not all(isinstance(s, dict) and s.get("Effect") in ("Allow", "Deny")
                   for s in statements)
    ):
        raise _invalid("Policy")
    if len(statements) > POLICY_STATEMENTS:
        raise SqsError(
            "OverLimit",
            f"{len(statements)} statements were found in the submitted policy, max allowed "
            f"is {POLICY_STATEMENTS}",
        )


def _redrive_allow_policy(ctx: Context, value: str) -> dict[str, Any]:
    """SQS's RedriveAllowPolicy -> its text, kept as given, and the names of the
    queues it lets name this one as their dead-letter queue (None: every queue).
    A source ARN of another account or region is kept in the text and matches no
    queue here. "" removes the policy, as SQS does."""
    if not value.strip():
        return {"redrive_allow_policy": None, "redrive_sources": None}
    try:
        policy = json.loads(value)
    except (ValueError, RecursionError):  # nested past the recursion limit
        policy = None
    arns = policy.get("sourceQueueArns") if isinstance(policy, dict) else None
    if (
        not isinstance(policy, dict)
        or policy.get("redrivePermission") not in REDRIVE_PERMISSIONS
        or not set(policy) <= {"redrivePermission", "sourceQueueArns"}
        or limits.NOT_TEXT_CHAR.search(value)
        or (arns is not None and not (
            isinstance(arns, list) and all(isinstance(arn, str) for arn in arns)))
    ):
        raise SqsError(
            "InvalidAttributeValue",
            "Invalid value for the parameter RedriveAllowPolicy. Reason: Amazon SQS can't "
            "create the redrive allow policy, as it\u2019s in an unsupported format.",
        )
    permission = policy["redrivePermission"]
    reason = None
    if arns is not None and permission != "byQueue":
        reason = ("To specify one or more source queue ARNs, you must set redrivePermission "
                  "to byQueue.")
    elif permission == "byQueue" and not arns:
        reason = ("When you specify the byQueue permission type, you must also specify one "
                  "or more sourceQueueArns values.")
    elif arns is not None and len(arns) > REDRIVE_SOURCE_ARNS:
        reason = (f"The maximum number of source queue ARNs you can specify is "
                  f"{REDRIVE_SOURCE_ARNS}.")
    if reason is not None:
        raise SqsError(
            "InvalidParameterValue",
            f"Value {value[:1000]} for parameter RedriveAllowPolicy is invalid. Reason: "
            f"Amazon SQS can't create the redrive allow policy. {reason}",
        )
    sources: tuple[str, ...] | None = None
    if permission != "allowAll":
        prefix = ctx.arn("")
        sources = tuple(arn.removeprefix(prefix) for arn in arns or ()
                        if arn.startswith(prefix) and len(arn) > len(prefix))
    return {"redrive_allow_policy": value, "redrive_sources": sources}


def _one_encryption(changes: dict[str, Any]) -> None:
    """SQS's rule: a queue is encrypted by SQS's own keys or by a KMS key, not both;
    choosing one turns the other off."""
    key = changes.get("kms_master_key_id")
    sqs_managed = changes.get("sqs_managed_sse")
    if key is not None and sqs_managed:
        raise SqsError("InvalidAttributeName", TWO_ENCRYPTIONS)
    if key is not None:
        changes["sqs_managed_sse"] = False
    elif sqs_managed:
        changes["kms_master_key_id"] = None


def _redrive_policy(ctx: Context, value: str, *, fifo: bool) -> dict[str, Any]:
    if value.strip() in ("", "{}"):
        return {"dead_letter_queue": None, "max_receive_count": None}
    try:
        policy = json.loads(value)
    except (ValueError, RecursionError):  # nested past the recursion limit
        policy = None
    if not isinstance(policy, dict) or set(policy) != {"deadLetterTargetArn", "maxReceiveCount"}:
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: Redrive policy needs "
            "deadLetterTargetArn and maxReceiveCount.",
        )
    count = policy["maxReceiveCount"]
    if isinstance(count, str):
        count = number_in(count)
    if not isinstance(count, int) or isinstance(count, bool):
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: maxReceiveCount must be "
            "an integer.",
        )
    target = policy["deadLetterTargetArn"]
    parts = target.split(":") if isinstance(target, str) else []
    if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or not parts[5]:
        raise SqsError(  # SQS's words, as recorded
            "InvalidParameterValue",
            f"Value {value[:1000]} for parameter RedrivePolicy is invalid. Reason: Invalid "
            f"value for deadLetterTargetArn.",
        )
    dead_letter_queue = ctx.name_from_arn(target, "deadLetterTargetArn")
    if is_fifo_name(dead_letter_queue) != fifo:
        raise SqsError(
            "InvalidParameterValue",
            # SQS's words, its two full stops included.
            f"Value {value[:1000]} for parameter RedrivePolicy is invalid. Reason: Dead-letter "
            f"queue must be same type of queue as the source..",
        )
    return {"dead_letter_queue": dead_letter_queue, "max_receive_count": count}


def attribute_error(exc: QueueError) -> SqsError:
    error = from_engine(exc)
    if exc.detail == REDRIVE_NOT_ALLOWED:
        return SqsError(
            "InvalidParameterValue",
            "Value for parameter RedrivePolicy is invalid. Reason: The dead-letter queue's "
            "RedriveAllowPolicy does not allow this queue as a source queue.",
        )
    if exc.detail == THROUGHPUT_NEEDS_GROUP_SCOPE:
        return SqsError(
            "InvalidAttributeValue",
            "Invalid value for the parameter FifoThroughputLimit. Reason: The "
            "perMessageGroupId value is allowed only when the value for DeduplicationScope "
            "is messageGroup.",
        )
    if error.name == "InvalidParameterValue" and not isinstance(exc, InvalidRedrivePolicy):
        return SqsError("InvalidAttributeValue", error.message)
    return error


def queue_attributes(ctx: Context, queue: Queue, stats: QueueStats) -> dict[str, str]:
    """Every attribute GetQueueAttributes knows, by its SQS name."""
    attrs = queue.attributes
    values = {
        "ApproximateNumberOfMessages": str(stats.visible),
        "ApproximateNumberOfMessagesNotVisible": str(stats.in_flight),
        "ApproximateNumberOfMessagesDelayed": str(stats.delayed),
        "CreatedTimestamp": str(int(queue.created_at.timestamp())),
        "LastModifiedTimestamp": str(int(queue.updated_at.timestamp())),
        "QueueArn": ctx.arn(queue.name),
        **{sqs: str(getattr(attrs, ours)) for sqs, ours in QUEUE_NUMBERS.items()},
        "SqsManagedSseEnabled": "true" if attrs.sqs_managed_sse else "false",
    }
    # What SQS returns only once set.
    if attrs.policy is not None:
        values["Policy"] = attrs.policy
    if attrs.redrive_allow_policy is not None:
        values["RedriveAllowPolicy"] = attrs.redrive_allow_policy
    if attrs.kms_master_key_id is not None:
        values["KmsMasterKeyId"] = attrs.kms_master_key_id
        values["KmsDataKeyReusePeriodSeconds"] = str(attrs.kms_data_key_reuse_period)
    if attrs.fifo:
        values.update({
            "FifoQueue": "true",
            "ContentBasedDeduplication": "true" if attrs.content_based_deduplication
            else "false",
            "DeduplicationScope": _sqs_value(DEDUPLICATION_SCOPES, attrs.deduplication_scope),
            "FifoThroughputLimit": _sqs_value(THROUGHPUT_LIMITS, attrs.fifo_throughput_limit),
        })
    if attrs.dead_letter_queue is not None:
        values["RedrivePolicy"] = json.dumps(
            {
                "deadLetterTargetArn": ctx.arn(attrs.dead_letter_queue),
                "maxReceiveCount": attrs.max_receive_count,
            }
        )
    return values


def _sqs_value(values: dict[str, str], ours: str) -> str:
    """An engine value by SQS's spelling (the engine only stores those it knows)."""
    return {engine: sqs for sqs, engine in values.items()}.get(ours, ours)


async def get_queue_attributes(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = queue_of(ctx, params)
    wanted = param_str_list(params, "AttributeNames")
    for attribute in wanted:
        if attribute != "All" and attribute not in ALL_QUEUE_ATTRIBUTES:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {attribute[:100]}.")
    queue, stats = await ctx.service.queues.get_queue(name)
    if not queue.attributes.fifo:
        for attribute in wanted:
            if attribute in FIFO_ATTRIBUTES:  # SQS: asked of a standard queue, unknown
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {attribute}.")
    values = queue_attributes(ctx, queue, stats)
    if "All" not in wanted:
        values = {k: v for k, v in values.items() if k in wanted}
    # As SQS answers today, an empty map is left out.
    return {"Attributes": values} if values else {}


async def set_queue_attributes(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = queue_of(ctx, params)
    given = param_str_map(params, "Attributes")
    for attribute in given:
        if attribute in READ_ONLY:
            raise SqsError("InvalidAttributeName", f"Attribute {attribute} is read-only.")
    changes = queue_changes(ctx, given, fifo=is_fifo_name(name), creating=False)
    ctx.needs.require(ctx.principal, "dead_letter_queue", dead_letter_queues(changes))
    try:
        await ctx.service.queues.update_queue(name, changes)
    except QueueError as exc:
        raise attribute_error(exc) from exc
    return {}


def check_tags(*texts: str) -> None:
    # PostgreSQL refuses NUL and lone surrogates in tags (jsonb) and in the keys
    # to remove (text): refused here as a bad parameter, not there as an error 500.
    for text in texts:
        if limits.NOT_TEXT_CHAR.search(text):
            raise SqsError(
                "InvalidParameterValue",
                "Invalid characters found in a tag key or value. Valid characters are #x9 | "
                "#xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF.",
            )


async def tag_queue(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = queue_of(ctx, params)
    tags = param_str_map(params, "Tags")
    if not tags:
        raise SqsError("MissingParameter", "The request must contain the parameter Tags.")
    check_tags(*tags, *tags.values())
    await ctx.service.queues.change_tags(name, add=tags)
    return {}


async def untag_queue(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = queue_of(ctx, params)
    keys = param_str_list(params, "TagKeys")
    if not keys:
        raise SqsError("MissingParameter", "The request must contain the parameter TagKeys.")
    check_tags(*keys)
    await ctx.service.queues.change_tags(name, remove=keys)
    return {}


async def list_queue_tags(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    tags = await ctx.service.queues.queue_tags(queue_of(ctx, params))
    return {"Tags": tags} if tags else {}
