"""One received message while the worker holds it, and what became of it.

The receiver makes a `Job` of each message it claims, the runner takes it through
its life, the FIFO order decides when it may start; `Outcome` and `WorkerStats`
are what the worker tells of them afterwards.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from leaseq.lease import LeaseClock
from leaseq.models import Message


class Outcome(enum.StrEnum):
    """What became of one received message."""

    ACKNOWLEDGED = "acknowledged"
    """Deleted over HTTP once its handler returned, or deleted by the handler in its
    own transaction (`ctx.ack_with(conn)`), counted when the handler returns: the
    worker cannot see that transaction commit (`WorkerStats.acknowledged_in_transaction`
    counts these)."""
    ACK_REJECTED = "acknowledgement rejected"
    RELEASED = "released"
    ABANDONED = "abandoned"
    RETURNED = "returned unhandled"
    """FIFO: released without running the handler, after a message before it in
    its group was not acknowledged (or at shutdown)."""


@dataclass
class WorkerStats:
    received: int = 0
    acknowledged: int = 0
    acknowledged_in_transaction: int = 0  # of those, by the handler (ctx.ack_with)
    ack_rejected: int = 0
    failed: int = 0  # the handler raised
    released: int = 0
    abandoned: int = 0  # the watchdog fired: neither acknowledged nor released
    returned: int = 0  # FIFO: released unhandled, for its group to be redelivered in order
    beats: int = 0
    failed_beats: int = 0
    recent: deque[tuple[str, int, Outcome]] = field(default_factory=lambda: deque(maxlen=1000))
    """(message id, fencing token, outcome) of the last thousand messages settled."""


def lease_clock(message: Message, sent_at: float, heartbeat_period: float | None) -> LeaseClock:
    """The lease of a message whose receive was sent at `sent_at` (the service
    starts it later, never earlier), beaten every `heartbeat_period` seconds
    (None, or not shorter than the lease: every third of the lease)."""
    lease_seconds = message.lease_seconds
    if heartbeat_period is not None and heartbeat_period < lease_seconds:
        period = heartbeat_period
    else:
        period = lease_seconds / 3
    return LeaseClock(message.receipt_handle, lease_seconds, sent_at, period=period)


class Job:
    """One received message while this worker holds it."""

    def __init__(
        self,
        message: Message,
        lease: LeaseClock,
        batch: int = 0,
        on_free: Callable[[], None] | None = None,
    ) -> None:
        self.message = message
        self.lease = lease
        self.settled = False
        self.batch = batch  # the receive that brought it (numbered from 1)
        self.freed = False  # its acknowledgement is queued: its slot is free
        self.outcome: Outcome | None = None
        # The handler deleted it in its own transaction (ctx.ack_with): the
        # worker neither beats for it nor acknowledges it.
        self.acked_in_transaction = False
        # FIFO: resolved True when it may run (the messages before it in its
        # group are settled), False when it is to be released unhandled.
        self.turn: asyncio.Future[bool] | None = None
        self._on_free = on_free

    @property
    def group(self) -> str | None:
        return self.message.group

    def free(self) -> None:
        """Its acknowledgement is queued: the receiver may fill its slot, and the
        receive that does can carry the acknowledgement."""
        self.freed = True
        if self._on_free is not None:
            self._on_free()

    def __str__(self) -> str:
        return f"message {self.message.message_id} (fencing {self.message.fencing_token})"
