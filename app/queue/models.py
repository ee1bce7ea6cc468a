"""Plain values the queue engine takes and returns (no HTTP, no SQL)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.queue.floors import Floors
    from app.queue.kinds import QueueKind
    from app.queue.receipts import Receipt
    from app.queue.tally import Tally

JSON = Any


@dataclass(frozen=True)
class RetryBackoff:
    """The retry ladder: a release without a delay waits
    min(max, initial * multiplier^(receive_count - 1)), less up to `jitter` of it."""

    initial: float
    multiplier: float
    max: float
    jitter: float


@dataclass(frozen=True)
class Fairness:
    """When a tenant of a fair queue is noisy (SQS's published thresholds by
    default): more than `in_flight_share` of the queue's messages in flight and
    at least `in_flight_min` of its own, or more than `processing_share` of the
    queue's recent processing time."""

    in_flight_share: float = 0.1
    in_flight_min: int = 30
    processing_share: float = 0.1


@dataclass(frozen=True)
class QueueAttributes:
    visibility_timeout: int
    message_retention: int
    delay: int
    receive_wait: int
    max_message_bytes: int
    dead_letter_queue: str | None = None
    max_receive_count: int | None = None
    retry_backoff: RetryBackoff | None = None
    # FIFO (fixed when the queue is created) and what only FIFO queues have.
    fifo: bool = False
    content_based_deduplication: bool = False
    deduplication_scope: str = "queue"  # or "message_group"
    fifo_throughput_limit: str = "per_queue"  # or "per_message_group_id"
    # A standard queue becomes fair with its first message naming a tenant
    # (app/queue/kinds.py FAIR); the thresholds may be set before.
    fair: bool = False
    fairness: Fairness = field(default_factory=Fairness)
    # The SQS door's settings, stored and returned as given and applied to
    # nothing: the queue policy (SQS's JSON text) and the encryption settings.
    policy: str | None = None
    kms_master_key_id: str | None = None
    kms_data_key_reuse_period: int = 300
    sqs_managed_sse: bool = True
    # SQS's RedriveAllowPolicy, its text as given, and what the engine enforces
    # of it: the queues that may name this one as their dead-letter queue (None:
    # any queue; empty: none).
    redrive_allow_policy: str | None = None
    redrive_sources: tuple[str, ...] | None = None


def _floors() -> Floors:
    from app.queue.floors import Floors  # floors reads the rows, which name no model

    return Floors()


def _tally() -> Tally:
    from app.queue.tally import Tally  # the tally reads the statements, which name the rows

    return Tally()


@dataclass(frozen=True)
class Queue:
    id: int
    name: str
    attributes: QueueAttributes
    created_at: datetime
    updated_at: datetime
    dead_letter_queue_id: int | None = None
    deduplicates_by: str = "queue"
    """The deduplication scope a FIFO queue was created with, which it keeps
    deduplicating by whatever its attribute says later (SQS's behaviour)."""
    floors: Floors = field(default_factory=lambda: _floors(), repr=False, compare=False)
    """Where this process's claims of a standard queue start reading (app/queue/
    floors.py): the catalog hands every Queue of one id the same; a Queue made
    elsewhere starts from the beginning, which is always safe."""
    tally: Tally = field(default_factory=lambda: _tally(), repr=False, compare=False)
    """What this process counts of a fair queue's tenants (app/queue/tally.py):
    the catalog hands every Queue the one its service flushes; a Queue made
    elsewhere counts into one that is never written (the share is advisory)."""
    kind: QueueKind = field(init=False, repr=False, compare=False)
    """Standard or FIFO: its statements and rules (app/queue/kinds.py), chosen
    here, once, from the attributes."""

    def __post_init__(self) -> None:
        from app.queue.kinds import kind_of  # the kinds' statements name Queue

        object.__setattr__(self, "kind", kind_of(self.attributes))


@dataclass(frozen=True)
class TenantBacklog:
    tenant: str
    visible: int
    in_flight: int
    noisy: bool


@dataclass(frozen=True)
class TenantStats:
    """A fair queue's tenants (SQS's ApproximateNumberOfNoisyGroups and the
    quiet groups' counts); a message naming no tenant counts as quiet."""

    noisy_tenants: int
    quiet_visible: int
    quiet_in_flight: int
    quiet_oldest_age_seconds: float
    top: list[TenantBacklog]
    """The tenants with the most messages stored, most first."""


@dataclass(frozen=True)
class QueueStats:
    visible: int
    in_flight: int
    delayed: int
    oldest_age_seconds: float
    tenants: TenantStats | None = None  # fair queues


@dataclass(frozen=True)
class MessageAttribute:
    """A typed message attribute, as SQS has them. `data_type` is String, Number or
    Binary, optionally with a custom suffix (`Number.int`, `Binary.png`); Binary
    ones carry `binary_value`, the others `string_value`."""

    data_type: str
    string_value: str | None = None
    binary_value: bytes | None = None


@dataclass(frozen=True)
class OutgoingMessage:
    body: str
    attributes: dict[str, str] = field(default_factory=dict)
    delay: int | None = None  # None: the queue's default
    not_before: datetime | None = None  # judged against the database's clock
    # Typed attributes (the SQS front door); when given, `attributes` is ignored.
    typed_attributes: dict[str, MessageAttribute] | None = None
    sender_id: str | None = None
    group_id: str | None = None  # FIFO: required there; a standard queue: the tenant, if any
    deduplication_id: str | None = None  # FIFO: else the body's SHA-256, if the queue says so
    # SQS's AWSTraceHeader system attribute: kept and given back, never counted in the size.
    trace_header: str | None = None


@dataclass(frozen=True)
class SentMessage:
    message_id: str
    sent_at: datetime
    sequence_number: str | None = None  # FIFO queues


@dataclass(frozen=True)
class ReceivedMessage:
    message_id: str
    body: str
    attributes: dict[str, str]
    receipt_handle: str
    receive_count: int
    fencing_token: int
    visibility_timeout: int
    lease_expires_at: datetime
    sent_at: datetime
    first_received_at: datetime
    checkpoint: JSON
    claim: Receipt
    """What `receipt_handle` signs, for the engine's own use within the request
    (undoing or recording the claim) without decoding the handle again."""
    # Every attribute with its type: `attributes` as String ones, plus the typed.
    typed_attributes: dict[str, MessageAttribute] = field(default_factory=dict)
    sender_id: str | None = None
    group_id: str | None = None  # FIFO queues; a standard queue's message's tenant
    sequence_number: str | None = None
    deduplication_id: str | None = None
    trace_header: str | None = None  # SQS's AWSTraceHeader, when the sender set one
    dead_letter_source_id: int | None = None  # the queue it was dead-lettered from


@dataclass(frozen=True)
class Lease:
    """What a successful heartbeat, release or checkpoint leaves."""

    visibility_timeout: int
    lease_expires_at: datetime


@dataclass(frozen=True)
class Released:
    """What a release leaves: visible again after this delay (database clock)."""

    delay_seconds: float
    visible_at: datetime


@dataclass(frozen=True)
class EntryError:
    """One failed entry of a batch; `error` is the exception the single form raises."""

    error: Exception


@dataclass(frozen=True)
class PeekedMessage:
    """A message as an operator sees it, without claiming it."""

    message_id: str
    body: str
    truncated: bool
    attributes: dict[str, str]
    state: str
    receive_count: int
    sent_at: datetime
    first_received_at: datetime | None
    visible_at: datetime
    checkpoint: JSON
    dead_letter_source: str | None
    fencing_token: int | None
    """The holder's token while the message is in flight."""
    lease_remaining_seconds: float | None
    """What is left of the lease while the message is in flight, on the database's clock."""
    cursor: str
    group: str | None = None
    """Its group: a FIFO queue's, or the tenant a standard queue's message named."""


@dataclass(frozen=True)
class RedriveTask:
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
