"""`Worker`: receive, run a handler under a heartbeat watchdog, acknowledge or release.

    def handle(message, ctx):            # or: async def handle(message, ctx)
        ...                               # ctx.fencing_token, ctx.checkpoint(cursor),
                                          # ctx.cancelled / ctx.raise_if_cancelled()

    Worker(handle, queue="emails", concurrency=4).run()   # until SIGTERM or SIGINT

For every message:

1. The lease deadline is measured on the monotonic clock from the moment the
   receive request was sent.
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
4. On success the message is acknowledged (a conditional `DELETE`; a rejection
   is logged and counted, never retried). On an exception it is released for
   another attempt (`POST .../release`): after the queue's retry ladder
   (`retry_backoff`) decides, or after the delay of the worker's own `Backoff`
   when it was given one.
5. On SIGTERM/SIGINT the worker stops receiving, gives in-flight handlers
   `grace` seconds, then cancels them and releases their messages at once. A
   second signal skips the rest of the grace period.
6. On a FIFO queue (its messages carry a `group`) each group's messages are
   handled one at a time, in the order received, while different groups run
   concurrently (a concurrency slot is a group). A message starts only once the
   one before it in its group has been settled (acknowledged or released; every
   held message's lease is heartbeated meanwhile). A message of a group that is
   not acknowledged (failed and released, abandoned, ...) makes the worker give
   back, unhandled and visible at once, the messages of that group it received
   with it or before it, so that the service redelivers the group in order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import enum
import inspect
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from leaseq import tracing
from leaseq.backoff import Backoff
from leaseq.batching import MAX_BATCH
from leaseq.client import AsyncClient, default_url
from leaseq.context import AsyncContext, Context
from leaseq.errors import (
    ApiError,
    CancelReason,
    HandlerCancelled,
    LeaseLost,
    Unreachable,
)
from leaseq.lease import HeartbeatThread, LeaseClock, heartbeat
from leaseq.models import Message, Released

log = logging.getLogger("leaseq.worker")

Handler = Callable[[Message, Any], Any]
"""`handler(message, ctx)`, a plain function (run in a thread of its own, gets a
`Context`) or a coroutine function (run in the worker's loop, gets an `AsyncContext`)."""

HeartbeatMode = Literal["auto", "task", "thread"]

MAX_RECEIVE = 10
ACK_BATCH = MAX_BATCH
"""Most acknowledgements one request carries: the service's default batch limit."""
ACK_RIDE_SECONDS = 0.05
"""How long a finished message's acknowledgement waits for the next receive to
carry it (`POST .../receive` with `delete`) before it is sent on its own: a
receive loop waiting in a long poll takes none."""


class _AckUnknown(Exception):
    """The request carrying an acknowledgement failed: whether it was applied is
    not known."""

CANCEL_WAIT = 5.0
"""Seconds cancelled handlers get to stop at shutdown before their messages are
released anyway."""


class Outcome(enum.StrEnum):
    """What became of one received message."""

    ACKNOWLEDGED = "acknowledged"
    ACK_REJECTED = "acknowledgement rejected"
    RELEASED = "released"
    ABANDONED = "abandoned"
    RETURNED = "returned unhandled"
    """FIFO: given back without running the handler, after a message before it in
    its group was not acknowledged (or at shutdown)."""


@dataclass
class WorkerStats:
    received: int = 0
    acknowledged: int = 0
    ack_rejected: int = 0
    failed: int = 0  # the handler raised
    released: int = 0
    abandoned: int = 0  # the watchdog fired: neither acknowledged nor released
    returned: int = 0  # FIFO: given back unhandled, for its group to be redelivered in order
    beats: int = 0
    failed_beats: int = 0
    recent: deque[tuple[str, int, Outcome]] = field(default_factory=lambda: deque(maxlen=1000))
    """(message id, fencing token, outcome) of the last thousand messages settled."""


def is_async_handler(handler: Callable[..., Any]) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 - objects with an async __call__
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


class _Job:
    """One received message while this worker holds it."""

    def __init__(self, message: Message, lease: LeaseClock, batch: int = 0) -> None:
        self.message = message
        self.lease = lease
        self.settled = False
        self.batch = batch  # the receive that brought it (numbered from 1)
        self.freed = False  # its acknowledgement is queued: its slot is free
        self.outcome: Outcome | None = None
        # FIFO: resolved True when it may run (the messages before it in its
        # group are settled), False when it is to be given back unhandled.
        self.turn: asyncio.Future[bool] | None = None

    @property
    def group(self) -> str | None:
        return self.message.group

    def __str__(self) -> str:
        return f"message {self.message.message_id} (fencing {self.message.fencing_token})"


class Worker:
    """Runs `handler` for the messages of `queue`, `concurrency` at a time."""

    def __init__(
        self,
        handler: Handler,
        *,
        queue: str,
        url: str | None = None,
        concurrency: int = 1,
        visibility_timeout: int | None = None,
        heartbeat_period: float | None = None,
        heartbeat: HeartbeatMode = "auto",
        wait: int = 20,
        grace: float = 30.0,
        backoff: Backoff | None = None,
        transport: Callable[[], httpx.AsyncBaseTransport] | None = None,
        api_key: str | None = None,
        lease: int | None = None,
    ) -> None:
        """`api_key`: `<key id>.<secret>` (default: `LEASEQ_API_KEY`, if set).
        `visibility_timeout`: seconds each claim lasts and each beat extends to
        (None: the queue's; `lease` is its earlier name, still accepted).
        `heartbeat_period`: seconds between beats (None: a third of the lease).
        `wait`: long-poll seconds (0-20).
        `grace`: seconds in-flight handlers get at shutdown. `backoff`: the
        delay before a failed message is retried, computed here and sent with
        the release (None: the service's retry ladder of the queue decides, or
        the message is retried at once on a queue without one). `transport`: for
        tests, makes the HTTP transports of the clients in the worker's own loop
        (not of the heartbeat thread)."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if lease is not None:
            if visibility_timeout is not None and visibility_timeout != lease:
                raise ValueError("give visibility_timeout or its older name lease, not both")
            visibility_timeout = lease
        if visibility_timeout is not None and visibility_timeout < 1:
            raise ValueError("the visibility timeout must be at least one second")
        if heartbeat_period is not None and (
            heartbeat_period <= 0
            or (visibility_timeout is not None and heartbeat_period >= visibility_timeout)
        ):
            raise ValueError("the heartbeat period must be positive and shorter than the lease")
        if heartbeat not in ("auto", "task", "thread"):
            raise ValueError("heartbeat is 'auto', 'task' or 'thread'")
        if not 0 <= wait <= 20:
            raise ValueError("wait is 0 to 20 seconds")
        self.handler = handler
        self.queue = queue
        self.url = url or default_url()
        self.concurrency = concurrency
        self.visibility_timeout = visibility_timeout
        self.heartbeat_period = heartbeat_period
        self.is_async = is_async_handler(handler)
        self.heartbeat_mode: Literal["task", "thread"] = (
            heartbeat if heartbeat != "auto" else ("task" if self.is_async else "thread")
        )
        self.wait = wait
        self.grace = grace
        self.backoff = backoff
        self.stats = WorkerStats()
        self._transport = transport
        self._api_key = api_key
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._early_stop: bool | None = None  # stop() before serve() started
        self._jobs: dict[asyncio.Task[None], _Job] = {}
        # FIFO: the held messages of each group, in the order received.
        self._groups: dict[str, list[_Job]] = {}
        self._batches = 0  # receives that brought messages
        self.fifo: bool | None = None
        """True once the queue is known to be FIFO (by its attributes or by a
        message with a group); None until then."""
        self._slot: asyncio.Event | None = None
        # Acknowledgements waiting for a receive to carry them: (handle, its result).
        self._acks: list[tuple[str, asyncio.Future[ApiError | None]]] = []
        self._carry_acks = True  # False against a service without POST .../receive
        self._beats: HeartbeatThread | None = None
        self._poller: AsyncClient | None = None
        self._control: AsyncClient | None = None
        self.started = threading.Event()  # set once the worker is receiving

    # -- running and stopping -------------------------------------------------------

    def run(self) -> None:
        """Serve until SIGTERM or SIGINT (a second one skips the grace period)."""
        asyncio.run(self.serve(handle_signals=True))

    def stop(self, *, now: bool = False) -> None:
        """Stop receiving and finish in-flight handlers (within `grace`, or at once
        with `now`). Safe to call from any thread, or before `serve` runs."""
        loop = self._loop
        if loop is None or loop.is_closed():
            self._early_stop = now or bool(self._early_stop)
            return
        with contextlib.suppress(RuntimeError):  # the loop has just closed
            loop.call_soon_threadsafe(self._request_stop, now)

    def _request_stop(self, now: bool) -> None:
        assert self._stopping is not None and self._hurry is not None
        if self._stopping.is_set() or now:
            self._hurry.set()
        self._stopping.set()

    async def serve(self, *, handle_signals: bool = False) -> None:
        """Receive and handle messages until `stop()` (or a signal, with
        `handle_signals`). Errors the worker cannot recover from (the queue does
        not exist, a request it sends is refused) end it after a shutdown."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stopping = asyncio.Event()
        self._hurry = asyncio.Event()
        self._slot = asyncio.Event()
        self._acks = []
        self._carry_acks = True
        self._groups = {}
        if self._early_stop is not None:
            self._request_stop(self._early_stop)
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
        # Long polls get a pool of their own: a parked poll never delays a beat,
        # an acknowledgement or a release.
        make = self._transport
        key = self._api_key
        self._poller = AsyncClient(self.url, transport=make() if make else None, api_key=key)
        self._control = AsyncClient(self.url, transport=make() if make else None, api_key=key)
        if self.heartbeat_mode == "thread":
            self._beats = HeartbeatThread(lambda: AsyncClient(self.url, api_key=key))
        log.info(
            "worker on %s queue %r: concurrency %d, visibility timeout %s, heartbeat %s, "
            "retries %s",
            self.url, self.queue, self.concurrency,
            f"{self.visibility_timeout}s" if self.visibility_timeout else "of the queue",
            self.heartbeat_mode,
            "by the queue's ladder" if self.backoff is None else f"by {self.backoff}",
        )
        receiver = asyncio.create_task(self._receive_loop(), name="leaseq-receive")
        stopping = asyncio.create_task(self._stopping.wait())
        self.started.set()
        failure: BaseException | None = None
        try:
            await asyncio.wait({receiver, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if receiver.done() and not receiver.cancelled():
                failure = receiver.exception()
            receiver.cancel()
            stopping.cancel()
            await asyncio.gather(receiver, stopping, return_exceptions=True)
            await self._drain()
        finally:
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            await self._poller.aclose()
            await self._control.aclose()
            if self._beats is not None:
                await asyncio.to_thread(self._beats.stop)
            self._loop = None
        log.info(
            "worker stopped: %d received, %d acknowledged, %d acknowledgements rejected, "
            "%d released, %d abandoned", self.stats.received, self.stats.acknowledged,
            self.stats.ack_rejected, self.stats.released, self.stats.abandoned,
        )
        if failure is not None:
            raise failure

    def _on_signal(self, sig: int) -> None:
        assert self._stopping is not None
        if self._stopping.is_set():
            log.info("%s again: cancelling in-flight handlers now", signal.Signals(sig).name)
        else:
            log.info(
                "%s: no more receives; in-flight handlers get %.0fs",
                signal.Signals(sig).name, self.grace,
            )
        self._request_stop(now=False)

    async def _drain(self) -> None:
        """Shutdown: grace for in-flight handlers, then cancel and release."""
        assert self._hurry is not None
        if not self._jobs:
            return
        # FIFO messages waiting for their turn have not started: give them back
        # now (a group's earlier messages still held keep it blocked meanwhile).
        for jobs in self._groups.values():
            for job in jobs:
                if job.turn is not None and not job.turn.done():
                    job.turn.set_result(False)
        deadline = time.monotonic() + self.grace
        hurry = asyncio.create_task(self._hurry.wait())
        try:
            while self._jobs and not self._hurry.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await asyncio.wait(
                    {*self._jobs, hurry}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            hurry.cancel()
        if not self._jobs:
            return
        log.info("cancelling %d in-flight handlers", len(self._jobs))
        for job in self._jobs.values():
            job.lease.cancel(CancelReason.SHUTDOWN)
        await asyncio.wait(set(self._jobs), timeout=CANCEL_WAIT)
        # Sync handlers that ignore their token cannot be stopped from outside:
        # give their messages back now (the process is about to exit).
        for task, job in list(self._jobs.items()):
            if not job.settled:
                job.settled = True
                job.lease.close()
                await self._release(job, 0, why="its handler did not stop at shutdown")
                task.cancel()
        if self._jobs:  # the rest are finishing an acknowledgement or release
            await asyncio.wait(set(self._jobs), timeout=CANCEL_WAIT)

    # -- receiving -------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        assert self._poller is not None and self._slot is not None
        assert self._control is not None
        if self.visibility_timeout is None:
            # The queue's own timeout will be the lease: a lease of 0 cannot be
            # heartbeated (and would hand every message straight back).
            try:
                queue = await self._control.get_queue(self.queue)
            except ApiError as exc:
                if exc.status != 403:
                    raise
                # A key that may receive but not read the queue: the check is
                # a courtesy, not a condition of working.
                log.info("cannot read queue %r's attributes with this key; not checking "
                         "its visibility_timeout", self.queue)
                queue = None
            if queue is not None and queue.attributes.visibility_timeout < 1:
                raise ValueError(
                    f"queue {self.queue!r} has a visibility_timeout of 0: "
                    "give the worker one (visibility_timeout=..., --visibility-timeout)"
                )
            if queue is not None and queue.attributes.fifo:
                self._fifo_detected("its attributes")
        failures = 0
        while True:
            # A handler that finished frees its slot once its acknowledgement is
            # queued: the next receive carries it.
            while self._busy() >= self.concurrency:
                self._slot.clear()
                await self._slot.wait()
            free = self.concurrency - self._busy()
            sent_at = time.monotonic()  # the lease starts after this, never before
            try:
                if self._acks and self._carry_acks:
                    messages = await self._receive_carrying_acks(min(free, MAX_RECEIVE))
                else:
                    messages = await self._poller.receive(
                        self.queue, max=min(free, MAX_RECEIVE),
                        visibility_timeout=self.visibility_timeout,
                        wait=self.wait,
                    )
            except (Unreachable, ApiError) as exc:
                if isinstance(exc, ApiError) and not exc.transient:
                    log.error("receive from %r refused: %s", self.queue, exc)
                    raise
                failures += 1
                delay = min(30.0, 0.25 * 2**min(failures, 8))
                log.warning("receive failed (%r); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            failures = 0
            if messages:
                self._batches += 1
            for message in messages:
                self._start(message, sent_at, self._batches)

    def _busy(self) -> int:
        """Slots in use: a message of a standard queue until its acknowledgement
        is queued; on a FIFO queue a group, until its last held message's is."""
        standard = sum(
            1 for job in self._jobs.values() if job.group is None and not job.freed
        )
        groups = sum(
            1 for jobs in self._groups.values() if any(not job.freed for job in jobs)
        )
        return standard + groups

    def _fifo_detected(self, how: str) -> None:
        if not self.fifo:
            self.fifo = True
            log.info("queue %r is a FIFO queue (by %s): each group's messages are handled "
                     "one at a time, in order; up to %d groups at once",
                     self.queue, how, self.concurrency)

    async def _receive_carrying_acks(self, count: int) -> list[Message]:
        """One request: up to ACK_BATCH queued acknowledgements, then a receive.
        It does not wait for messages (their results would wait with it); an
        empty answer sends the loop to its usual long poll."""
        assert self._poller is not None
        acks, self._acks = self._acks[:ACK_BATCH], self._acks[ACK_BATCH:]
        try:
            settled = await self._poller.receive_settling(
                self.queue, delete=[handle for handle, _ in acks], max=count,
                visibility_timeout=self.visibility_timeout, wait=0,
            )
            _resolve(acks, settled.deleted)
        except BaseException as exc:
            _unknown(acks, exc)
            if isinstance(exc, ApiError) and exc.status in (405, 422):
                # A service without the route (405), or one whose batch limit is
                # below ACK_BATCH (422): acknowledgements go on their own.
                log.info("the service does not take acknowledgements on a receive (%s); "
                         "sending them on their own", exc.code)
                self._carry_acks = False
                return []
            raise
        return settled.messages

    async def _send_acks(self) -> None:
        """The queued acknowledgements, in batches of their own."""
        assert self._control is not None
        while self._acks:
            acks, self._acks = self._acks[:ACK_BATCH], self._acks[ACK_BATCH:]
            try:
                results = await self._control.delete_batch(self.queue, [h for h, _ in acks])
                _resolve(acks, results)
            except BaseException as exc:
                _unknown(acks, exc)
                raise

    def _start(self, message: Message, sent_at: float, batch: int = 0) -> None:
        self.stats.received += 1
        lease = LeaseClock(
            message.receipt_handle, message.lease_seconds, sent_at,
            period=self._period(message.lease_seconds),
        )
        job = _Job(message, lease, batch)
        if job.group is not None:
            self._fifo_detected("its messages")
            job.turn = asyncio.get_running_loop().create_future()
            jobs = self._groups.setdefault(job.group, [])
            jobs.append(job)
            _advance(jobs)
        task = asyncio.create_task(self._process(job), name=f"leaseq-{message.message_id}")
        self._jobs[task] = job
        task.add_done_callback(self._finished)
        log.debug("%s received (receive count %d)", job, message.receive_count)

    def _finished(self, task: asyncio.Task[None]) -> None:
        job = self._jobs.pop(task, None)
        if job is not None and job.group is not None:
            self._leave_group(job)
        if self._slot is not None:
            self._slot.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("processing failed", exc_info=task.exception())

    def _leave_group(self, job: _Job) -> None:
        """A FIFO message is settled: the next of its group may run, unless this
        one was not acknowledged; then the messages of its group held since its
        receive (or before) are given back, for the group to come again in order."""
        assert job.group is not None
        jobs = self._groups.get(job.group)
        if jobs is None or job not in jobs:
            return
        if job.outcome is not Outcome.ACKNOWLEDGED:
            for other in jobs:
                if (other is not job and other.batch <= job.batch
                        and other.turn is not None and not other.turn.done()):
                    other.turn.set_result(False)
        jobs.remove(job)
        if jobs:
            _advance(jobs)
        else:
            del self._groups[job.group]

    def _successor_waits(self, job: _Job) -> bool:
        """A FIFO message with a later one of its group held here, waiting for it."""
        jobs = self._groups.get(job.group) if job.group is not None else None
        return jobs is not None and len(jobs) > 1

    def _period(self, lease_seconds: int) -> float:
        if self.heartbeat_period is not None and self.heartbeat_period < lease_seconds:
            return self.heartbeat_period
        return lease_seconds / 3

    # -- one message -----------------------------------------------------------------

    async def _process(self, job: _Job) -> None:
        assert self._loop is not None and self._control is not None
        client: Callable[[], AsyncClient]
        if self._beats is not None:
            beats = self._beats
            beat_loop, client = beats.loop, (lambda: beats.client)
        else:
            control = self._control
            beat_loop, client = self._loop, (lambda: control)
        beat = asyncio.run_coroutine_threadsafe(
            heartbeat(job.lease, client(), self.queue), beat_loop
        )
        beat.add_done_callback(_report_heartbeat_crash)
        run = True
        try:
            # FIFO: held (and heartbeated) until the messages before it in its
            # group are settled; False: give it back unhandled.
            if job.turn is not None:
                # ...and not run once its claim is gone while it waited.
                run = await job.turn and not job.lease.cancelled
            if run:
                outcome, error = await self._run_handler(job, beat_loop, client)
        finally:
            job.lease.close()
            beat.cancel()
            self.stats.beats += job.lease.beats
            self.stats.failed_beats += job.lease.failed_beats
        if job.settled:  # released by the shutdown already
            return
        job.settled = True
        if run:
            await self._settle(job, outcome, error)
        else:
            await self._give_back(job)

    async def _run_handler(
        self,
        job: _Job,
        beat_loop: asyncio.AbstractEventLoop,
        client: Callable[[], AsyncClient],
    ) -> tuple[str, BaseException | None]:
        """Runs the handler, in the span that continues its message's trace;
        ('done' | 'cancelled' | 'failed', exception)."""
        with tracing.processing(self.queue, job.message) as span:
            outcome, error = await self._run_in_span(job, beat_loop, client)
            if outcome == "failed" and error is not None:
                span.failed(error)
        return outcome, error

    async def _run_in_span(
        self,
        job: _Job,
        beat_loop: asyncio.AbstractEventLoop,
        client: Callable[[], AsyncClient],
    ) -> tuple[str, BaseException | None]:
        loop = asyncio.get_running_loop()
        lease = job.lease
        if self.is_async:
            actx = AsyncContext(job.message, self.queue, lease, beat_loop, client)
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
            ctx = Context(job.message, self.queue, lease, beat_loop, client)
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

    async def _settle(self, job: _Job, outcome: str, error: BaseException | None) -> None:
        reason = job.lease.reason
        if reason in (CancelReason.LEASE_LOST, CancelReason.LEASE_EXPIRED):
            # The claim is (or may be) someone else's: acknowledging or releasing
            # it would at best be refused, and the work is to be redone elsewhere.
            self._record(job, Outcome.ABANDONED)
            self.stats.abandoned += 1
            log.warning("%s abandoned: the watchdog cancelled it (%s)", job, reason.value)
            return
        if outcome == "done":
            await self._acknowledge(job)
        elif outcome == "failed":
            self.stats.failed += 1
            # None: the queue's retry ladder decides (the service's answer says how long).
            delay = None if self.backoff is None else self.backoff.delay(
                job.message.receive_count
            )
            log.warning("%s failed: %r; releasing it for a retry", job, error, exc_info=error)
            await self._release(job, delay, why="its handler failed")
        else:  # cancelled at shutdown, or the handler cancelled itself
            await self._release(job, 0, why="its handler was cancelled")

    async def _acknowledge(self, job: _Job) -> None:
        """Queued for the next receive to carry (or sent in a batch of its own
        after ACK_RIDE_SECONDS, or at once when the next message of its FIFO
        group waits for it); sent alone, with retries, if that request fails."""
        assert self._slot is not None
        result: asyncio.Future[ApiError | None] = asyncio.get_running_loop().create_future()
        self._acks.append((job.message.receipt_handle, result))
        job.freed = True
        self._slot.set()
        ride = 0.0 if self._successor_waits(job) else ACK_RIDE_SECONDS
        try:
            outcome = await self._ack_result(result, ride)
        except _AckUnknown:
            await self._acknowledge_alone(job, unconfirmed=True)
            return
        if isinstance(outcome, LeaseLost):
            self._ack_rejected(job)
        elif outcome is not None:
            log.warning("%s: acknowledgement refused (%r); trying again alone", job, outcome)
            await self._acknowledge_alone(job)
        else:
            self._acknowledged(job)

    async def _ack_result(
        self, result: asyncio.Future[ApiError | None], ride: float
    ) -> ApiError | None:
        """The result of a queued acknowledgement: carried by a receive within
        `ride` seconds, else sent in a batch of its own now."""
        if ride > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(ride):
                    return await asyncio.shield(result)
        with contextlib.suppress(Exception):
            await self._send_acks()  # ours too, unless a receive took it
        return await result

    def _ack_rejected(self, job: _Job, *, unconfirmed: bool = False) -> None:
        self._record(job, Outcome.ACK_REJECTED)
        self.stats.ack_rejected += 1
        if unconfirmed:
            # The request that carried it failed: it may have been applied then.
            log.warning("%s: acknowledgement unconfirmed (the request carrying it failed, "
                        "and the claim is gone now: applied then, or the lease lapsed)", job)
        else:
            # The lease ran out and another receive claimed the message while
            # the handler finished: its work will be redone there.
            log.warning("%s: acknowledgement rejected (lease lost)", job)

    def _acknowledged(self, job: _Job) -> None:
        self._record(job, Outcome.ACKNOWLEDGED)
        self.stats.acknowledged += 1
        log.info("%s acknowledged", job)

    async def _acknowledge_alone(self, job: _Job, *, unconfirmed: bool = False) -> None:
        assert self._control is not None
        attempt = 0
        while True:
            try:
                await self._control.delete(self.queue, job.message.receipt_handle)
            except LeaseLost:
                self._ack_rejected(job, unconfirmed=unconfirmed)
                return
            except (Unreachable, ApiError) as exc:
                transient = isinstance(exc, Unreachable) or exc.transient
                attempt += 1
                if transient and attempt < 5 and not job.lease.expired():
                    await asyncio.sleep(min(job.lease.period / 2, 0.2 * 2**attempt))
                    continue
                log.error("%s: acknowledgement failed (%r); it will be redelivered", job, exc)
                return
            self._acknowledged(job)
            return

    async def _release(self, job: _Job, delay: int | None, *, why: str) -> None:
        """Give the message back for another attempt (`POST .../release`) after
        `delay` seconds, or, with None, after the delay the queue's retry ladder
        gives (at once on a queue without one). The one place the worker releases."""
        assert self._control is not None
        try:
            released: Released = await self._control.release(
                self.queue, job.message.receipt_handle, delay
            )
        except (Unreachable, ApiError) as exc:
            log.warning("%s: release failed (%r); it returns when its lease ends", job, exc)
            return
        self._record(job, Outcome.RELEASED)
        self.stats.released += 1
        log.info("%s released (%s), visible again in %ss", job, why,
                 _seconds(released.delay_seconds))

    async def _give_back(self, job: _Job) -> None:
        """FIFO: hand back a message that did not run (visible again at once, by
        an explicit delay of 0: no failure of its own), for its group to be
        redelivered in order."""
        assert self._control is not None
        reason = job.lease.reason
        if reason in (CancelReason.LEASE_LOST, CancelReason.LEASE_EXPIRED):
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

    def _record(self, job: _Job, outcome: Outcome) -> None:
        job.outcome = outcome
        self.stats.recent.append((job.message.message_id, job.message.fencing_token, outcome))


Ack = tuple[str, "asyncio.Future[ApiError | None]"]


def _advance(jobs: list[_Job]) -> None:
    """The first held message of a FIFO group may run (once: a turn is decided once)."""
    head = jobs[0]
    if head.turn is not None and not head.turn.done():
        head.turn.set_result(True)


def _resolve(acks: list[Ack], results: list[ApiError | None]) -> None:
    """Each acknowledgement's own result, in order (a short answer: unknown)."""
    for (_, result), deleted in zip(acks, results, strict=False):
        if not result.done():
            result.set_result(deleted)
    _unknown(acks, ValueError("the service answered fewer results than acknowledgements"))


def _unknown(acks: list[Ack], exc: BaseException) -> None:
    for _, result in acks:
        if not result.done():
            result.set_exception(_AckUnknown(repr(exc)))


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
