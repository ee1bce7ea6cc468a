"""What the REST API answers, as plain frozen dataclasses parsed from its JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value)


@dataclass(frozen=True)
class Message:
    """A received message. `lease_seconds` is the lease to measure on your own
    monotonic clock; `lease_expires_at` is the server's time, for information only."""

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
    message_id: str
    sent_at: datetime

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sent:
        return cls(message_id=str(data["message_id"]), sent_at=_time(data["sent_at"]))


@dataclass(frozen=True)
class OutgoingMessage:
    """One entry of `send_batch`."""

    body: str
    delay: int | None = None
    attributes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"body": self.body}
        if self.delay is not None:
            out["delay"] = self.delay
        if self.attributes:
            out["attributes"] = dict(self.attributes)
        return out
