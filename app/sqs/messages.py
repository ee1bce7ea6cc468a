"""SQS actions on messages: send, receive, delete and change visibility, one at
a time and in batches (their typed attributes: message_attributes.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from app.errors import InvalidReceiptHandle, LeaseLost, MessageTooLarge, MissingParameter
from app.queue import limits
from app.queue.catalog import check_range
from app.queue.models import (
    EntryError,
    OutgoingMessage,
    SentMessage,
)
from app.queue.sending import message_size
from app.sqs import md5
from app.sqs import message_attributes as attributes
from app.sqs.context import (
    Context,
    check_text,
    is_fifo_name,
    millis,
    param_int,
    param_ranged,
    param_required,
    param_str,
    param_str_list,
    queue_of,
)
from app.sqs.errors import SqsError, from_engine

BATCH_MAX = 10
BATCH_BYTES = 1_048_576  # SQS: the sum of a SendMessageBatch's messages
_BATCH_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
# SQS's words for what a FIFO queue's messages need.
NEEDS_GROUP = "The request must contain the parameter MessageGroupId."
NEEDS_DEDUPLICATION = (
    "The queue should either have ContentBasedDeduplication enabled or "
    "MessageDeduplicationId provided explicitly"
)


@dataclass(frozen=True)
class QueueKind:
    """What a send needs to know of its queue: FIFO or not, and for a FIFO queue
    whether it deduplicates by content."""

    fifo: bool
    content_based_deduplication: bool = False


async def _kind(ctx: Context, name: str) -> QueueKind:
    # A standard queue is known by its name, with no lookup; a FIFO queue's
    # deduplication is one of its attributes (usually cached).
    if not is_fifo_name(name):
        return QueueKind(fifo=False)
    queue = await ctx.service.queues.find(name)
    return QueueKind(queue.attributes.fifo, queue.attributes.content_based_deduplication)


def _fifo_id(entry: dict[str, Any], name: str) -> str | None:
    value = param_str(entry, name)
    if value is not None and not limits.FIFO_ID.fullmatch(value):
        raise SqsError(
            "InvalidParameterValue",
            f"Value {attributes.shown(value[:200])} for parameter {name} is invalid. Reason: "
            f"{name} can only include alphanumeric and punctuation characters. 1 to 128 in "
            f"length.",
        )
    return value


def _outgoing(ctx: Context, entry: dict[str, Any], kind: QueueKind) -> OutgoingMessage:
    body = param_str(entry, "MessageBody")
    if not body:
        raise SqsError("MissingParameter", "The request must contain the parameter MessageBody.")
    check_text(body, "the message body")
    trace_header = attributes.trace_header(entry.get("MessageSystemAttributes"))
    group = _fifo_id(entry, "MessageGroupId")
    deduplication_id = _fifo_id(entry, "MessageDeduplicationId")
    if kind.fifo:
        # A FIFO queue's messages take the queue's delay only (0 is no delay of its own).
        delay = param_int(entry, "DelaySeconds")
        if delay:
            raise SqsError(
                "InvalidParameterValue",
                f"Value {delay} for parameter DelaySeconds is invalid. Reason: The request "
                f"include parameter that is not valid for this queue type.",
            )
        if group is None:
            raise SqsError("MissingParameter", NEEDS_GROUP)
        if deduplication_id is None and not kind.content_based_deduplication:
            raise SqsError("InvalidParameterValue", NEEDS_DEDUPLICATION)
        return OutgoingMessage(
            body=body,
            typed_attributes=attributes.parse(entry.get("MessageAttributes")),
            sender_id=ctx.sender_id,
            group_id=group,
            deduplication_id=deduplication_id,
            trace_header=trace_header,
        )
    if deduplication_id is not None:
        raise SqsError(
            "InvalidParameterValue",
            f"Value {deduplication_id} for parameter MessageDeduplicationId is invalid. Reason: "
            f"The request includes a parameter that is not valid for this queue type.",
        )
    # A MessageGroupId on a standard queue names the message's tenant (SQS's
    # fair queues): stored, and returned as its MessageGroupId.
    return OutgoingMessage(
        body=body,
        delay=param_ranged(entry, "DelaySeconds", *limits.DELAY),
        typed_attributes=attributes.parse(entry.get("MessageAttributes")),
        sender_id=ctx.sender_id,
        group_id=group,
        trace_header=trace_header,
    )


def _sent(message: OutgoingMessage, sent: SentMessage) -> dict[str, Any]:
    result = {"MessageId": sent.message_id, "MD5OfMessageBody": md5.of_body(message.body)}
    digest = md5.of_attributes(message.typed_attributes or {})
    if digest is not None:
        result["MD5OfMessageAttributes"] = digest
    system_digest = md5.of_system_attributes(message.trace_header)
    if system_digest is not None:
        result["MD5OfMessageSystemAttributes"] = system_digest
    if sent.sequence_number is not None:
        result["SequenceNumber"] = sent.sequence_number
    return result


async def _send_error(ctx: Context, name: str, error: Exception) -> SqsError:
    """What SQS answers for a message the engine refused."""
    if isinstance(error, MessageTooLarge):
        # SQS names the queue's limit; the engine's words do not. The queue is the
        # one the engine just checked against (cached: no statement).
        limit = (await ctx.service.queues.find(name)).attributes.max_message_bytes
        return SqsError(
            "InvalidParameterValue",
            f"One or more parameters are invalid. Reason: Message must be shorter than "
            f"{limit} bytes.",
        )
    if isinstance(error, MissingParameter):
        if error.parameter == "group":
            return SqsError("MissingParameter", NEEDS_GROUP)
        if error.parameter == "deduplication_id":
            return SqsError("InvalidParameterValue", NEEDS_DEDUPLICATION)
    return from_engine(error)


async def send_message(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = queue_of(ctx, params)
    message = _outgoing(ctx, params, await _kind(ctx, name))
    (result,) = await ctx.service.send(name, [message])
    if isinstance(result, EntryError):
        raise await _send_error(ctx, name, result.error)
    return _sent(message, result)


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


def _batch_result(successful: list[Any], failed: list[Any]) -> dict[str, Any]:
    # SQS leaves an empty list out of a batch's answer (botocore then has neither).
    return {k: v for k, v in (("Successful", successful), ("Failed", failed)) if v}


def _failure(entry_id: str, error: SqsError) -> dict[str, Any]:
    return {
        "Id": entry_id,
        "SenderFault": error.fault == "Sender",
        "Code": error.name,
        "Message": error.message,
    }


async def send_message_batch(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = queue_of(ctx, params)
    entries = _entries(params)
    kind = await _kind(ctx, name)
    if kind.fifo:
        # SQS refuses the whole batch, not the entry, for these two.
        for entry in entries:
            if entry.get("MessageDeduplicationId") is None and not (
                kind.content_based_deduplication
            ):
                raise SqsError("InvalidParameterValue", NEEDS_DEDUPLICATION)
            if entry.get("MessageGroupId") is None:
                raise SqsError("InvalidParameterValue", NEEDS_GROUP)
    failed: list[dict[str, Any]] = []
    ready: list[tuple[str, OutgoingMessage]] = []
    total = 0
    for entry in entries:
        try:
            message = _outgoing(ctx, entry, kind)
        except SqsError as error:
            failed.append(_failure(entry["Id"], error))
            continue
        total += message_size(message)  # counted as each message is, summed
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
                failed.append(_failure(entry_id, await _send_error(ctx, name, result.error)))
            else:
                successful.append({"Id": entry_id, **_sent(message, result)})
    return _batch_result(successful, failed)


def _wait_time(params: dict[str, Any]) -> int | None:
    wait = param_int(params, "WaitTimeSeconds")
    low, high = limits.RECEIVE_WAIT
    if wait is not None and not low <= wait <= high:
        raise SqsError(  # SQS's words for this one parameter
            "InvalidParameterValue",
            f"Value {wait} for parameter WaitTimeSeconds is invalid. Reason: Must be >= {low} "
            f"and <= {high}, if provided.",
        )
    return wait


async def receive_message(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = queue_of(ctx, params)
    system = param_str_list(params, "AttributeNames") + param_str_list(
        params, "MessageSystemAttributeNames"
    )
    for attribute in system:
        if attribute not in ("All", *attributes.SYSTEM, *attributes.SYSTEM_NOT_PRESENT):
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {attribute[:100]}.")
    wanted_system = attributes.SYSTEM if "All" in system else [
        a for a in system if a in attributes.SYSTEM
    ]
    attribute_names = param_str_list(params, "MessageAttributeNames")
    max_messages = param_ranged(params, "MaxNumberOfMessages", *limits.RECEIVE_MAX)
    attempt_id = param_str(params, "ReceiveRequestAttemptId")
    if not is_fifo_name(name):
        attempt_id = None  # SQS: for FIFO queues only; ignored elsewhere
    elif attempt_id is not None and not limits.FIFO_ID.fullmatch(attempt_id):
        raise SqsError(
            "InvalidParameterValue",
            f"Value {attributes.shown(attempt_id[:200])} for parameter ReceiveRequestAttemptId "
            f"is invalid. "
            f"Reason: It can only include alphanumeric and punctuation characters. 1 to 128 "
            f"in length.",
        )
    received = await ctx.service.receive(
        name,
        max_messages=1 if max_messages is None else max_messages,
        visibility_timeout=param_ranged(params, "VisibilityTimeout", *limits.VISIBILITY_TIMEOUT),
        wait=_wait_time(params),
        gone=ctx.gone,
        attempt_id=attempt_id,
    )
    # The queues dead-lettered messages came from, by name: only when asked for
    # and some message has one (a lookup that the hot path never makes).
    sources: dict[int, str] = {}
    if attributes.DEAD_LETTER_SOURCE in wanted_system:
        ids = {m.dead_letter_source_id for m in received if m.dead_letter_source_id}
        if ids:
            sources = await ctx.service.queues.names_of(ids)
    messages = []
    for message in received:
        source = sources.get(message.dead_letter_source_id or 0)
        out: dict[str, Any] = {
            "MessageId": message.message_id,
            "ReceiptHandle": message.receipt_handle,
            "MD5OfBody": md5.of_body(message.body),
            "Body": message.body,
        }
        system_values: dict[str, str | None] = {
            "SenderId": message.sender_id or ctx.account,
            "SentTimestamp": millis(message.sent_at),
            "ApproximateReceiveCount": str(message.receive_count),
            "ApproximateFirstReceiveTimestamp": millis(message.first_received_at),
            "MessageGroupId": message.group_id,  # a standard queue's: its tenant, if any
            # these two: None on a standard queue
            "MessageDeduplicationId": message.deduplication_id,
            "SequenceNumber": message.sequence_number,
            md5.TRACE_HEADER: attributes.trace_of(message),
            attributes.DEAD_LETTER_SOURCE: None if source is None else ctx.arn(source),
        }
        chosen_system = {
            k: value for k in wanted_system if (value := system_values[k]) is not None
        }
        if chosen_system:
            out["Attributes"] = chosen_system
        chosen = attributes.chosen(attribute_names, message.typed_attributes)
        if chosen:
            out["MD5OfMessageAttributes"] = md5.of_attributes(chosen)
            out["MessageAttributes"] = attributes.rendered(chosen)
        messages.append(out)
    return {"Messages": messages} if messages else {}


# A receipt handle as echoed in an error: SQS quotes it whole; bounded here.
_HANDLE_ECHO = 1024


def _expired(handle: str) -> SqsError:
    return SqsError(
        "InvalidParameterValue",
        f"Value {handle[:_HANDLE_ECHO]} for parameter ReceiptHandle is invalid. Reason: The "
        f"receipt handle has expired.",
    )


async def _lapsed(ctx: Context, name: str, handles: list[str]) -> set[str]:
    """The handles SQS calls expired: on a FIFO queue only, a handle whose lease
    no longer holds (lapsed, released, or replaced by another receive) while its
    message is still there. A standard queue keeps accepting them (invariant 3),
    and is known by its name, with no statement."""
    if not handles or not is_fifo_name(name):
        return set()
    return await ctx.service.lapsed(name, handles)


def _receipt_error(error: Exception, action: str, handle: str) -> SqsError | None:
    """What SQS answers for a handle the engine refused (None: success)."""
    shown = handle[:_HANDLE_ECHO]
    if isinstance(error, InvalidReceiptHandle):
        return SqsError(
            "ReceiptHandleIsInvalid",
            f'The input receipt handle "{shown}" is not a valid receipt handle.',
        )
    if isinstance(error, LeaseLost):
        if action == "delete":
            # SQS: deleting with a handle that is no longer the latest succeeds
            # and deletes nothing (the engine's conditional delete).
            return None
        # The message was deleted, or received again (the engine does not say
        # which): SQS's answer for a message that is gone.
        return SqsError(
            "InvalidParameterValue",
            f"Value {shown} for parameter ReceiptHandle is invalid. Reason: Message does not "
            f"exist or is not available for visibility timeout change.",
        )
    return from_engine(error)


async def delete_message(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = queue_of(ctx, params)
    handle = param_required(params, "ReceiptHandle")
    if await _lapsed(ctx, name, [handle]):
        raise _expired(handle)
    (result,) = await ctx.service.delete(name, [handle])
    if result is not None:
        error = _receipt_error(result.error, "delete", handle)
        if error is not None:
            raise error
    return {}


async def delete_message_batch(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = queue_of(ctx, params)
    entries = _entries(params)
    handles = [e.get("ReceiptHandle") for e in entries]
    failed, successful = [], []
    valid = [(e["Id"], h) for e, h in zip(entries, handles, strict=True) if isinstance(h, str)]
    for entry, handle in zip(entries, handles, strict=True):
        if not isinstance(handle, str):
            failed.append(_failure(entry["Id"], SqsError(
                "MissingParameter", "The request must contain the parameter ReceiptHandle."
            )))
    lapsed = await _lapsed(ctx, name, [h for _, h in valid])
    failed.extend(_failure(entry_id, _expired(h)) for entry_id, h in valid if h in lapsed)
    valid = [(entry_id, h) for entry_id, h in valid if h not in lapsed]
    results = await ctx.service.delete(name, [h for _, h in valid]) if valid else []
    for (entry_id, handle), result in zip(valid, results, strict=True):
        error = None if result is None else _receipt_error(result.error, "delete", handle)
        if error is None:
            successful.append({"Id": entry_id})
        else:
            failed.append(_failure(entry_id, error))
    return _batch_result(successful, failed)


async def change_message_visibility(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = queue_of(ctx, params)
    handle = param_required(params, "ReceiptHandle")
    timeout = param_int(params, "VisibilityTimeout")
    if timeout is None:
        raise SqsError(
            "MissingParameter", "The request must contain the parameter VisibilityTimeout."
        )
    # SQS judges the value before the handle.
    check_range("timeout", timeout, limits.VISIBILITY_TIMEOUT)
    if await _lapsed(ctx, name, [handle]):
        raise _expired(handle)
    (result,) = await ctx.service.change_visibility(name, [(handle, timeout)])
    if isinstance(result, EntryError):
        error = _receipt_error(result.error, "change", handle)
        assert error is not None
        raise error
    return {}


async def change_message_visibility_batch(
    ctx: Context, params: dict[str, Any]
) -> dict[str, Any]:
    name = queue_of(ctx, params)
    entries = _entries(params)
    failed, successful = [], []
    valid: list[tuple[str, str, int]] = []
    for entry in entries:
        try:
            handle = param_required(entry, "ReceiptHandle")
            timeout = param_ranged(entry, "VisibilityTimeout", *limits.VISIBILITY_TIMEOUT)
            if timeout is None:
                raise SqsError(
                    "MissingParameter", "The request must contain the parameter VisibilityTimeout."
                )
        except SqsError as error:
            failed.append(_failure(entry["Id"], error))
            continue
        valid.append((entry["Id"], handle, timeout))
    lapsed = await _lapsed(ctx, name, [h for _, h, _ in valid])
    failed.extend(_failure(entry_id, _expired(h)) for entry_id, h, _ in valid if h in lapsed)
    valid = [entry for entry in valid if entry[1] not in lapsed]
    results = (
        await ctx.service.change_visibility(name, [(h, t) for _, h, t in valid]) if valid else []
    )
    for (entry_id, handle, _), result in zip(valid, results, strict=True):
        if isinstance(result, EntryError):
            refused = _receipt_error(result.error, "change", handle)
            assert refused is not None
            failed.append(_failure(entry_id, refused))
        else:
            successful.append({"Id": entry_id})
    return _batch_result(successful, failed)
