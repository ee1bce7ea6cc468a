"""The Worker's checkpoints in-process against the real service (uvicorn in this
event loop, real PostgreSQL): a checkpoint renews the lease and resumes a
redelivered job, from an async handler or the heartbeat thread, and one after
the lease is lost cancels the handler.

The process-level faults (SIGKILL, SIGSTOP, a cut network) are in
test_worker_faults.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from support import wait_until
from worker_support import running, stats, steal

from leaseq import (
    AsyncClient,
    AsyncContext,
    CancelReason,
    Context,
    HandlerCancelled,
    Message,
    Worker,
)


async def test_a_checkpoint_renews_the_lease_and_resumes_a_redelivered_job(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("resume", visibility_timeout=2)
    await api.send("resume", "job")
    units: list[tuple[int, int]] = []
    renewals: list[tuple[float, float]] = []

    def handler(message: Message, ctx: Context) -> None:
        start = message.checkpoint["next"] if message.checkpoint else 0
        for unit in range(start, 6):
            units.append((message.receive_count, unit))
            before = ctx.lease_remaining
            ctx.checkpoint({"next": unit + 1})
            renewals.append((before, ctx.lease_remaining))
            if message.receive_count == 1 and unit == 2:
                raise RuntimeError("crash after unit 2")
            if unit == 0:
                time.sleep(1.0)  # the next checkpoint finds the lease 1 s shorter

    # beats only every 1.9 s, so the checkpoint is what renews the lease here
    worker = Worker(handler, queue="resume", url=url, wait=1, visibility_timeout=2,
                    heartbeat_period=1.9)
    async with running(worker):
        await wait_until(lambda: worker.stats.acknowledged == 1, seconds=10)
    assert units == [(1, 0), (1, 1), (1, 2), (2, 3), (2, 4), (2, 5)]
    before, after = renewals[1]
    assert before < 1.1 and after > 1.8


async def test_a_checkpoint_keeps_the_worker_s_lease_on_a_queue_with_a_zero_timeout(
    api: AsyncClient, url: str
) -> None:
    # The queue's visibility_timeout is 0: a checkpoint renewed by it would make
    # the message visible at once. The worker sends its own lease as the timeout.
    await api.create_queue("zero", visibility_timeout=0)
    await api.send("zero", "job")
    checkpointed = threading.Event()
    finish = threading.Event()
    grants: list[tuple[int, float]] = []

    def handler(message: Message, ctx: Context) -> None:
        granted = ctx.checkpoint({"next": 1})
        grants.append((granted.lease_seconds, ctx.lease_remaining))
        checkpointed.set()
        finish.wait(10)
        ctx.raise_if_cancelled()

    # beats only every 4.9 s: until then the checkpoint alone holds the lease
    worker = Worker(handler, queue="zero", url=url, wait=1, visibility_timeout=5,
                    heartbeat_period=4.9)
    async with running(worker):
        await wait_until(checkpointed.is_set)
        assert await api.receive("zero", visibility_timeout=30, wait=0) == []  # a rival
        assert (await stats(api, "zero"))["in_flight"] == 1
        finish.set()
        await wait_until(lambda: worker.stats.acknowledged == 1)
    ((granted, remaining),) = grants
    assert granted == 5 and remaining > 4.0
    assert worker.stats.abandoned == 0 and worker.stats.beats == 0


async def test_an_async_checkpoint_from_a_handler_on_the_heartbeat_thread(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("acheck", visibility_timeout=5)
    await api.send("acheck", "job")
    cursors: list[Any] = []

    async def handler(message: Message, ctx: AsyncContext) -> None:
        cursors.append(message.checkpoint)
        if message.receive_count == 1:
            granted = await ctx.checkpoint({"page": 7})
            assert granted.lease_seconds == 5
            raise RuntimeError("retry me")

    worker = Worker(handler, queue="acheck", url=url, wait=1, heartbeat="thread")
    async with running(worker):
        await wait_until(lambda: worker.stats.acknowledged == 1, seconds=10)
    assert cursors == [None, {"page": 7}]


async def test_a_checkpoint_after_the_lease_is_lost_cancels_the_handler(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("lostcheck", visibility_timeout=30)
    await api.send("lostcheck", "job")
    handles: list[str] = []
    go = threading.Event()
    raised: list[CancelReason] = []

    def handler(message: Message, ctx: Context) -> None:
        handles.append(message.receipt_handle)
        go.wait(10)
        try:
            ctx.checkpoint({"next": 1})
        except HandlerCancelled as exc:
            raised.append(exc.reason)
            raise

    worker = Worker(handler, queue="lostcheck", url=url, wait=1)
    async with running(worker):
        await wait_until(lambda: bool(handles))
        mine = await steal(api, "lostcheck", handles[0])
        go.set()
        await wait_until(lambda: worker.stats.abandoned == 1)
    assert raised == [CancelReason.LEASE_LOST]
    await api.release("lostcheck", mine.receipt_handle, 0)
    # A long poll: the worker's last receive, cut off at its stop, may have
    # claimed the message as it came back; that claim is given back at once.
    (again,) = await api.receive("lostcheck", wait=10)
    assert again.checkpoint is None  # the stale checkpoint was refused
