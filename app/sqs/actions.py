"""The action table: every SQS action, on the JSON protocol's shapes, mapped onto
QueueService and Redrives. Validation here is of SQS's request shapes only
(names, types, batch rules); every queue rule is the engine's."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit

from app.auth.scopes import ACTIONS as SCOPE_ACTIONS
from app.auth.scopes import EVERYONE, Principal
from app.errors import InvalidReceiptHandle, LeaseLost, QueueError, QueueNotFound
from app.queue import limits
from app.queue.models import EntryError, MessageAttribute, OutgoingMessage, Queue, QueueStats
from app.queue.redrive import Redrives
from app.queue.service import QueueService
from app.sqs import md5
from app.sqs.errors import SqsError, from_engine

BATCH_MAX = 10
BATCH_BYTES = 1_048_576  # SQS: the sum of a SendMessageBatch's messages
LIST_QUEUES_MAX = 1000
_BATCH_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_DATA_TYPE = re.compile(r"^(String|Number|Binary)(\.[^\x00-\x1f]{1,})?$")
_ATTRIBUTE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,256}$")
# The characters SQS accepts in bodies and string values (XML's).
_INVALID_CHARS = limits.NOT_TEXT_CHAR

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
ALL_QUEUE_ATTRIBUTES = (*READ_ONLY, *QUEUE_NUMBERS, "RedrivePolicy")
# Named by SQS, not supported here: never set; a Get leaves them out (as unset).
NOT_SUPPORTED = (
    "Policy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds", "SqsManagedSseEnabled",
    "RedriveAllowPolicy", "FifoQueue", "ContentBasedDeduplication", "DeduplicationScope",
    "FifoThroughputLimit",
)
SYSTEM_ATTRIBUTES = (
    "SenderId", "SentTimestamp", "ApproximateReceiveCount", "ApproximateFirstReceiveTimestamp",
)
# Message system attributes of FIFO queues and tracing: never present here.
SYSTEM_NOT_PRESENT = (
    "AWSTraceHeader", "MessageDeduplicationId", "MessageGroupId", "SequenceNumber",
    "SqsManagedSseEnabled", "DeadLetterQueueSourceArn",
)
FIFO_NOT_SUPPORTED = "FIFO queues are not supported by leaseq yet."


@dataclass
class Context:
    service: QueueService
    redrives: Redrives
    base_url: str  # scheme://host[:port], from the request
    account: str
    region: str
    sender_id: str
    gone: asyncio.Event | None = None
    path_queue: str | None = None  # the queue of a request posted to its queue URL
    principal: Principal = EVERYONE
    need: str = "admin"  # the scope action this request's action needs (SCOPES)

    def queue_url(self, name: str) -> str:
        return f"{self.base_url}/{self.account}/{name}"

    def arn(self, name: str) -> str:
        return f"arn:aws:sqs:{self.region}:{self.account}:{name}"

    def name_from_arn(self, arn: str, parameter: str) -> str:
        parts = arn.split(":")
        if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or not parts[5]:
            raise SqsError("InvalidParameterValue", f"{parameter} is not an SQS queue ARN.")
        if parts[4] != self.account:
            raise SqsError("QueueDoesNotExist", f"The queue {arn} does not exist.")
        return parts[5]


# -- parameters ---------------------------------------------------------------


def _str(params: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = params.get(name)
    if value is None:
        if required:
            raise SqsError("MissingParameter", f"The request must contain the parameter {name}.")
        return None
    if not isinstance(value, str):
        raise SqsError("InvalidParameterValue", f"{name} must be a string.")
    return value


def _required(params: dict[str, Any], name: str) -> str:
    value = _str(params, name, required=True)
    assert value is not None
    return value


def _int(params: dict[str, Any], name: str) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool):
        raise SqsError("InvalidParameterValue", f"{name} must be an integer.")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,18}", value.strip()):
        return int(value)
    raise SqsError(
        "InvalidParameterValue", f"Value {str(value)[:40]} for parameter {name} is invalid."
    )


def _ranged(params: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = _int(params, name)
    if value is not None and not low <= value <= high:
        raise SqsError(
            "InvalidParameterValue",
            f"Value {value} for parameter {name} is invalid. Reason: Must be between "
            f"{low} and {high}, if provided.",
        )
    return value


def _str_list(params: dict[str, Any], name: str) -> list[str]:
    value = params.get(name)
    if value is None or value == "":  # "": botocore's Query form of an empty list
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SqsError("InvalidParameterValue", f"{name} must be a list of strings.")
    return value


def _str_map(params: dict[str, Any], name: str) -> dict[str, str]:
    value = params.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise SqsError("InvalidParameterValue", f"{name} must map names to strings.")
    return value


def _queue(ctx: Context, params: dict[str, Any]) -> str:
    """The queue a request names: its QueueUrl, else the URL it was posted to."""
    url = _str(params, "QueueUrl")
    if url is None:
        if ctx.path_queue is not None:
            ctx.principal.require(ctx.need, ctx.path_queue)
            return ctx.path_queue
        raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
    parts = [p for p in urlsplit(url).path.split("/") if p]
    if len(parts) != 2 or parts[0] != ctx.account or not limits.is_queue_name(parts[1]):
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    ctx.principal.require(ctx.need, parts[1])
    return parts[1]


def _check_text(text: str, what: str) -> None:
    if _INVALID_CHARS.search(text):
        raise SqsError(
            "InvalidMessageContents",
            f"Invalid characters found in {what}. Valid characters are #x9 | #xA | #xD | "
            f"#x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF.",
        )


def _ms(moment: datetime | None) -> str:
    return "" if moment is None else str(int(moment.timestamp() * 1000))


# -- queues -------------------------------------------------------------------


def _queue_changes(ctx: Context, given: dict[str, str]) -> dict[str, Any]:
    """SQS queue attributes -> the engine's attribute changes."""
    changes: dict[str, Any] = {}
    for name, value in given.items():
        if name in QUEUE_NUMBERS:
            if not re.fullmatch(r"[0-9]{1,10}", value.strip()):
                raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
            changes[QUEUE_NUMBERS[name]] = int(value)
        elif name == "RedrivePolicy":
            changes.update(_redrive_policy(ctx, value))
        elif name in ("FifoQueue", "SqsManagedSseEnabled") and value.lower() == "false":
            continue  # what every queue here is
        elif name == "FifoQueue":
            raise SqsError("UnsupportedOperation", FIFO_NOT_SUPPORTED)
        elif name in NOT_SUPPORTED:
            raise SqsError(
                "InvalidAttributeName", f"The attribute {name} is not supported by leaseq yet."
            )
        else:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name[:100]}.")
    return changes


def _redrive_policy(ctx: Context, value: str) -> dict[str, Any]:
    if value.strip() in ("", "{}"):
        return {"dead_letter_queue": None, "max_receive_count": None}
    try:
        policy = json.loads(value)
    except ValueError:
        policy = None
    if not isinstance(policy, dict) or set(policy) != {"deadLetterTargetArn", "maxReceiveCount"}:
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: Redrive policy needs "
            "deadLetterTargetArn and maxReceiveCount.",
        )
    count = policy["maxReceiveCount"]
    if isinstance(count, str) and count.strip().isdigit():
        count = int(count)
    if not isinstance(count, int) or isinstance(count, bool):
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: maxReceiveCount must be "
            "an integer.",
        )
    target = policy["deadLetterTargetArn"]
    if not isinstance(target, str):
        raise SqsError("InvalidAttributeValue", "deadLetterTargetArn must be a string.")
    return {
        "dead_letter_queue": ctx.name_from_arn(target, "deadLetterTargetArn"),
        "max_receive_count": count,
    }


def _attribute_error(exc: QueueError) -> SqsError:
    error = from_engine(exc)
    if error.name in ("InvalidParameterValue",):
        return SqsError("InvalidAttributeValue", error.message)
    return error


async def create_queue(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = _required(params, "QueueName")
    if name.endswith(".fifo"):
        raise SqsError("UnsupportedOperation", FIFO_NOT_SUPPORTED)
    if not limits.is_queue_name(name):
        raise SqsError(
            "InvalidParameterValue",
            "Can only include alphanumeric characters, hyphens, or underscores. "
            "1 to 80 in length",
        )
    ctx.principal.require("admin", name)
    changes = _queue_changes(ctx, _str_map(params, "Attributes"))
    tags = _str_map(params, "tags") or _str_map(params, "Tags")
    _check_tags(*tags, *tags.values())
    try:
        await ctx.service.create_queue(name, changes, tags)
    except QueueError as exc:
        error = _attribute_error(exc)
        if error.name == "QueueNameExists":
            error = SqsError(
                "QueueNameExists",
                f"A queue already exists with the same name ({name}) and a different value "
                f"for an attribute.",
            )
        raise error from exc
    return {"QueueUrl": ctx.queue_url(name)}


async def get_queue_url(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = _required(params, "QueueName")
    owner = _str(params, "QueueOwnerAWSAccountId")
    if owner not in (None, ctx.account) or not limits.is_queue_name(name):
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    # Every worker asks for its queue's URL first: any scope on the queue will do.
    if not any(ctx.principal.allows(action, name) for action in SCOPE_ACTIONS):
        ctx.principal.require("read", name)
    await ctx.service.get_queue(name)
    return {"QueueUrl": ctx.queue_url(name)}


def _token(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode()


def _after(token: str | None) -> str:
    if not token:
        return ""
    try:
        after = base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        after = ""
    if not limits.is_queue_name(after):
        raise SqsError("InvalidParameterValue", "Invalid NextToken.")
    return after


async def list_queues(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    prefix = _str(params, "QueueNamePrefix") or ""
    limit = _ranged(params, "MaxResults", 1, LIST_QUEUES_MAX)
    after = _after(_str(params, "NextToken"))
    ctx.principal.require_any("read")
    page = await ctx.service.list_queues(
        prefix=prefix, after=after, limit=(limit or LIST_QUEUES_MAX) + 1
    )
    more = len(page) > (limit or LIST_QUEUES_MAX)
    page = page[: limit or LIST_QUEUES_MAX]
    # A key sees the queues it may read: a page may come out shorter than
    # MaxResults, and NextToken still continues after the page's last queue.
    shown = [q for q in page if ctx.principal.allows("read", q.name)]
    result: dict[str, Any] = {"QueueUrls": [ctx.queue_url(q.name) for q in shown]}
    if more and limit is not None:
        result["NextToken"] = _token(page[-1].name)
    return result


async def delete_queue(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    await ctx.service.delete_queue(_queue(ctx, params))
    return {}


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
    }
    if attrs.dead_letter_queue is not None:
        values["RedrivePolicy"] = json.dumps(
            {
                "deadLetterTargetArn": ctx.arn(attrs.dead_letter_queue),
                "maxReceiveCount": attrs.max_receive_count,
            }
        )
    return values


async def get_queue_attributes(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = _queue(ctx, params)
    wanted = _str_list(params, "AttributeNames")
    for attribute in wanted:
        if attribute != "All" and attribute not in (*ALL_QUEUE_ATTRIBUTES, *NOT_SUPPORTED):
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {attribute[:100]}.")
    queue, stats = await ctx.service.get_queue(name)
    values = queue_attributes(ctx, queue, stats)
    if "All" not in wanted:
        values = {k: v for k, v in values.items() if k in wanted}
    return {"Attributes": values} if values else {}


async def set_queue_attributes(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = _queue(ctx, params)
    given = _str_map(params, "Attributes")
    for attribute in given:
        if attribute in READ_ONLY:
            raise SqsError("InvalidAttributeName", f"Attribute {attribute} is read-only.")
    changes = _queue_changes(ctx, given)
    try:
        await ctx.service.update_queue(name, changes)
    except QueueError as exc:
        raise _attribute_error(exc) from exc
    return {}


async def purge_queue(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    await ctx.service.purge(_queue(ctx, params))
    return {}


def _check_tags(*texts: str) -> None:
    # PostgreSQL refuses NUL and lone surrogates in tags (jsonb) and in the keys
    # to remove (text): refused here as a bad parameter, not there as an error 500.
    for text in texts:
        if _INVALID_CHARS.search(text):
            raise SqsError(
                "InvalidParameterValue",
                "Invalid characters found in a tag key or value. Valid characters are #x9 | "
                "#xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF.",
            )


async def tag_queue(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = _queue(ctx, params)
    tags = _str_map(params, "Tags")
    if not tags:
        raise SqsError("MissingParameter", "The request must contain the parameter Tags.")
    _check_tags(*tags, *tags.values())
    await ctx.service.change_tags(name, add=tags)
    return {}


async def untag_queue(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = _queue(ctx, params)
    keys = _str_list(params, "TagKeys")
    if not keys:
        raise SqsError("MissingParameter", "The request must contain the parameter TagKeys.")
    _check_tags(*keys)
    await ctx.service.change_tags(name, remove=keys)
    return {}


async def list_queue_tags(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    tags = await ctx.service.queue_tags(_queue(ctx, params))
    return {"Tags": tags} if tags else {}


async def list_dead_letter_source_queues(
    ctx: Context, params: dict[str, Any]
) -> dict[str, Any]:
    name = _queue(ctx, params)
    limit = _ranged(params, "MaxResults", 1, LIST_QUEUES_MAX)
    after = _after(_str(params, "NextToken"))
    sources = [s for s in await ctx.service.dead_letter_sources(name) if s > after]
    page = sources[: limit or LIST_QUEUES_MAX]
    result: dict[str, Any] = {"queueUrls": [ctx.queue_url(s) for s in page]}
    if limit is not None and len(sources) > len(page):
        result["NextToken"] = _token(page[-1])
    return result


# -- messages -----------------------------------------------------------------


def _message_attributes(value: Any) -> dict[str, MessageAttribute]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SqsError("InvalidParameterValue", "MessageAttributes must be a map.")
    if len(value) > limits.MAX_ATTRIBUTES:
        raise SqsError(
            "InvalidParameterValue",
            f"Number of message attributes [{len(value)}] exceeds the allowed maximum "
            f"[{limits.MAX_ATTRIBUTES}].",
        )
    typed: dict[str, MessageAttribute] = {}
    for name, entry in value.items():
        lowered = name.lower()
        if (
            not _ATTRIBUTE_NAME.fullmatch(name)
            or ".." in name
            or name.startswith(".")
            or name.endswith(".")
            or lowered.startswith(("aws.", "amazon."))
        ):
            raise SqsError("InvalidParameterValue", f"Message attribute name '{name}' is invalid.")
        if not isinstance(entry, dict):
            raise SqsError("InvalidParameterValue", f"Message attribute '{name}' is invalid.")
        data_type = entry.get("DataType")
        if not isinstance(data_type, str) or not data_type:
            raise SqsError(
                "InvalidParameterValue", f"The message attribute '{name}' must contain a "
                f"non-empty message attribute type."
            )
        if not _DATA_TYPE.fullmatch(data_type) or len(data_type) > 256:
            raise SqsError(
                "InvalidParameterValue",
                f"The type of message attribute '{name}' is invalid. You must use only the "
                f"following supported type prefixes: Binary, Number, String.",
            )
        if entry.get("StringListValues") or entry.get("BinaryListValues"):
            raise SqsError(
                "InvalidParameterValue", "Message attribute list values are not supported."
            )
        string_value, binary_value = entry.get("StringValue"), entry.get("BinaryValue")
        if data_type.startswith("Binary"):
            if not isinstance(binary_value, str) or string_value is not None:
                raise SqsError(
                    "InvalidParameterValue",
                    f"The message attribute '{name}' with type 'Binary' must use field "
                    f"'Binary'.",
                )
            try:
                raw = base64.b64decode(binary_value, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise SqsError(
                    "InvalidParameterValue", f"Message attribute '{name}' is not base64."
                ) from exc
            if not raw:
                raise SqsError(
                    "InvalidParameterValue",
                    f"The message attribute '{name}' must contain a non-empty value.",
                )
            typed[name] = MessageAttribute(data_type=data_type, binary_value=raw)
            continue
        if not isinstance(string_value, str) or binary_value is not None or not string_value:
            raise SqsError(
                "InvalidParameterValue",
                f"The message attribute '{name}' must contain a non-empty message attribute "
                f"value for message attribute type '{data_type.split('.')[0]}'.",
            )
        _check_text(string_value, f"the message attribute '{name}'")
        if data_type.startswith("Number"):
            try:
                number = Decimal(string_value)
            except InvalidOperation:
                number = None
            if number is None or not number.is_finite() or len(string_value) > 40:
                raise SqsError(
                    "InvalidParameterValue",
                    f"Can't cast the value of message (user) attribute '{name}' to a number.",
                )
        typed[name] = MessageAttribute(data_type=data_type, string_value=string_value)
    return typed


def _outgoing(ctx: Context, entry: dict[str, Any]) -> OutgoingMessage:
    body = _str(entry, "MessageBody")
    if not body:
        raise SqsError("MissingParameter", "The request must contain the parameter MessageBody.")
    _check_text(body, "the message body")
    for fifo_only in ("MessageDeduplicationId", "MessageGroupId"):
        if entry.get(fifo_only) is not None:
            raise SqsError(
                "InvalidParameterValue",
                f"The request include parameter {fifo_only}, which is for FIFO queues; "
                f"{FIFO_NOT_SUPPORTED}",
            )
    if entry.get("MessageSystemAttributes"):
        raise SqsError(
            "InvalidParameterValue", "MessageSystemAttributes are not supported by leaseq yet."
        )
    return OutgoingMessage(
        body=body,
        delay=_ranged(entry, "DelaySeconds", *limits.DELAY),
        typed_attributes=_message_attributes(entry.get("MessageAttributes")),
        sender_id=ctx.sender_id,
    )


def _sent(message: OutgoingMessage, message_id: str) -> dict[str, Any]:
    result = {"MessageId": message_id, "MD5OfMessageBody": md5.of_body(message.body)}
    digest = md5.of_attributes(message.typed_attributes or {})
    if digest is not None:
        result["MD5OfMessageAttributes"] = digest
    return result


async def send_message(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = _queue(ctx, params)
    message = _outgoing(ctx, params)
    (result,) = await ctx.service.send(name, [message])
    if isinstance(result, EntryError):
        raise from_engine(result.error)
    return _sent(message, result.message_id)


def _entries(params: dict[str, Any]) -> list[dict[str, Any]]:
    """A batch's entries, checked as SQS checks them."""
    entries = params.get("Entries")
    if entries == "":  # botocore's Query form of an empty list
        entries = []
    if entries is None or entries == []:
        raise SqsError(
            "EmptyBatchRequest" if entries == [] else "MissingParameter",
            "There should be at least one entry in the request.",
        )
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SqsError("InvalidParameterValue", "Entries must be a list of entries.")
    if len(entries) > BATCH_MAX:
        raise SqsError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {BATCH_MAX}. You have sent "
            f"{len(entries)}.",
        )
    ids = [e.get("Id") for e in entries]
    for entry_id in ids:
        if not isinstance(entry_id, str) or not _BATCH_ID.fullmatch(entry_id):
            raise SqsError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and "
                "underscores. It can be at most 80 letters long.",
            )
    if len(set(ids)) != len(ids):
        raise SqsError("BatchEntryIdsNotDistinct", "Two or more batch entries have the same Id.")
    return entries


def _failure(entry_id: str, error: SqsError) -> dict[str, Any]:
    return {
        "Id": entry_id,
        "SenderFault": error.fault == "Sender",
        "Code": error.name,
        "Message": error.message,
    }


async def send_message_batch(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = _queue(ctx, params)
    entries = _entries(params)
    failed: list[dict[str, Any]] = []
    ready: list[tuple[str, OutgoingMessage]] = []
    total = 0
    for entry in entries:
        try:
            message = _outgoing(ctx, entry)
        except SqsError as error:
            failed.append(_failure(entry["Id"], error))
            continue
        total += len(message.body.encode("utf-8")) + sum(
            len(k.encode()) + len(v.data_type) + len(v.binary_value or b"")
            + len((v.string_value or "").encode())
            for k, v in (message.typed_attributes or {}).items()
        )
        ready.append((entry["Id"], message))
    if total > BATCH_BYTES:
        raise SqsError(
            "BatchRequestTooLong",
            f"Batch requests cannot be longer than {BATCH_BYTES} bytes. You have sent "
            f"{total} bytes.",
        )
    successful: list[dict[str, Any]] = []
    if ready:
        results = await ctx.service.send(name, [m for _, m in ready])
        for (entry_id, message), result in zip(ready, results, strict=True):
            if isinstance(result, EntryError):
                failed.append(_failure(entry_id, from_engine(result.error)))
            else:
                successful.append({"Id": entry_id, **_sent(message, result.message_id)})
    return {"Successful": successful, "Failed": failed}


def _wants(names: list[str], name: str) -> bool:
    """Whether a list of message attribute names (with All, .* and prefix.*) asks for
    `name`."""
    for wanted in names:
        if wanted in ("All", ".*") or wanted == name:
            return True
        if wanted.endswith(".*") and name.startswith(wanted[:-1]):
            return True
    return False


async def receive_message(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = _queue(ctx, params)
    system = _str_list(params, "AttributeNames") + _str_list(
        params, "MessageSystemAttributeNames"
    )
    for attribute in system:
        if attribute not in ("All", *SYSTEM_ATTRIBUTES, *SYSTEM_NOT_PRESENT):
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {attribute[:100]}.")
    wanted_system = SYSTEM_ATTRIBUTES if "All" in system else [
        a for a in system if a in SYSTEM_ATTRIBUTES
    ]
    attribute_names = _str_list(params, "MessageAttributeNames")
    max_messages = _ranged(params, "MaxNumberOfMessages", *limits.RECEIVE_MAX)
    received = await ctx.service.receive(
        name,
        max_messages=1 if max_messages is None else max_messages,
        visibility_timeout=_ranged(params, "VisibilityTimeout", *limits.VISIBILITY_TIMEOUT),
        wait=_ranged(params, "WaitTimeSeconds", *limits.RECEIVE_WAIT),
        gone=ctx.gone,
    )
    messages = []
    for message in received:
        out: dict[str, Any] = {
            "MessageId": message.message_id,
            "ReceiptHandle": message.receipt_handle,
            "MD5OfBody": md5.of_body(message.body),
            "Body": message.body,
        }
        system_values = {
            "SenderId": message.sender_id or ctx.account,
            "SentTimestamp": _ms(message.sent_at),
            "ApproximateReceiveCount": str(message.receive_count),
            "ApproximateFirstReceiveTimestamp": _ms(message.first_received_at),
        }
        if wanted_system:
            out["Attributes"] = {k: system_values[k] for k in wanted_system}
        chosen = {
            k: v for k, v in message.typed_attributes.items() if _wants(attribute_names, k)
        }
        if chosen:
            out["MD5OfMessageAttributes"] = md5.of_attributes(chosen)
            out["MessageAttributes"] = {
                k: {"DataType": v.data_type, "StringValue": v.string_value}
                if v.binary_value is None
                else {
                    "DataType": v.data_type,
                    "BinaryValue": base64.b64encode(v.binary_value).decode("ascii"),
                }
                for k, v in chosen.items()
            }
        messages.append(out)
    return {"Messages": messages} if messages else {}


def _receipt_error(error: Exception, action: str) -> SqsError | None:
    """What SQS answers for a handle the engine refused (None: success)."""
    if isinstance(error, InvalidReceiptHandle):
        return SqsError("ReceiptHandleIsInvalid", "The input receipt handle is invalid.")
    if isinstance(error, LeaseLost):
        if action == "delete":
            # SQS: deleting with a handle that is no longer the latest succeeds
            # and deletes nothing (the engine's conditional delete).
            return None
        return SqsError(
            "MessageNotInflight",
            "The message referred to is not in flight: it was deleted, or received again "
            "by another receive.",
        )
    return from_engine(error)


async def delete_message(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = _queue(ctx, params)
    handle = _required(params, "ReceiptHandle")
    (result,) = await ctx.service.delete(name, [handle])
    if result is not None:
        error = _receipt_error(result.error, "delete")
        if error is not None:
            raise error
    return {}


async def delete_message_batch(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = _queue(ctx, params)
    entries = _entries(params)
    handles = [e.get("ReceiptHandle") for e in entries]
    failed, successful = [], []
    valid = [(e["Id"], h) for e, h in zip(entries, handles, strict=True) if isinstance(h, str)]
    for entry, handle in zip(entries, handles, strict=True):
        if not isinstance(handle, str):
            failed.append(_failure(entry["Id"], SqsError(
                "MissingParameter", "The request must contain the parameter ReceiptHandle."
            )))
    results = await ctx.service.delete(name, [h for _, h in valid]) if valid else []
    for (entry_id, _), result in zip(valid, results, strict=True):
        error = None if result is None else _receipt_error(result.error, "delete")
        if error is None:
            successful.append({"Id": entry_id})
        else:
            failed.append(_failure(entry_id, error))
    return {"Successful": successful, "Failed": failed}


async def change_message_visibility(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = _queue(ctx, params)
    handle = _required(params, "ReceiptHandle")
    timeout = _int(params, "VisibilityTimeout")
    if timeout is None:
        raise SqsError(
            "MissingParameter", "The request must contain the parameter VisibilityTimeout."
        )
    (result,) = await ctx.service.change_visibility(name, [(handle, timeout)])
    if isinstance(result, EntryError):
        error = _receipt_error(result.error, "change")
        assert error is not None
        raise error
    return {}


async def change_message_visibility_batch(
    ctx: Context, params: dict[str, Any]
) -> dict[str, Any]:
    name = _queue(ctx, params)
    entries = _entries(params)
    failed, successful = [], []
    valid: list[tuple[str, str, int]] = []
    for entry in entries:
        try:
            handle = _required(entry, "ReceiptHandle")
            timeout = _ranged(entry, "VisibilityTimeout", *limits.VISIBILITY_TIMEOUT)
            if timeout is None:
                raise SqsError(
                    "MissingParameter", "The request must contain the parameter VisibilityTimeout."
                )
        except SqsError as error:
            failed.append(_failure(entry["Id"], error))
            continue
        valid.append((entry["Id"], handle, timeout))
    results = (
        await ctx.service.change_visibility(name, [(h, t) for _, h, t in valid]) if valid else []
    )
    for (entry_id, _, _), result in zip(valid, results, strict=True):
        if isinstance(result, EntryError):
            refused = _receipt_error(result.error, "change")
            assert refused is not None
            failed.append(_failure(entry_id, refused))
        else:
            successful.append({"Id": entry_id})
    return {"Successful": successful, "Failed": failed}


# -- message move tasks (redrive) ---------------------------------------------

_STATUS = {"running": "RUNNING", "completed": "COMPLETED", "cancelled": "CANCELLED",
           "failed": "FAILED"}


def _task_handle(task_id: str, source_arn: str) -> str:
    raw = json.dumps({"taskId": task_id, "sourceArn": source_arn}).encode()
    return base64.b64encode(raw).decode()


def _task_id(handle: str) -> str:
    try:
        decoded = json.loads(base64.b64decode(handle.encode(), validate=True))
        task_id = decoded["taskId"]
        if not isinstance(task_id, str):
            raise TypeError
    except (ValueError, TypeError, KeyError, binascii.Error) as exc:
        raise SqsError(
            "ResourceNotFoundException", "The resource that you specified does not exist."
        ) from exc
    return task_id


async def start_message_move_task(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    source_arn = _required(params, "SourceArn")
    source = ctx.name_from_arn(source_arn, "SourceArn")
    ctx.principal.require("admin", source)
    destination_arn = _str(params, "DestinationArn")
    destination = (
        None if destination_arn is None else ctx.name_from_arn(destination_arn, "DestinationArn")
    )
    rate = _ranged(params, "MaxNumberOfMessagesPerSecond", 1, 500)
    try:
        task = await ctx.redrives.start(source, destination, rate)
    except QueueNotFound as exc:
        raise SqsError("ResourceNotFoundException", exc.detail) from exc
    return {"TaskHandle": _task_handle(task.task_id, source_arn)}


async def list_message_move_tasks(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    source_arn = _required(params, "SourceArn")
    source = ctx.name_from_arn(source_arn, "SourceArn")
    ctx.principal.require("read", source)
    limit = _ranged(params, "MaxResults", 1, 10) or 1
    try:
        tasks = await ctx.redrives.list(source, limit)
    except QueueNotFound as exc:
        raise SqsError("ResourceNotFoundException", exc.detail) from exc
    results = []
    for task in tasks:
        entry: dict[str, Any] = {
            "Status": _STATUS.get(task.status, task.status.upper()),
            "SourceArn": source_arn,
            "ApproximateNumberOfMessagesMoved": task.moved,
            "StartedTimestamp": int(task.created_at.timestamp() * 1000),
        }
        if task.status == "running":
            entry["TaskHandle"] = _task_handle(task.task_id, source_arn)
            entry["ApproximateNumberOfMessagesToMove"] = task.to_move_at_start
        if task.destination is not None:
            entry["DestinationArn"] = ctx.arn(task.destination)
        if task.max_per_second is not None:
            entry["MaxNumberOfMessagesPerSecond"] = task.max_per_second
        if task.failure:
            entry["FailureReason"] = task.failure
        results.append(entry)
    return {"Results": results}


async def cancel_message_move_task(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    task_id = _task_id(_required(params, "TaskHandle"))
    task = await ctx.redrives.get(task_id)
    ctx.principal.require("admin", task.source)
    if task.status != "running":
        raise SqsError(
            "ResourceNotFoundException", "The task is not running: it cannot be cancelled."
        )
    task = await ctx.redrives.cancel(task_id)
    return {"ApproximateNumberOfMessagesMoved": task.moved}


async def _permissions(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    raise SqsError("UnsupportedOperation", "Queue permissions are not supported by leaseq yet.")


Action = Callable[[Context, dict[str, Any]], Awaitable[dict[str, Any]]]

ACTIONS: dict[str, Action] = {
    "CreateQueue": create_queue,
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "DeleteQueue": delete_queue,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "PurgeQueue": purge_queue,
    "TagQueue": tag_queue,
    "UntagQueue": untag_queue,
    "ListQueueTags": list_queue_tags,
    "ListDeadLetterSourceQueues": list_dead_letter_source_queues,
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message,
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
    "StartMessageMoveTask": start_message_move_task,
    "ListMessageMoveTasks": list_message_move_tasks,
    "CancelMessageMoveTask": cancel_message_move_task,
    "AddPermission": _permissions,
    "RemovePermission": _permissions,
}

# The scope action each SQS action needs on its queue (app/auth/scopes.py).
SCOPES: dict[str, str] = {
    "CreateQueue": "admin", "GetQueueUrl": "read", "ListQueues": "read",
    "DeleteQueue": "admin", "GetQueueAttributes": "read", "SetQueueAttributes": "admin",
    "PurgeQueue": "admin", "TagQueue": "admin", "UntagQueue": "admin",
    "ListQueueTags": "read", "ListDeadLetterSourceQueues": "read",
    "SendMessage": "send", "SendMessageBatch": "send",
    "ReceiveMessage": "receive", "DeleteMessage": "receive", "DeleteMessageBatch": "receive",
    "ChangeMessageVisibility": "receive", "ChangeMessageVisibilityBatch": "receive",
    "StartMessageMoveTask": "admin", "ListMessageMoveTasks": "read",
    "CancelMessageMoveTask": "admin", "AddPermission": "admin", "RemovePermission": "admin",
}
assert SCOPES.keys() == ACTIONS.keys()
