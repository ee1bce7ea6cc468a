"""`Worker`: receive, run a handler under a heartbeat watchdog, acknowledge or release.

    def handle(message, ctx):            # or: async def handle(message, ctx)
        ...                               # ctx.fencing_token, ctx.checkpoint(cursor),
                                          # ctx.cancelled / ctx.raise_if_cancelled()

    Worker(handle, queue="emails", concurrency=4).run()   # until SIGTERM or SIGINT

The parts, each of which a maintainer can change on its own:

- `leaseq.receiver`: the receive loop, `concurrency` slots at a time.
- `leaseq.runner`: one message's life: its heartbeat and watchdog, its handler,
  then acknowledge or release (the steps are in its docstring).
- `leaseq.acks`: the routes a finished message's acknowledgement leaves by.
- `leaseq.fifo_order`: on a FIFO queue, each group's messages one at a time, in order.
- `leaseq.job`: one held message; `Outcome` and `WorkerStats`.

This module wires them and owns start and shutdown. On SIGTERM/SIGINT the worker
stops receiving, gives in-flight handlers `grace` seconds, then cancels them and
releases their messages at once. A second signal skips the rest of the grace
period. FIFO messages still waiting for their turn are released unhandled at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Literal

import httpx

from leaseq.acks import ACK_BATCH, ACK_RIDE_SECONDS, Ack, AckBatcher
from leaseq.backoff import Backoff
from leaseq.client import AsyncClient, default_url
from leaseq.errors import CancelReason
from leaseq.fifo_order import GroupOrder
from leaseq.job import Job, Outcome, WorkerStats
from leaseq.lease import HeartbeatThread
from leaseq.receiver import MAX_RECEIVE, Receiver
from leaseq.runner import Handler, Runner, is_async_handler

__all__ = [
    "ACK_BATCH",
    "ACK_RIDE_SECONDS",
    "CANCEL_WAIT",
    "MAX_RECEIVE",
    "Ack",
    "Handler",
    "HeartbeatMode",
    "Outcome",
    "Worker",
    "WorkerStats",
    "is_async_handler",
]

log = logging.getLogger("leaseq.worker")

HeartbeatMode = Literal["auto", "task", "thread"]

CANCEL_WAIT = 5.0
"""Seconds cancelled handlers get to stop at shutdown before their messages are
released anyway."""


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
        # The task of each message held, for the shutdown to wait for or cancel.
        self._jobs: dict[asyncio.Task[None], Job] = {}
        self._order = GroupOrder(queue, concurrency)
        self._runner: Runner | None = None
        self._beats: HeartbeatThread | None = None
        self.started = threading.Event()  # set once the worker is receiving

    @property
    def fifo(self) -> bool | None:
        """True once the queue is known to be FIFO (by its attributes or by a
        message with a group); None until then."""
        return self._order.fifo

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
        self._order.clear()
        if self._early_stop is not None:
            self._request_stop(self._early_stop)
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
        # Long polls get a pool of their own: a parked poll never delays a beat,
        # an acknowledgement or a release.
        make = self._transport
        key = self._api_key
        poller = AsyncClient(self.url, transport=make() if make else None, api_key=key)
        control = AsyncClient(self.url, transport=make() if make else None, api_key=key)
        if self.heartbeat_mode == "thread":
            self._beats = HeartbeatThread(lambda: AsyncClient(self.url, api_key=key))
        acks = AckBatcher(self.queue, control)
        runner = self._runner = Runner(
            self.handler, queue=self.queue, is_async=self.is_async, backoff=self.backoff,
            stats=self.stats, control=control, beats=self._beats, acks=acks, order=self._order,
        )
        receiver = Receiver(
            queue=self.queue, concurrency=self.concurrency,
            lease_seconds=self.visibility_timeout, heartbeat_period=self.heartbeat_period,
            wait=self.wait, poller=poller, control=control, acks=acks, order=self._order,
            stats=self.stats, in_flight=self._jobs, run=runner.run,
        )
        log.info(
            "worker on %s queue %r: concurrency %d, visibility timeout %s, heartbeat %s, "
            "retries %s",
            self.url, self.queue, self.concurrency,
            f"{self.visibility_timeout}s" if self.visibility_timeout else "of the queue",
            self.heartbeat_mode,
            "by the queue's ladder" if self.backoff is None else f"by {self.backoff}",
        )
        receiving = asyncio.create_task(receiver.receive(), name="leaseq-receive")
        stopping = asyncio.create_task(self._stopping.wait())
        self.started.set()
        failure: BaseException | None = None
        try:
            await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if receiving.done() and not receiving.cancelled():
                failure = receiving.exception()
            receiving.cancel()
            stopping.cancel()
            await asyncio.gather(receiving, stopping, return_exceptions=True)
            await self._drain()
        finally:
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            await poller.aclose()
            await control.aclose()
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
        assert self._hurry is not None and self._runner is not None
        if not self._jobs:
            return
        self._order.release_waiting()
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
        # release their messages now (the process is about to exit).
        for task, job in list(self._jobs.items()):
            if not job.settled:
                job.settled = True
                job.lease.close()
                # One its handler acknowledged in a transaction still open: a
                # release would wait for that transaction's lock.
                if not job.acked_in_transaction:
                    await self._runner.release(
                        job, 0, why="its handler did not stop at shutdown"
                    )
                task.cancel()
        if self._jobs:  # the rest are finishing an acknowledgement or release
            await asyncio.wait(set(self._jobs), timeout=CANCEL_WAIT)
