"""One claim's lease as this worker sees it, its heartbeat and its watchdog.

The deadline lives on this process's monotonic clock. It starts when the
receive request is *sent* (the service starts the lease later than that, never
earlier, so the local deadline is never later than the service's) and moves
only when an extension or checkpoint succeeds: to the moment that request was
sent plus the seconds granted (both ask for the full lease). `lease_expires_at`
from the service is never used: it is another machine's wall clock.

The watchdog is `LeaseClock.cancel`: the first reason given wins, the handler's
cancellation callbacks run once, and the worker will not acknowledge.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from leaseq.client import AsyncClient
from leaseq.errors import (
    ApiError,
    CancelReason,
    InvalidReceiptHandle,
    LeaseLost,
    QueueNotFound,
    Unreachable,
)
from leaseq.models import Lease

log = logging.getLogger("leaseq.worker")

T = TypeVar("T")

LOST = (LeaseLost, QueueNotFound, InvalidReceiptHandle)
"""Answers that mean the claim is gone for good: stop the handler."""

MIN_RETRY = 0.05


class LeaseClock:
    """The deadline of one claim on the monotonic clock, and its cancellation token."""

    def __init__(
        self,
        handle: str,
        seconds: int,
        sent_at: float,
        period: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if seconds <= 0:
            raise ValueError("a lease must last at least one second")
        self.handle = handle
        self.lease_seconds = seconds
        self.period = period if period is not None else seconds / 3
        if not 0 < self.period < seconds:
            raise ValueError("the heartbeat period must be shorter than the lease")
        self.clock = clock
        self._lock = threading.Lock()
        self._renewed_from = sent_at
        self._deadline = sent_at + seconds
        self._next_beat = sent_at + self.period
        self._fired = threading.Event()
        self._reason: CancelReason | None = None
        self._closed = False
        self._callbacks: list[Callable[[CancelReason], None]] = []
        self.beats = 0
        self.failed_beats = 0

    @property
    def seconds(self) -> int:
        """The earlier name of `lease_seconds`."""
        return self.lease_seconds

    # -- the deadline ---------------------------------------------------------------

    @property
    def deadline(self) -> float:
        with self._lock:
            return self._deadline

    @property
    def next_beat(self) -> float:
        with self._lock:
            return self._next_beat

    def remaining(self) -> float:
        """Seconds left before the lease may be someone else's (negative: past)."""
        return self.deadline - self.clock()

    def expired(self) -> bool:
        return self.remaining() <= 0

    def renewed(self, sent_at: float, granted: int) -> None:
        """An extension or checkpoint sent at `sent_at` was granted `granted` seconds."""
        with self._lock:
            if sent_at < self._renewed_from:  # an older answer arriving late
                return
            self._renewed_from = sent_at
            self._deadline = sent_at + granted
            # A shorter grant than the lease (the service's answer rules) beats sooner.
            self._next_beat = sent_at + self.period * min(1.0, granted / self.lease_seconds)

    def beat_failed(self, at: float) -> None:
        """Retry after half a period (the lease tolerates a few failures in a row)."""
        with self._lock:
            self._next_beat = max(self._next_beat, at + max(self.period / 2, MIN_RETRY))

    # -- the watchdog --------------------------------------------------------------

    @property
    def reason(self) -> CancelReason | None:
        """Why the watchdog fired, or None while it has not."""
        return self._reason

    @property
    def fired(self) -> bool:
        return self._fired.is_set()

    @property
    def cancelled(self) -> bool:
        """The handler must stop. Also true the moment the deadline passes, even
        before the heartbeat notices: a handler checking this never acts on an
        expired lease."""
        if self._fired.is_set():
            return True
        if self.expired():
            self.cancel(CancelReason.LEASE_EXPIRED)
            return self._fired.is_set()
        return False

    def cancel(self, reason: CancelReason) -> bool:
        """Fire the watchdog; the first reason wins. False when it had fired already
        or the lease is closed (the handler is done)."""
        with self._lock:
            if self._fired.is_set() or self._closed:
                return False
            self._reason = reason
            self._fired.set()
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback(reason)
            except Exception:
                log.exception("a cancellation callback failed")
        return True

    def on_cancel(self, callback: Callable[[CancelReason], None]) -> None:
        """Run `callback(reason)` when the watchdog fires (at once if it has)."""
        with self._lock:
            if not self._fired.is_set():
                self._callbacks.append(callback)
                return
            reason = self._reason
        assert reason is not None
        callback(reason)

    def close(self) -> None:
        """The handler is done: later failures no longer cancel anything."""
        with self._lock:
            self._closed = True


async def heartbeat(lease: LeaseClock, client: AsyncClient, queue: str) -> None:
    """Extend the lease by its full length every period until cancelled.

    A beat is not attempted once the lease is past on the monotonic clock (it
    could extend nothing we still hold): the watchdog fires instead. A beat in
    flight is abandoned at the deadline. `409 lease_lost` fires the watchdog at
    once; network errors and 5xx are retried after half a period.
    """
    while not lease.cancelled and not lease.expired():
        now = lease.clock()
        due = min(lease.next_beat, lease.deadline)
        if now < due:
            await asyncio.sleep(due - now)
            continue
        sent = lease.clock()
        try:
            async with asyncio.timeout(max(lease.deadline - sent, 0.0)):
                granted = await client.extend(
                    queue, lease.handle, lease.lease_seconds,
                    request_timeout=max(lease.period, MIN_RETRY),
                )
        except LOST as exc:
            log.warning("heartbeat for %s: %s", _short(lease.handle), exc)
            lease.cancel(CancelReason.LEASE_LOST)
            return
        except (TimeoutError, Unreachable, ApiError) as exc:
            lease.failed_beats += 1
            log.warning("heartbeat for %s failed: %r", _short(lease.handle), exc)
            lease.beat_failed(sent)
            continue
        lease.beats += 1
        lease.renewed(sent, granted.lease_seconds)


async def save_checkpoint(
    lease: LeaseClock, client: AsyncClient, queue: str, cursor: Any
) -> Lease | None:
    """PUT the cursor; the service renews the lease with it by this lease's full
    length (`timeout`), so a checkpoint never shortens it, whatever the queue's
    visibility_timeout. None when the claim is gone (the watchdog has fired)."""
    if lease.cancelled:
        return None
    sent = lease.clock()
    try:
        granted = await client.checkpoint(queue, lease.handle, cursor, timeout=lease.lease_seconds)
    except LOST as exc:
        log.warning("checkpoint for %s: %s", _short(lease.handle), exc)
        lease.cancel(CancelReason.LEASE_LOST)
        return None
    lease.renewed(sent, granted.lease_seconds)
    return granted


def _short(handle: str) -> str:
    return handle[-12:]


class HeartbeatThread:
    """A thread with its own event loop and HTTP client, where the heartbeats of
    handlers that may block the worker's event loop run: nothing a handler does
    on its own thread or loop can delay a beat."""

    def __init__(self, make_client: Callable[[], AsyncClient]) -> None:
        self._make_client = make_client
        self.loop = asyncio.new_event_loop()
        self._client: AsyncClient | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leaseq-heartbeat", daemon=True)
        self._thread.start()
        self._ready.wait()

    @property
    def client(self) -> AsyncClient:
        assert self._client is not None
        return self._client

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._client = self._make_client()
        self._ready.set()
        try:
            self.loop.run_forever()
            self.loop.run_until_complete(self._shutdown())
        finally:
            self.loop.close()

    async def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks(self.loop) if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.client.aclose()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
