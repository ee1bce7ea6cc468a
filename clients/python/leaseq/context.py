"""What a handler gets besides its message: the fencing token, the cancellation
token of the watchdog, and checkpoints.

Sync handlers get a `Context` (blocking `checkpoint`), async handlers an
`AsyncContext` (`await ctx.checkpoint(...)`). Both answer `cancelled`,
`cancel_reason` and `raise_if_cancelled()`: a sync handler cannot be interrupted
from outside, so it checks between units of work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from leaseq.client import AsyncClient
from leaseq.errors import CancelReason, HandlerCancelled
from leaseq.lease import LeaseClock, save_checkpoint
from leaseq.models import Lease, Message

CHECKPOINT_WAIT = 120.0


class _Base:
    def __init__(
        self,
        message: Message,
        queue: str,
        lease: LeaseClock,
        loop: asyncio.AbstractEventLoop,
        client: Callable[[], AsyncClient],
    ) -> None:
        self.message = message
        self.queue = queue
        self._lease = lease
        # Where this message's lease writes go: the heartbeat's loop and client.
        self._loop = loop
        self._client = client

    @property
    def fencing_token(self) -> int:
        """Strictly larger on every claim: pass it to downstream writes and let them
        refuse a token older than the newest they have seen."""
        return self.message.fencing_token

    @property
    def cancelled(self) -> bool:
        """True once the handler must stop: the lease was lost, ran out on this
        worker's monotonic clock, or the worker is shutting down."""
        return self._lease.cancelled

    @property
    def cancel_reason(self) -> CancelReason | None:
        """Why the handler was cancelled, or None."""
        if not self._lease.cancelled:
            return None
        return self._lease.reason

    @property
    def lease_remaining(self) -> float:
        """Seconds left on the lease by this worker's monotonic clock."""
        return self._lease.remaining()

    def raise_if_cancelled(self) -> None:
        """Raise `HandlerCancelled` if the handler must stop."""
        if self._lease.cancelled:
            reason = self._lease.reason
            raise HandlerCancelled(reason if reason is not None else CancelReason.LEASE_EXPIRED)

    def _checkpoint_call(self, cursor: Any) -> Coroutine[Any, Any, Lease | None]:
        return save_checkpoint(self._lease, self._client(), self.queue, cursor)

    def _granted(self, granted: Lease | None) -> Lease:
        if granted is None:
            self.raise_if_cancelled()
            raise HandlerCancelled(CancelReason.LEASE_LOST)  # pragma: no cover - fired above
        return granted


class Context(_Base):
    """The context of a sync handler (which runs in a thread of its own)."""

    def checkpoint(self, cursor: Any) -> Lease:
        """Record `cursor` (any JSON) for this message and renew its lease by the
        worker's full lease (never shortening it). The next receive of the message
        returns it as `message.checkpoint`. Raises `HandlerCancelled` when the claim
        is gone."""
        self.raise_if_cancelled()
        future = asyncio.run_coroutine_threadsafe(self._checkpoint_call(cursor), self._loop)
        # The request has its own HTTP timeout; this only bounds a loop that has gone.
        return self._granted(future.result(timeout=CHECKPOINT_WAIT))


class AsyncContext(_Base):
    """The context of an async handler."""

    async def checkpoint(self, cursor: Any) -> Lease:
        """Record `cursor` (any JSON) for this message and renew its lease by the
        worker's full lease (never shortening it). The next receive of the message
        returns it as `message.checkpoint`. Raises `HandlerCancelled` when the claim
        is gone."""
        self.raise_if_cancelled()
        call = self._checkpoint_call(cursor)
        if self._loop is asyncio.get_running_loop():
            granted = await call
        else:
            granted = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, self._loop))
        return self._granted(granted)
