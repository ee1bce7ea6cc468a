"""Plain values the queue engine takes and returns (no HTTP, no SQL)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

JSON = Any


@dataclass(frozen=True)
class QueueAttributes:
    visibility_timeout: int
    message_retention: int
    delay: int
    receive_wait: int
    max_message_bytes: int


@dataclass(frozen=True)
class Queue:
    id: int
    name: str
    attributes: QueueAttributes
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class QueueStats:
    visible: int
    in_flight: int
    delayed: int
    oldest_age_seconds: float


@dataclass(frozen=True)
class OutgoingMessage:
    body: str
    attributes: dict[str, str] = field(default_factory=dict)
    delay: int | None = None  # None: the queue's default


@dataclass(frozen=True)
class SentMessage:
    message_id: str
    sent_at: datetime


@dataclass(frozen=True)
class ReceivedMessage:
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
    checkpoint: JSON


@dataclass(frozen=True)
class Lease:
    """What a successful heartbeat, release or checkpoint leaves."""

    lease_seconds: int
    lease_expires_at: datetime


@dataclass(frozen=True)
class EntryError:
    """One failed entry of a batch; `error` is the exception the single form raises."""

    error: Exception
