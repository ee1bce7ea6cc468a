"""What a handler gets besides its message: the fencing token, the cancellation
token of the watchdog, checkpoints, and acknowledging in its own transaction.

Sync handlers get a `Context` (blocking `checkpoint`), async handlers an
`AsyncContext` (`await ctx.checkpoint(...)`). Both answer `cancelled`,
`cancel_reason` and `raise_if_cancelled()`: a sync handler cannot be interrupted
from outside, so it checks between units of work. Both have `ack_with(conn)`,
awaited with an async connection and called plainly with a sync one, whichever
kind the handler is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, overload

from leaseq import sql
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
        acked_in_transaction: Callable[[], None] | None = None,
    ) -> None:
        """`acked_in_transaction`: called once `ack_with` has deleted the message."""
        self.message = message
        self.queue = queue
        self._lease = lease
        # Where this message's lease writes go: the heartbeat's loop and client.
        self._loop = loop
        self._client = client
        self._acked_in_transaction = acked_in_transaction

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

    @overload
    def ack_with(self, conn: sql.AsyncConnectionLike) -> Coroutine[Any, Any, None]: ...
    @overload
    def ack_with(self, conn: sql.ConnectionLike) -> None: ...
    def ack_with(self, conn: Any) -> Coroutine[Any, Any, None] | None:
        """Acknowledge the message in the transaction open on `conn`, your own
        (`leaseq.sql.delete`): it is gone if that transaction commits, and comes
        back after its lease if it rolls back. From then on the worker no longer
        heartbeats it (its row stays locked until your transaction ends, so no
        receive claims it meanwhile, lease or not) and does not acknowledge it when
        the handler returns; if the handler raises, it is released as usual (a
        release the commit made moot is refused, harmlessly). Raises `LeaseLost`
        when the claim is gone already: the transaction cannot commit as intended.

        With an async connection (asyncpg, psycopg's `AsyncConnection`,
        SQLAlchemy's `AsyncSession`) `await ctx.ack_with(conn)`; with a sync one the
        call itself does it."""
        deleting = sql.delete(conn, self.queue, self.message.receipt_handle)
        if deleting is None:
            self._acked()
            return None
        return self._acked_after(deleting)

    async def _acked_after(self, deleting: Coroutine[Any, Any, None]) -> None:
        await deleting
        self._acked()

    def _acked(self) -> None:
        if self._acked_in_transaction is not None:
            self._acked_in_transaction()

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
