"""The message cycle's request and response bodies (send, receive, visibility,
delete, checkpoint, release, peek), and the checks of what a message may carry:
text SQS allows, attributes, a JSON cursor PostgreSQL can store, a time."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    model_validator,
)

from app.api.schemas import Strict, ranged
from app.queue import limits
from app.queue.models import Lease, PeekedMessage, ReceivedMessage

MAX_CURSOR_BYTES = 64 * 1024


_ASCII_CONTROLS = bytes(c for c in range(0x20) if c not in b"\t\n\r")


def _sqs_text(value: str) -> str:
    if len(value) > limits.MAX_MESSAGE_BYTES[1]:
        # Longer than any message may be: the engine refuses it by its size
        # (413 message_too_large) without this scan of every character.
        return value
    if value.isascii():
        # The common case at C speed (about 1 ms a MiB, a ninth of the regex):
        # only the control characters can be wrong in ASCII.
        raw = value.encode("ascii")
        if len(raw.translate(None, _ASCII_CONTROLS)) == len(raw):
            return value
    bad = limits.NOT_TEXT_CHAR.search(value)
    if bad is not None:
        raise ValueError(f"contains a character SQS does not allow: U+{ord(bad.group()):04X}")
    return value


def _storable_json(value: Any) -> Any:
    """A JSON value PostgreSQL's jsonb can store: no NUL, no lone surrogates, finite numbers."""
    # A stack, not recursion: no Python frame per level, whatever nesting the
    # JSON parser let through. Reversed pushes keep the first error the first found.
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        node, depth = pending.pop()
        if depth > 64:
            raise ValueError("is nested too deeply (at most 64 levels)")
        if isinstance(node, str):
            _sqs_text(node)
        elif isinstance(node, float) and not math.isfinite(node):
            raise ValueError("contains a number JSON cannot represent")
        elif isinstance(node, dict):
            for key in node:
                _sqs_text(key)
            pending.extend((item, depth + 1) for item in reversed(node.values()))
        elif isinstance(node, list):
            pending.extend((item, depth + 1) for item in reversed(node))
    if len(json.dumps(value)) > MAX_CURSOR_BYTES:
        raise ValueError(f"is larger than {MAX_CURSOR_BYTES} bytes")
    return value


# Any time before now means now and any beyond the queue's retention its end
# (queries.sql, send_messages), so the window only has to keep a time's UTC form
# representable: 0001-01-01T00:00:00+14:00 is in year 0 in UTC, which neither
# Python nor asyncpg can hold. 1970 keeps the epoch, a common "at once".
_NOT_BEFORE = (datetime(1970, 1, 1, tzinfo=UTC), datetime(9000, 1, 1, tzinfo=UTC))


def _schedulable(value: datetime) -> datetime:
    # Aware datetimes compare without converting to UTC: no overflow here.
    if not _NOT_BEFORE[0] <= value < _NOT_BEFORE[1]:
        raise ValueError("must be from 1970-01-01 to before 9000-01-01 (UTC)")
    return value


def _attribute_map(value: dict[str, str]) -> dict[str, str]:
    if len(value) > limits.MAX_ATTRIBUTES:
        raise ValueError(f"at most {limits.MAX_ATTRIBUTES} attributes")
    for key, item in value.items():
        if not limits.ATTRIBUTE_NAME.fullmatch(key):
            raise ValueError(f"attribute name {key[:40]!r} must be 1-256 of A-Z a-z 0-9 _ . -")
        _sqs_text(item)
    return value


FifoId = Annotated[str, StringConstraints(pattern=limits.FIFO_ID.pattern)]
Body = Annotated[str, Field(min_length=1), AfterValidator(_sqs_text)]
Attributes = Annotated[dict[str, str], AfterValidator(_attribute_map)]
Cursor = Annotated[Any, AfterValidator(_storable_json)]
NotBefore = Annotated[AwareDatetime, AfterValidator(_schedulable)]


class MessageIn(Strict):
    body: Body
    delay: int | None = ranged(limits.DELAY)
    not_before: NotBefore | None = Field(
        default=None,
        description="Deliver no earlier than this time, as judged by the database's clock "
        "when the message is sent (beyond SQS; at most the queue's retention ahead). "
        "From 1970-01-01 to before 9000-01-01 (UTC). Not together with delay.",
    )
    attributes: Attributes = Field(default_factory=dict)
    group: FifoId | None = Field(
        default=None,
        description="FIFO queues (required there): the message group. A group's messages "
        "are delivered in send order. Standard queues: the message's tenant (SQS's fair "
        "queues), stored and returned with it.",
    )
    deduplication_id: FifoId | None = Field(
        default=None,
        description="FIFO queues: a send with an id accepted in the last five minutes is "
        "answered with the first message's id and stores nothing. Required unless the "
        "queue has content_based_deduplication.",
    )

    @model_validator(mode="after")
    def _one_schedule(self) -> MessageIn:
        if self.delay is not None and self.not_before is not None:
            raise ValueError("give delay or not_before, not both")
        return self


class MessageBatchIn(Strict):
    messages: list[MessageIn] = Field(min_length=1, max_length=limits.MAX_BATCH)


def _send_shape(value: Any) -> str:
    return "batch" if isinstance(value, dict) and "messages" in value else "single"


SendIn = Annotated[
    Annotated[MessageIn, Tag("single")] | Annotated[MessageBatchIn, Tag("batch")],
    Discriminator(_send_shape),
]
"""One message, or `{"messages": [...]}`: told apart by the `messages` key."""


class SentOut(BaseModel):
    message_id: str
    sent_at: datetime
    sequence_number: str | None = Field(
        default=None, description="FIFO queues: the message's place in the queue, strictly "
        "increasing (a duplicate's is the first message's)."
    )


class BatchResults(BaseModel):
    """One result per entry, in request order: `ok` true with the entry's data, or
    false with the `status`, `code` and `detail` the single form would have returned."""

    results: list[dict[str, Any]]
    succeeded: int
    failed: int

    @classmethod
    def of(cls, results: list[dict[str, Any]]) -> BatchResults:
        ok = sum(1 for r in results if r["ok"])
        return cls(results=results, succeeded=ok, failed=len(results) - ok)


class ReceivedOut(BaseModel):
    message_id: str
    body: str
    attributes: dict[str, str]
    receipt_handle: str
    receive_count: int
    fencing_token: int
    lease_seconds: int
    lease_expires_at: datetime
    sent_at: datetime
    first_received_at: datetime
    checkpoint: Any
    group: str | None = Field(
        default=None,
        description="FIFO queues: the message group; standard queues: the tenant it was sent "
        "with, if any.",
    )
    sequence_number: str | None = Field(default=None, description="FIFO queues.")
    deduplication_id: str | None = Field(default=None, description="FIFO queues.")

    @classmethod
    def of(cls, message: ReceivedMessage) -> ReceivedOut:
        values = {k: v for k, v in message.__dict__.items() if k in cls.model_fields}
        return cls(**values, lease_seconds=message.visibility_timeout, group=message.group_id)


class ReceiveOut(BaseModel):
    messages: list[ReceivedOut]


class SettledOut(ReceiveOut):
    """The messages claimed, after the acknowledgements and extensions the receive
    brought: one result per entry of `delete` and of `extend`, in request order, as
    the batch routes give them (a `lease_lost` entry never fails the receive)."""

    deleted: list[dict[str, Any]]
    extended: list[dict[str, Any]]


class VisibilityIn(Strict):
    timeout: int = Field(ge=limits.VISIBILITY_TIMEOUT[0], le=limits.VISIBILITY_TIMEOUT[1],
                         strict=True)


class LeaseOut(BaseModel):
    lease_seconds: int
    lease_expires_at: datetime

    @classmethod
    def of(cls, lease: Lease) -> LeaseOut:
        return cls(lease_seconds=lease.visibility_timeout, lease_expires_at=lease.lease_expires_at)


class VisibilityEntry(VisibilityIn):
    receipt_handle: str


class VisibilityBatchIn(Strict):
    entries: list[VisibilityEntry] = Field(min_length=1, max_length=limits.MAX_BATCH)


class DeleteBatchIn(Strict):
    receipt_handles: list[str] = Field(min_length=1, max_length=limits.MAX_BATCH)


def _attempt_id() -> Any:
    return Field(
        default=None,
        description="FIFO queues: a receive retried with the same id within five minutes "
        "answers the same messages and receipt handles while they are still in flight "
        "for it (SQS's ReceiveRequestAttemptId); 1-128 letters, digits and punctuation. "
        "A standard queue ignores it, checked or not (as SQS).",
    )


class ReceiveQuery(BaseModel):
    """`GET …/receive`'s query parameters (others are ignored)."""

    max: int = Field(default=1, ge=limits.RECEIVE_MAX[0], le=limits.RECEIVE_MAX[1],
                     description="At most this many messages.")
    visibility_timeout: int | None = Field(
        default=None, ge=limits.VISIBILITY_TIMEOUT[0], le=limits.VISIBILITY_TIMEOUT[1],
        description="The lease, in seconds; default the queue's visibility_timeout.",
    )
    wait: int | None = Field(
        default=None, ge=limits.RECEIVE_WAIT[0], le=limits.RECEIVE_WAIT[1],
        description="Seconds to wait for a message; default the queue's receive_wait.",
    )
    attempt_id: str | None = _attempt_id()


class ReceiveIn(Strict):
    """A receive that first acknowledges and extends what the worker holds: a
    worker's steady state is one request per iteration."""

    max: int = Field(default=1, ge=limits.RECEIVE_MAX[0], le=limits.RECEIVE_MAX[1], strict=True)
    wait: int | None = Field(
        default=None, ge=limits.RECEIVE_WAIT[0], le=limits.RECEIVE_WAIT[1], strict=True,
        description="Seconds to wait for a message; default the queue's receive_wait.",
    )
    visibility_timeout: int | None = Field(
        default=None, ge=limits.VISIBILITY_TIMEOUT[0], le=limits.VISIBILITY_TIMEOUT[1],
        strict=True,
    )
    attempt_id: str | None = _attempt_id()
    delete: list[str] = Field(
        default_factory=list, max_length=limits.MAX_BATCH,
        description="Receipt handles to acknowledge before claiming.",
    )
    extend: list[VisibilityEntry] = Field(
        default_factory=list, max_length=limits.MAX_BATCH,
        description="Leases to extend (`timeout` seconds from now) before claiming.",
    )


class CheckpointIn(Strict):
    cursor: Cursor
    timeout: int | None = Field(
        default=None, ge=limits.VISIBILITY_TIMEOUT[0], le=limits.VISIBILITY_TIMEOUT[1],
        strict=True,
        description="Renew the lease by this many seconds; default the queue's "
        "visibility_timeout.",
    )


class ReleaseIn(Strict):
    delay: int | None = Field(
        default=None, ge=limits.RELEASE_DELAY[0], le=limits.RELEASE_DELAY[1], strict=True,
        description="Seconds until the message is visible again; default: the queue's "
        "retry ladder, or at once without one.",
    )


class ReleasedOut(BaseModel):
    delay_seconds: float
    visible_at: datetime


class PeekedOut(BaseModel):
    message_id: str
    body: str
    truncated: bool
    attributes: dict[str, str]
    state: str
    receive_count: int
    sent_at: datetime
    first_received_at: datetime | None
    visible_at: datetime
    checkpoint: Any
    dead_letter_source: str | None
    fencing_token: int | None = Field(description="The holder's token, while in flight.")
    lease_remaining_seconds: float | None = Field(
        description="Seconds left of the lease while in flight, on the database's clock."
    )
    group: str | None = Field(
        default=None, description="The message group (FIFO) or tenant (standard), if any."
    )

    @classmethod
    def of(cls, message: PeekedMessage) -> PeekedOut:
        values = asdict(message)
        values.pop("cursor")
        return cls(**values)


class PeekOut(BaseModel):
    messages: list[PeekedOut]
    next_after: str | None = Field(
        description="Pass as `after` for the next page; null on the last page."
    )
