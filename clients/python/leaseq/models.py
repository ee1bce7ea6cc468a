"""What the REST API answers, as plain frozen dataclasses parsed from its JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from leaseq.tracing import TRACEPARENT, current_traceparent

if TYPE_CHECKING:
    from leaseq.errors import ApiError


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value)


def _maybe_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _maybe_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _maybe_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class Message:
    """A received message. `lease_seconds` is the lease to measure on your own
    monotonic clock; `lease_expires_at` is the server's time, for information only.
    On a FIFO queue `group`, `sequence_number` and `deduplication_id` are set;
    on a standard queue `group` is the tenant it was sent with, if any."""

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
    checkpoint: Any = None
    group: str | None = None
    sequence_number: str | None = None
    deduplication_id: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Message:
        return cls(
            message_id=str(data["message_id"]),
            body=str(data["body"]),
            attributes=dict(data.get("attributes") or {}),
            receipt_handle=str(data["receipt_handle"]),
            receive_count=int(data["receive_count"]),
            fencing_token=int(data["fencing_token"]),
            lease_seconds=int(data["lease_seconds"]),
            lease_expires_at=_time(data["lease_expires_at"]),
            sent_at=_time(data["sent_at"]),
            first_received_at=_time(data["first_received_at"]),
            checkpoint=data.get("checkpoint"),
            group=_maybe_str(data.get("group")),
            sequence_number=_maybe_str(data.get("sequence_number")),
            deduplication_id=_maybe_str(data.get("deduplication_id")),
        )


@dataclass(frozen=True)
class Lease:
    """The answer to an extension or a checkpoint: the lease now lasts
    `lease_seconds` from the moment the request was sent (at the latest)."""

    lease_seconds: int
    lease_expires_at: datetime

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lease:
        return cls(
            lease_seconds=int(data["lease_seconds"]),
            lease_expires_at=_time(data["lease_expires_at"]),
        )


@dataclass(frozen=True)
class Settled:
    """What a receive that brought acknowledgements and extensions answers: the
    messages it claimed, and one result per entry sent, in order (`None` or the
    `Lease` on success, the entry's error otherwise; errors are not raised)."""

    messages: list[Message]
    deleted: list[ApiError | None]
    extended: list[Lease | ApiError]


@dataclass(frozen=True)
class Released:
    """The answer to a release: the message is visible again `delay_seconds` after
    the service ran the release (the delay asked for, else the queue's retry ladder's,
    else 0); `visible_at` is the server's time, for information only."""

    delay_seconds: float
    visible_at: datetime

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Released:
        return cls(
            delay_seconds=float(data["delay_seconds"]),
            visible_at=_time(data["visible_at"]),
        )


@dataclass(frozen=True)
class Sent:
    """A message sent. `sequence_number` (FIFO queues only, else None): its place in
    the queue, strictly increasing; a duplicate is answered with the first one's
    `message_id` and `sequence_number`."""

    message_id: str
    sent_at: datetime
    sequence_number: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sent:
        return cls(
            message_id=str(data["message_id"]), sent_at=_time(data["sent_at"]),
            sequence_number=_maybe_str(data.get("sequence_number")),
        )


@dataclass(frozen=True)
class OutgoingMessage:
    """One entry of `send_batch`. On a FIFO queue `group` is required, and
    `deduplication_id` too unless the queue has `content_based_deduplication`;
    a FIFO message takes no `delay`. On a standard queue `group` names the
    message's tenant (fair queues)."""

    body: str
    delay: int | None = None
    attributes: dict[str, str] = field(default_factory=dict)
    group: str | None = None
    deduplication_id: str | None = None

    def __post_init__(self) -> None:
        # Made where the sender is: its current span is the message's trace
        # (unless the sender set a traceparent of its own).
        if TRACEPARENT not in self.attributes:
            traceparent = current_traceparent()
            if traceparent is not None:
                object.__setattr__(
                    self, "attributes", {**self.attributes, TRACEPARENT: traceparent}
                )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"body": self.body}
        if self.delay is not None:
            out["delay"] = self.delay
        if self.attributes:
            out["attributes"] = dict(self.attributes)
        if self.group is not None:
            out["group"] = self.group
        if self.deduplication_id is not None:
            out["deduplication_id"] = self.deduplication_id
        return out


def _maybe_time(value: str | None) -> datetime | None:
    return None if value is None else _time(value)


@dataclass(frozen=True)
class RetryBackoff:
    """A queue's retry ladder: the delay of the n-th failed attempt is
    initial * multiplier^(n-1), at most `max` seconds, less up to `jitter` of it."""

    initial: float
    multiplier: float
    max: float
    jitter: float


@dataclass(frozen=True)
class QueueAttributes:
    """A queue's attributes. `fifo` is fixed at creation; `content_based_deduplication`,
    `deduplication_scope` ("queue" or "message_group") and `fifo_throughput_limit`
    ("per_queue" or "per_message_group_id") matter on FIFO queues only (the defaults
    when the service does not say)."""

    visibility_timeout: int
    message_retention: int
    delay: int
    receive_wait: int
    max_message_bytes: int
    dead_letter_queue: str | None
    max_receive_count: int | None
    retry_backoff: RetryBackoff | None
    fifo: bool = False
    content_based_deduplication: bool = False
    deduplication_scope: str = "queue"
    fifo_throughput_limit: str = "per_queue"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QueueAttributes:
        ladder = data.get("retry_backoff")
        return cls(
            visibility_timeout=int(data["visibility_timeout"]),
            message_retention=int(data["message_retention"]),
            delay=int(data["delay"]),
            receive_wait=int(data["receive_wait"]),
            max_message_bytes=int(data["max_message_bytes"]),
            dead_letter_queue=data.get("dead_letter_queue"),
            max_receive_count=data.get("max_receive_count"),
            retry_backoff=None if ladder is None else RetryBackoff(
                initial=float(ladder["initial"]), multiplier=float(ladder["multiplier"]),
                max=float(ladder["max"]), jitter=float(ladder["jitter"]),
            ),
            fifo=bool(data.get("fifo", False)),
            content_based_deduplication=bool(data.get("content_based_deduplication", False)),
            deduplication_scope=str(data.get("deduplication_scope") or "queue"),
            fifo_throughput_limit=str(data.get("fifo_throughput_limit") or "per_queue"),
        )


@dataclass(frozen=True)
class QueueStats:
    """Counted live when the queue was read."""

    visible: int
    in_flight: int
    delayed: int
    oldest_age_seconds: float


@dataclass(frozen=True)
class Queue:
    """A queue; `stats` only when read one at a time (`get_queue`)."""

    name: str
    attributes: QueueAttributes
    created_at: datetime
    updated_at: datetime
    stats: QueueStats | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Queue:
        stats = data.get("stats")
        return cls(
            name=str(data["name"]),
            attributes=QueueAttributes.from_json(data["attributes"]),
            created_at=_time(data["created_at"]),
            updated_at=_time(data["updated_at"]),
            stats=None if stats is None else QueueStats(
                visible=int(stats["visible"]), in_flight=int(stats["in_flight"]),
                delayed=int(stats["delayed"]),
                oldest_age_seconds=float(stats["oldest_age_seconds"]),
            ),
        )


@dataclass(frozen=True)
class QueuePage:
    """One page of `list_queues`; pass `next_after` as `after` for the next (None: last)."""

    queues: list[Queue]
    next_after: str | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QueuePage:
        return cls([Queue.from_json(q) for q in data["queues"]], data.get("next_after"))


@dataclass(frozen=True)
class PeekedMessage:
    """A message as an operator sees it, unclaimed; `body` cut to the asked length
    (`truncated` says so)."""

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
    fencing_token: int | None = None
    """While in flight: the holder's token."""
    lease_remaining_seconds: float | None = None
    """While in flight: seconds left of the lease, on the server's database clock."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PeekedMessage:
        return cls(
            message_id=str(data["message_id"]), body=str(data["body"]),
            truncated=bool(data["truncated"]), attributes=dict(data.get("attributes") or {}),
            state=str(data["state"]), receive_count=int(data["receive_count"]),
            sent_at=_time(data["sent_at"]),
            first_received_at=_maybe_time(data.get("first_received_at")),
            visible_at=_time(data["visible_at"]), checkpoint=data.get("checkpoint"),
            dead_letter_source=data.get("dead_letter_source"),
            fencing_token=_maybe_int(data.get("fencing_token")),
            lease_remaining_seconds=_maybe_float(data.get("lease_remaining_seconds")),
        )


@dataclass(frozen=True)
class PeekPage:
    messages: list[PeekedMessage]
    next_after: str | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PeekPage:
        return cls([PeekedMessage.from_json(m) for m in data["messages"]],
                   data.get("next_after"))


@dataclass(frozen=True)
class RedriveTask:
    """A dead-letter queue's messages moving back; `remaining` is counted live."""

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
    def from_json(cls, data: dict[str, Any]) -> RedriveTask:
        return cls(
            task_id=str(data["task_id"]), source=str(data["source"]),
            destination=data.get("destination"), status=str(data["status"]),
            moved=int(data["moved"]), remaining=int(data["remaining"]),
            to_move_at_start=int(data["to_move_at_start"]),
            max_per_second=data.get("max_per_second"), failure=data.get("failure"),
            created_at=_time(data["created_at"]), updated_at=_time(data["updated_at"]),
        )
