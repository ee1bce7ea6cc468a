"""One message's life in the worker: its heartbeat, its handler, then acknowledge or release.

1. The lease deadline is measured on the monotonic clock from the moment the
   receive request was sent (`leaseq.job.lease_clock`).
2. A heartbeat extends the lease by its full length every `lease / 3` seconds, on
   a path of its own: an asyncio task in the worker's loop for async handlers
   (`heartbeat="task"`), a thread with its own loop and HTTP client for sync
   handlers (`heartbeat="thread"`; async handlers that may block their loop should
   use it too). Long polls use yet another connection pool, so a poll never holds
   up a beat.
3. The watchdog cancels the handler at once when an extension answers
   `409 lease_lost`, or when the lease runs out on the monotonic clock because
   beats kept failing: an async handler's task is cancelled; a sync handler sees
   `ctx.cancelled` (and `ctx.cancel_reason`) turn true. Either way the message
   is neither acknowledged nor released: it is no longer ours.
4. On success the message is acknowledged (a conditional `DELETE`, by one of the
   routes of `leaseq.acks`; a rejection is logged and counted, never retried). On
   an exception it is released for another attempt (`POST .../release`): after
   the queue's retry ladder (`retry_backoff`) decides, or after the delay of the
   worker's own `Backoff` when it was given one.
5. A handler may acknowledge its message itself, in its own transaction
   (`ctx.ack_with(conn)`). From then on its row is locked by that transaction
   until it ends, and no receive can claim it, so the lease decides nothing any
   more: the heartbeat stops (a beat would only wait for the lock), the watchdog
   is disarmed (a shutdown no longer cancels the handler before its grace and
   `CANCEL_WAIT` are over), and on success the message is counted acknowledged
   without a request. On an exception it is released as in 4; that release is
   refused, harmlessly, when the transaction committed.

On a FIFO queue a message first waits for its turn in its group
(`leaseq.fifo_order`), heartbeated meanwhile; one whose turn does not come is
released unhandled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Literal

from leaseq import tracing
from leaseq.acks import ACK_RIDE_SECONDS, AckBatcher, Acked
from leaseq.backoff import Backoff
from leaseq.client import AsyncClient
from leaseq.context import AsyncContext, Context
from leaseq.errors import ApiError, CancelReason, HandlerCancelled, LeaseLost, Unreachable
from leaseq.fifo_order import GroupOrder
from leaseq.job import Job, Outcome, WorkerStats
from leaseq.lease import HeartbeatThread, heartbeat
from leaseq.models import Message, Released

log = logging.getLogger("leaseq.worker")

Handler = Callable[[Message, Any], Any]
"""`handler(message, ctx)`, a plain function (run in a thread of its own, gets a
`Context`) or a coroutine function (run in the worker's loop, gets an `AsyncContext`)."""

HandlerEnd = Literal["done", "cancelled", "failed"]

LOST_CLAIM = (CancelReason.LEASE_LOST, CancelReason.LEASE_EXPIRED)
"""Watchdog reasons after which the claim is (or may be) someone else's."""


def is_async_handler(handler: Callable[..., Any]) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 - objects with an async __call__
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


class Runner:
    """Takes each received message through its life, and records what became of it."""

    def __init__(
        self,
        handler: Handler,
        *,
        queue: str,
        is_async: bool,
        backoff: Backoff | None,
        stats: WorkerStats,
        control: AsyncClient,
        beats: HeartbeatThread | None,
        acks: AckBatcher,
        order: GroupOrder,
    ) -> None:
        """`control`: the worker's client for acknowledgements and releases (and
        heartbeats, without `beats`). `beats`: the heartbeat thread, where the
        beats and the checkpoints go when the handler may block this loop."""
        self.handler = handler
        self.queue = queue
        self.is_async = is_async
        self.backoff = backoff
        self.stats = stats
        self._control = control
        self._beats = beats
        self._acks = acks
        self._order = order

    async def run(self, job: Job) -> None:
        client: Callable[[], AsyncClient]
        if self._beats is not None:
            beats = self._beats
            beat_loop, client = beats.loop, (lambda: beats.client)
        else:
            control = self._control
            beat_loop, client = asyncio.get_running_loop(), (lambda: control)
        beat = asyncio.run_coroutine_threadsafe(
            heartbeat(job.lease, client(), self.queue), beat_loop
        )
        beat.add_done_callback(_report_heartbeat_crash)

        def acked_in_transaction() -> None:  # from the handler's thread, for a sync one
            job.acked_in_transaction = True
            job.lease.close()
            beat.cancel()

        run = True
        try:
            # FIFO: held (and heartbeated) until the messages before it in its
            # group are settled; False: release it unhandled.
            if job.turn is not None:
                # ...and not run once its claim is gone while it waited.
                run = await job.turn and not job.lease.cancelled
            if run:
                ended, error = await self._run_handler(
                    job, beat_loop, client, acked_in_transaction
                )
        finally:
            job.lease.close()
            beat.cancel()
            self.stats.beats += job.lease.beats
            self.stats.failed_beats += job.lease.failed_beats
        if job.settled:  # released by the shutdown already
            return
        job.settled = True
        if run:
            await self._settle(job, ended, error)
        else:
            await self.release_unhandled(job)

    async def _run_handler(
        self,
        job: Job,
        beat_loop: asyncio.AbstractEventLoop,
        client: Callable[[], AsyncClient],
        acked_in_transaction: Callable[[], None],
    ) -> tuple[HandlerEnd, BaseException | None]:
        """Runs the handler, in the span that continues its message's trace."""
        with tracing.processing(self.queue, job.message) as span:
            ended, error = await self._run_in_span(job, beat_loop, client, acked_in_transaction)
            if ended == "failed" and error is not None:
                span.failed(error)
        return ended, error

    async def _run_in_span(
        self,
        job: Job,
        beat_loop: asyncio.AbstractEventLoop,
        client: Callable[[], AsyncClient],
        acked_in_transaction: Callable[[], None],
    ) -> tuple[HandlerEnd, BaseException | None]:
        loop = asyncio.get_running_loop()
        lease = job.lease
        if self.is_async:
            actx = AsyncContext(
                job.message, self.queue, lease, beat_loop, client, acked_in_transaction
            )
            handler: Callable[..., Coroutine[Any, Any, Any]] = self.handler
            task: asyncio.Task[Any] = asyncio.create_task(handler(job.message, actx))

            def cancel_task(reason: CancelReason) -> None:
                with contextlib.suppress(RuntimeError):  # the loop is gone (exiting)
                    loop.call_soon_threadsafe(task.cancel, f"leaseq: {reason.value}")

            lease.on_cancel(cancel_task)
            try:
                await asyncio.wait({task})
            except asyncio.CancelledError:
                task.cancel()
                raise
            if task.cancelled():
                return "cancelled", None
            error = task.exception()
        else:
            ctx = Context(job.message, self.queue, lease, beat_loop, client, acked_in_transaction)
            future: asyncio.Future[Any] = loop.create_future()
            # The thread runs in this task's context: the handler's span is current there.
            context = contextvars.copy_context()
            thread = threading.Thread(
                target=context.run,
                args=(_call_in_thread, self.handler, job.message, ctx, future, loop),
                name=f"leaseq-handler-{job.message.message_id}", daemon=True,
            )
            thread.start()
            await asyncio.wait({future})
            error = future.exception()
        if error is None:
            return "done", None
        if isinstance(error, (HandlerCancelled, asyncio.CancelledError)):
            return "cancelled", error
        return "failed", error

    async def _settle(self, job: Job, ended: HandlerEnd, error: BaseException | None) -> None:
        if ended == "done" and job.acked_in_transaction:
            # Whatever the watchdog said before: the delete found the claim still ours.
            job.free()
            self._record(job, Outcome.ACKNOWLEDGED)
            self.stats.acknowledged += 1
            self.stats.acknowledged_in_transaction += 1
            log.info("%s acknowledged in its handler's transaction", job)
            return
        reason = job.lease.reason
        if reason in LOST_CLAIM:
            # Acknowledging or releasing it would at best be refused, and the
            # work is to be redone elsewhere.
            self._record(job, Outcome.ABANDONED)
            self.stats.abandoned += 1
            log.warning("%s abandoned: the watchdog cancelled it (%s)", job, reason.value)
            return
        if ended == "done":
            await self._acknowledge(job)
        elif ended == "failed":
            self.stats.failed += 1
            # None: the queue's retry ladder decides (the service's answer says how long).
            delay = None if self.backoff is None else self.backoff.delay(
                job.message.receive_count
            )
            log.warning("%s failed: %r; releasing it for a retry", job, error, exc_info=error)
            await self.release(job, delay, why="its handler failed")
        else:  # cancelled at shutdown, or the handler cancelled itself
            await self.release(job, 0, why="its handler was cancelled")

    async def _acknowledge(self, job: Job) -> None:
        # The next message of its FIFO group starts only once this one is settled:
        # no waiting for a receive to carry it then.
        ride = 0.0 if self._order.successor_waits(job) else ACK_RIDE_SECONDS
        job.free()
        acked = await self._acks.acknowledge(job, ride=ride)
        if acked is Acked.ACKNOWLEDGED:
            self._record(job, Outcome.ACKNOWLEDGED)
            self.stats.acknowledged += 1
            log.info("%s acknowledged", job)
        elif acked is Acked.REJECTED:
            self._record(job, Outcome.ACK_REJECTED)
            self.stats.ack_rejected += 1
            # The lease ran out and another receive claimed the message while
            # the handler finished: its work will be redone there.
            log.warning("%s: acknowledgement rejected (lease lost)", job)
        elif acked is Acked.UNCONFIRMED:
            self._record(job, Outcome.ACK_REJECTED)
            self.stats.ack_rejected += 1
            log.warning("%s: acknowledgement unconfirmed (the request carrying it failed, "
                        "and the claim is gone now: applied then, or the lease lapsed)", job)
        # Acked.FAILED: logged where it failed; the message comes back when its lease ends.

    async def release(self, job: Job, delay: int | None, *, why: str) -> None:
        """Release the message for another attempt (`POST .../release`) after
        `delay` seconds, or, with None, after the delay the queue's retry ladder
        gives (at once on a queue without one)."""
        try:
            released: Released = await self._control.release(
                self.queue, job.message.receipt_handle, delay
            )
        except (Unreachable, ApiError) as exc:
            if isinstance(exc, LeaseLost) and job.acked_in_transaction:
                log.info("%s: not released: the handler's transaction acknowledged it "
                         "(or, rolled back, its lease ran out and it was claimed again)", job)
                return
            log.warning("%s: release failed (%r); it returns when its lease ends", job, exc)
            return
        self._record(job, Outcome.RELEASED)
        self.stats.released += 1
        log.info("%s released (%s), visible again in %ss", job, why,
                 _seconds(released.delay_seconds))

    async def release_unhandled(self, job: Job) -> None:
        """FIFO: release a message that did not run, visible again at once (an
        explicit delay of 0: no failure of its own), for its group to be
        redelivered in order."""
        reason = job.lease.reason
        if reason in LOST_CLAIM:
            self._record(job, Outcome.ABANDONED)
            self.stats.abandoned += 1
            log.warning("%s of group %r abandoned before it ran (%s)", job, job.group,
                        reason.value)
            return
        try:
            await self._control.release(self.queue, job.message.receipt_handle, 0)
        except (Unreachable, ApiError) as exc:
            log.warning("%s: giving it back failed (%r); it returns when its lease ends",
                        job, exc)
            return
        self._record(job, Outcome.RETURNED)
        self.stats.returned += 1
        log.info("%s of group %r given back unhandled (a message before it in its group "
                 "was not acknowledged, or the worker is stopping)", job, job.group)

    def _record(self, job: Job, outcome: Outcome) -> None:
        job.outcome = outcome
        self.stats.recent.append((job.message.message_id, job.message.fencing_token, outcome))


def _seconds(value: float) -> str:
    """A delay for the log: whole seconds as such, else to the hundredth."""
    return f"{round(value, 2):g}"


def _report_heartbeat_crash(future: concurrent.futures.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("the heartbeat stopped unexpectedly", exc_info=future.exception())


def _call_in_thread(
    handler: Handler,
    message: Message,
    ctx: Context,
    future: asyncio.Future[Any],
    loop: asyncio.AbstractEventLoop,
) -> None:
    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    try:
        result = handler(message, ctx)
    except BaseException as exc:  # reported to the worker, which decides
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(deliver, future.set_exception, exc)
        return
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(deliver, future.set_result, result)
