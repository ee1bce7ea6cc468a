"""What a send checks and prepares, for both kinds of queue: a message's size as
SQS counts it, its stored attributes, and the rows the INSERT takes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import TypeVar

from app.errors import InvalidParameter, MessageTooLarge, MissingParameter, QueueError
from app.queue import limits, typed
from app.queue.catalog import check_range
from app.queue.grouped import Outgoing
from app.queue.grouped_fifo import FifoOutgoing
from app.queue.models import (
    EntryError,
    OutgoingMessage,
    Queue,
    SentMessage,
)


def message_size(message: OutgoingMessage) -> int:
    """Bytes counted against max_message_bytes: the body and the attributes, as SQS
    (typed ones count their data type too; flat REST ones their name and value).
    A trace header is not counted: SQS leaves system attributes out of the size."""
    size = len(message.body.encode("utf-8"))
    if message.typed_attributes is not None:
        return size + sum(typed.size(k, v) for k, v in message.typed_attributes.items())
    for key, value in message.attributes.items():
        size += len(key.encode("utf-8")) + len(value.encode("utf-8"))
    return size


def _stored_attributes(message: OutgoingMessage) -> tuple[str, str | None]:
    """The `attributes` and `attribute_types` columns of a message, as JSON."""
    if message.typed_attributes is None:
        return (json.dumps(message.attributes) if message.attributes else "{}"), None
    flat, types = typed.split(message.typed_attributes)
    return json.dumps(flat), types



_Out = TypeVar("_Out")


def accept(
    queue: Queue,
    messages: Sequence[OutgoingMessage],
    prepare: Callable[[Queue, OutgoingMessage], _Out],
) -> tuple[list[SentMessage | EntryError | None], list[int], list[_Out]]:
    """Each message checked and prepared for its INSERT: a result per message
    (an entry's error, or None until the INSERT fills it in), the indexes of the
    accepted ones and what the INSERT takes of them."""
    results: list[SentMessage | EntryError | None] = []
    accepted: list[int] = []
    outgoing: list[_Out] = []
    for index, message in enumerate(messages):
        try:
            if message_size(message) > queue.attributes.max_message_bytes:
                raise MessageTooLarge(
                    f"Message is larger than the queue's max_message_bytes "
                    f"({queue.attributes.max_message_bytes})."
                )
            outgoing.append(prepare(queue, message))
        except QueueError as exc:
            results.append(EntryError(exc))
            continue
        results.append(None)
        accepted.append(index)
    return results, accepted, outgoing


def standard_outgoing(queue: Queue, message: OutgoingMessage) -> Outgoing:
    """A message for a standard queue, checked."""
    if message.delay is not None:
        check_range("delay", message.delay, limits.DELAY)
    if message.deduplication_id is not None:
        raise InvalidParameter("deduplication_id is for FIFO queues; this queue is a standard one.")
    tenant = message.group_id
    if tenant is not None:
        _check_group(tenant)
    flat, types = _stored_attributes(message)
    return Outgoing(
        body=message.body,
        attributes=flat,
        attribute_types=types,
        sender_id=message.sender_id,
        delay=queue.attributes.delay if message.delay is None else message.delay,
        not_before=message.not_before,
        trace_header=message.trace_header,
        tenant=tenant,
    )


def fair_outgoing(queue: Queue, message: OutgoingMessage) -> Outgoing:
    """A message for a fair queue: as for a standard one, its tenant '' when it
    names none (each such message is its own tenant, never a noisy one)."""
    outgoing = standard_outgoing(queue, message)
    return outgoing if outgoing.tenant is not None else outgoing._replace(tenant="")


def _check_group(group: str) -> None:
    if not limits.FIFO_ID.fullmatch(group):
        raise InvalidParameter(
            "group must be 1-128 letters, digits and punctuation (!\"#$%&'()*+,-./:;<=>?@"
            "[\\]^_`{|}~)."
        )


def fifo_outgoing(queue: Queue, message: OutgoingMessage) -> FifoOutgoing:
    """A message for a FIFO queue, checked as SQS checks it."""
    if message.delay is not None or message.not_before is not None:
        raise InvalidParameter(
            "A message sent to a FIFO queue has no delay of its own (the queue's delay "
            "applies to every message): leave out delay and not_before."
        )
    group = message.group_id
    if group is None:
        raise MissingParameter("group", "A message sent to a FIFO queue needs a group.")
    _check_group(group)
    deduplication_id = message.deduplication_id
    if deduplication_id is None:
        if not queue.attributes.content_based_deduplication:
            raise MissingParameter(
                "deduplication_id",
                "This FIFO queue has no content-based deduplication: a message sent to it "
                "needs a deduplication_id.",
            )
        deduplication_id = hashlib.sha256(message.body.encode("utf-8")).hexdigest()
    elif not limits.FIFO_ID.fullmatch(deduplication_id):
        raise InvalidParameter(
            "deduplication_id must be 1-128 letters, digits and punctuation."
        )
    flat, types = _stored_attributes(message)
    return FifoOutgoing(
        body=message.body,
        attributes=flat,
        attribute_types=types,
        sender_id=message.sender_id,
        group_id=group,
        scope=group if queue.deduplicates_by == "message_group" else "",
        deduplication_id=deduplication_id,
        trace_header=message.trace_header,
    )
