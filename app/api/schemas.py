"""Request and response bodies of the REST API, with the limits of app.queue.limits."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    model_validator,
)

from app.queue import attributes, limits
from app.queue.advice import LeaseAdvice
from app.queue.models import (
    Lease,
    PeekedMessage,
    Queue,
    QueueStats,
    ReceivedMessage,
    RedriveTask,
    RetryBackoff,
)

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


def _ranged(bounds: tuple[int, int]) -> Any:
    return Field(default=None, ge=bounds[0], le=bounds[1], strict=True)


QueueName = Annotated[str, StringConstraints(pattern=limits.QUEUE_NAME.pattern)]
QueueNameOrEmpty = Annotated[
    str, StringConstraints(pattern=r"^(?:[A-Za-z0-9_-]{0,80}|[A-Za-z0-9_-]{1,75}\.fifo)$")
]
FifoId = Annotated[str, StringConstraints(pattern=limits.FIFO_ID.pattern)]
Body = Annotated[str, Field(min_length=1), AfterValidator(_sqs_text)]
Attributes = Annotated[dict[str, str], AfterValidator(_attribute_map)]
Cursor = Annotated[Any, AfterValidator(_storable_json)]
NotBefore = Annotated[AwareDatetime, AfterValidator(_schedulable)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RetryBackoffIn(_Strict):
    """A release without a delay waits min(max, initial * multiplier^(receive_count-1))
    seconds, less up to `jitter` (a fraction) of it at random."""

    initial: float = Field(ge=limits.RETRY_SECONDS[0], le=limits.RETRY_SECONDS[1])
    multiplier: float = Field(
        default=2.0, ge=limits.RETRY_MULTIPLIER[0], le=limits.RETRY_MULTIPLIER[1]
    )
    max: float = Field(ge=limits.RETRY_SECONDS[0], le=limits.RETRY_SECONDS[1])
    jitter: float = Field(default=0.0, ge=limits.RETRY_JITTER[0], le=limits.RETRY_JITTER[1])


class QueueAttributesIn(_Strict):
    visibility_timeout: int | None = _ranged(limits.VISIBILITY_TIMEOUT)
    message_retention: int | None = _ranged(limits.MESSAGE_RETENTION)
    delay: int | None = _ranged(limits.DELAY)
    receive_wait: int | None = _ranged(limits.RECEIVE_WAIT)
    max_message_bytes: int | None = _ranged(limits.MAX_MESSAGE_BYTES)
    dead_letter_queue: QueueNameOrEmpty | None = Field(
        default=None,
        description="Redrive policy: where exhausted messages go. Null or \"\" in a "
        "PATCH removes the policy.",
    )
    max_receive_count: int | None = Field(
        default=None, ge=limits.MAX_RECEIVE_COUNT[0], le=limits.MAX_RECEIVE_COUNT[1], strict=True,
        description="Redrive policy: receives before a message is dead-lettered.",
    )
    retry_backoff: RetryBackoffIn | None = Field(
        default=None, description="Retry ladder for releases; null in a PATCH removes it."
    )
    fifo: bool | None = Field(
        default=None, strict=True,
        description="A FIFO queue (fixed when the queue is created; its name ends in "
        "\".fifo\", and only a FIFO queue's does): messages of one group are delivered in "
        "send order, one batch of a group in flight at a time, deduplicated for five minutes.",
    )
    content_based_deduplication: bool | None = Field(
        default=None, strict=True,
        description="FIFO: a message sent without a deduplication_id is deduplicated by "
        "the SHA-256 of its body.",
    )
    deduplication_scope: Literal["queue", "message_group"] | None = Field(
        default=None, description="FIFO: deduplication ids are unique per queue or per group.",
    )
    fifo_throughput_limit: Literal["per_queue", "per_message_group_id"] | None = Field(
        default=None,
        description="FIFO: stored and returned as SQS has it; leaseq sets no throughput limit.",
    )

    def changes(self) -> dict[str, Any]:
        """The attributes given. Null means "not given", except for the removable
        ones, where a null given explicitly removes them."""
        out: dict[str, Any] = {}
        for name in self.model_fields_set - {"name"}:
            value = getattr(self, name)
            if name == "retry_backoff" and value is not None:
                value = RetryBackoff(**value.model_dump())
            if value is not None or name in attributes.REMOVABLE:
                out[name] = value
        return out


class QueueCreate(QueueAttributesIn):
    name: QueueName


class RetryBackoffOut(BaseModel):
    initial: float
    multiplier: float
    max: float
    jitter: float


class QueueAttributesOut(BaseModel):
    visibility_timeout: int
    message_retention: int
    delay: int
    receive_wait: int
    max_message_bytes: int
    dead_letter_queue: str | None
    max_receive_count: int | None
    retry_backoff: RetryBackoffOut | None
    fifo: bool
    content_based_deduplication: bool
    deduplication_scope: str
    fifo_throughput_limit: str


class StatsOut(BaseModel):
    visible: int
    in_flight: int
    delayed: int
    oldest_age_seconds: float


class QueueOut(BaseModel):
    name: str
    attributes: QueueAttributesOut
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, queue: Queue) -> QueueOut:
        return cls(
            name=queue.name,
            attributes=QueueAttributesOut.model_validate(
                asdict(queue.attributes)
            ),
            created_at=queue.created_at,
            updated_at=queue.updated_at,
        )


class LeaseAdviceOut(BaseModel):
    """The essay's rule for this queue, from the last ten minutes of this process's
    acknowledgements (docs/workers.md)."""

    samples: int = Field(description="Acknowledgements timed in the window.")
    held_p999_seconds: float | None = Field(
        description="p99.9 of lease held time (claim to acknowledgement, database clock); "
        "null below 100 samples."
    )
    visibility_timeout: int | None = Field(
        description="The lease the p99.9 implies for a worker that does not heartbeat."
    )
    heartbeat_seconds: int | None = Field(
        description="For a worker that heartbeats: a third of the lease it is granted."
    )
    lease_seconds: int | None = Field(description="The lease the last receive was granted.")
    heartbeats: int
    redelivered_after_expiry: int
    warnings: list[str] = Field(
        description="`lease_below_p999`, `redeliveries_rising`; empty when all is well."
    )


class QueueDetail(QueueOut):
    stats: StatsOut
    lease_advice: LeaseAdviceOut | None = Field(
        default=None, description="null until this process has seen the queue's leases."
    )

    @classmethod
    def with_stats(
        cls, queue: Queue, stats: QueueStats, advice: LeaseAdvice | None = None
    ) -> QueueDetail:
        return cls(
            **QueueOut.of(queue).model_dump(), stats=StatsOut(**stats.__dict__),
            lease_advice=None if advice is None else LeaseAdviceOut(**asdict(advice)),
        )


class QueueList(BaseModel):
    queues: list[QueueOut]
    next_after: str | None = Field(
        description="Pass as `after` for the next page; null on the last page."
    )


class Purged(BaseModel):
    purged: int


class MessageIn(_Strict):
    body: Body
    delay: int | None = _ranged(limits.DELAY)
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
        "are delivered in send order.",
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


class MessageBatchIn(_Strict):
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
    group: str | None = Field(default=None, description="FIFO queues: the message group.")
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


class VisibilityIn(_Strict):
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


class VisibilityBatchIn(_Strict):
    entries: list[VisibilityEntry] = Field(min_length=1, max_length=limits.MAX_BATCH)


class DeleteBatchIn(_Strict):
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


class ReceiveIn(_Strict):
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


class CheckpointIn(_Strict):
    cursor: Cursor
    timeout: int | None = Field(
        default=None, ge=limits.VISIBILITY_TIMEOUT[0], le=limits.VISIBILITY_TIMEOUT[1],
        strict=True,
        description="Renew the lease by this many seconds; default the queue's "
        "visibility_timeout.",
    )


class ReleaseIn(_Strict):
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


class DeadLetterSourcesOut(BaseModel):
    queues: list[str]


class RedriveIn(_Strict):
    destination: QueueName | None = Field(
        default=None, description="Default: each message's own source queue."
    )
    max_per_second: int | None = Field(default=None, ge=1, le=100_000, strict=True)


class RedriveTaskOut(BaseModel):
    task_id: str
    source: str
    destination: str | None
    status: str
    moved: int
    remaining: int
    to_move_at_start: int
    max_per_second: int | None
    failure: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, task: RedriveTask) -> RedriveTaskOut:
        return cls(**asdict(task))


class RedriveTaskList(BaseModel):
    tasks: list[RedriveTaskOut]
