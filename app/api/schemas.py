"""Request and response bodies of the REST API, with the limits of app.queue.limits."""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
)

from app.queue import limits
from app.queue.models import Queue, QueueStats, ReceivedMessage

MAX_CURSOR_BYTES = 64 * 1024


def _is_sqs_char(ch: str) -> bool:
    # The characters SQS accepts in a message (XML 1.0's Char production):
    # no NUL or other C0 controls but tab/newline/return, no lone surrogates.
    code = ord(ch)
    return (
        code in (0x9, 0xA, 0xD)
        or 0x20 <= code <= 0xD7FF
        or 0xE000 <= code <= 0xFFFD
        or 0x10000 <= code <= 0x10FFFF
    )


def _sqs_text(value: str) -> str:
    for ch in value:
        if not _is_sqs_char(ch):
            raise ValueError(f"contains a character SQS does not allow: U+{ord(ch):04X}")
    return value


def _storable_json(value: Any) -> Any:
    """A JSON value PostgreSQL's jsonb can store: no NUL, no lone surrogates, finite numbers."""

    def walk(node: Any, depth: int) -> None:
        if depth > 64:
            raise ValueError("is nested too deeply (at most 64 levels)")
        if isinstance(node, str):
            _sqs_text(node)
        elif isinstance(node, float) and not math.isfinite(node):
            raise ValueError("contains a number JSON cannot represent")
        elif isinstance(node, dict):
            for key, item in node.items():
                _sqs_text(key)
                walk(item, depth + 1)
        elif isinstance(node, list):
            for item in node:
                walk(item, depth + 1)

    walk(value, 0)
    if len(json.dumps(value)) > MAX_CURSOR_BYTES:
        raise ValueError(f"is larger than {MAX_CURSOR_BYTES} bytes")
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
Body = Annotated[str, Field(min_length=1), AfterValidator(_sqs_text)]
Attributes = Annotated[dict[str, str], AfterValidator(_attribute_map)]
Cursor = Annotated[Any, AfterValidator(_storable_json)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QueueAttributesIn(_Strict):
    visibility_timeout: int | None = _ranged(limits.VISIBILITY_TIMEOUT)
    message_retention: int | None = _ranged(limits.MESSAGE_RETENTION)
    delay: int | None = _ranged(limits.DELAY)
    receive_wait: int | None = _ranged(limits.RECEIVE_WAIT)
    max_message_bytes: int | None = _ranged(limits.MAX_MESSAGE_BYTES)

    def given(self) -> dict[str, int]:
        return {k: v for k, v in self.model_dump().items() if k != "name" and v is not None}


class QueueCreate(QueueAttributesIn):
    name: QueueName


class QueueAttributesOut(BaseModel):
    visibility_timeout: int
    message_retention: int
    delay: int
    receive_wait: int
    max_message_bytes: int


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
            attributes=QueueAttributesOut(**queue.attributes.__dict__),
            created_at=queue.created_at,
            updated_at=queue.updated_at,
        )


class QueueDetail(QueueOut):
    stats: StatsOut

    @classmethod
    def with_stats(cls, queue: Queue, stats: QueueStats) -> QueueDetail:
        return cls(**QueueOut.of(queue).model_dump(), stats=StatsOut(**stats.__dict__))


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
    attributes: Attributes = Field(default_factory=dict)


class MessageBatchIn(_Strict):
    messages: list[MessageIn] = Field(min_length=1)


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

    @classmethod
    def of(cls, message: ReceivedMessage) -> ReceivedOut:
        return cls(**message.__dict__)


class ReceiveOut(BaseModel):
    messages: list[ReceivedOut]


class VisibilityIn(_Strict):
    timeout: int = Field(ge=limits.VISIBILITY_TIMEOUT[0], le=limits.VISIBILITY_TIMEOUT[1],
                         strict=True)


class LeaseOut(BaseModel):
    lease_seconds: int
    lease_expires_at: datetime


class VisibilityEntry(VisibilityIn):
    receipt_handle: str


class VisibilityBatchIn(_Strict):
    entries: list[VisibilityEntry] = Field(min_length=1)


class DeleteBatchIn(_Strict):
    receipt_handles: list[str] = Field(min_length=1)


class CheckpointIn(_Strict):
    cursor: Cursor
