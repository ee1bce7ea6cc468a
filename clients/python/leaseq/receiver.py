"""The worker's receive loop: claims messages while a concurrency slot is free and
starts a runner for each.

A slot is a message of a standard queue, or a group of a FIFO queue (whose
messages run one at a time, `leaseq.fifo_order`). A handler that finished frees
its slot once its acknowledgement is queued, so the receive that fills the slot
can carry the acknowledgement (`leaseq.acks`). Each message's lease is measured
from the moment its receive request was sent: the service starts it later, never
earlier. Long polls go through a connection pool of their own: a parked poll
never delays a beat, an acknowledgement or a release.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from leaseq.acks import AckBatcher
from leaseq.client import AsyncClient
from leaseq.errors import ApiError, Unreachable
from leaseq.fifo_order import GroupOrder
from leaseq.job import Job, WorkerStats, lease_clock
from leaseq.models import Message

log = logging.getLogger("leaseq.worker")

MAX_RECEIVE = 10
"""Most messages one receive asks for: the service's limit."""


class Receiver:
    """Receives for one serve of the worker until cancelled, or until the service
    refuses what it asks (the queue does not exist, the key may not receive)."""

    def __init__(
        self,
        *,
        queue: str,
        concurrency: int,
        lease_seconds: int | None,
        heartbeat_period: float | None,
        wait: int,
        poller: AsyncClient,
        control: AsyncClient,
        acks: AckBatcher,
        order: GroupOrder,
        stats: WorkerStats,
        in_flight: dict[asyncio.Task[None], Job],
        run: Callable[[Job], Coroutine[Any, Any, None]],
    ) -> None:
        """`lease_seconds`: the lease each receive asks for (None: the queue's
        visibility timeout). `poller`: the connection pool of the receives;
        `control`: the worker's other one. `in_flight`: the task of each message
        held, kept here until it ends. `run`: one message's life."""
        self.queue = queue
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.heartbeat_period = heartbeat_period
        self.wait = wait
        self._poller = poller
        self._control = control
        self._acks = acks
        self._order = order
        self._stats = stats
        self._in_flight = in_flight
        self._run = run
        self._slot = asyncio.Event()
        self._batches = 0  # receives that brought messages

    async def receive(self) -> None:
        if self.lease_seconds is None:
            await self._check_queue()
        failures = 0
        while True:
            while self._busy() >= self.concurrency:
                self._slot.clear()
                await self._slot.wait()
            count = min(self.concurrency - self._busy(), MAX_RECEIVE)
            sent_at = time.monotonic()  # the lease starts after this, never before
            try:
                if self._acks.to_carry:
                    messages = await self._acks.receive_carrying(
                        self._poller, count, self.lease_seconds
                    )
                else:
                    messages = await self._poller.receive(
                        self.queue, max=count, visibility_timeout=self.lease_seconds,
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

    async def _check_queue(self) -> None:
        """The queue's own timeout will be the lease: a lease of 0 cannot be
        heartbeated (and would hand every message straight back)."""
        try:
            queue = await self._control.get_queue(self.queue)
        except ApiError as exc:
            if exc.status != 403:
                raise
            # A key that may receive but not read the queue: the check is
            # a courtesy, not a condition of working.
            log.info("cannot read queue %r's attributes with this key; not checking "
                     "its visibility_timeout", self.queue)
            return
        if queue.attributes.visibility_timeout < 1:
            raise ValueError(
                f"queue {self.queue!r} has a visibility_timeout of 0: "
                "give the worker one (visibility_timeout=..., --visibility-timeout)"
            )
        if queue.attributes.fifo:
            self._order.detected("its attributes")

    def _busy(self) -> int:
        """Slots in use: a message of a standard queue until its acknowledgement
        is queued; on a FIFO queue a group, until its last held message's is."""
        standard = sum(
            1 for job in self._in_flight.values() if job.group is None and not job.freed
        )
        return standard + self._order.busy_groups()

    def _start(self, message: Message, sent_at: float, batch: int) -> None:
        self._stats.received += 1
        lease = lease_clock(message, sent_at, self.heartbeat_period)
        job = Job(message, lease, batch, on_free=self._slot.set)
        if job.group is not None:
            self._order.join(job)
        task = asyncio.create_task(self._run(job), name=f"leaseq-{message.message_id}")
        self._in_flight[task] = job
        task.add_done_callback(self._finished)
        log.debug("%s received (receive count %d)", job, message.receive_count)

    def _finished(self, task: asyncio.Task[None]) -> None:
        job = self._in_flight.pop(task, None)
        if job is not None and job.group is not None:
            self._order.leave(job)
        self._slot.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("processing failed", exc_info=task.exception())
