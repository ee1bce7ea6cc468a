"""The Worker in-process against the real service (uvicorn in this event loop, real
PostgreSQL): concurrent handlers, a stop that lets handlers finish or cancels
them past the grace period, and the queues it refuses to start on.

The process-level faults (SIGKILL, SIGSTOP, a cut network) are in
test_worker_faults.py.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from support import wait_until
from worker_support import running

from leaseq import AsyncClient, AsyncContext, CancelReason, Context, Message, QueueNotFound, Worker


async def test_concurrency_runs_n_handlers_at_once(api: AsyncClient, url: str) -> None:
    await api.create_queue("many", visibility_timeout=10)
    await api.send_batch("many", ["a", "b", "c"])
    all_in = asyncio.Event()
    active = 0
    peak = 0

    async def handler(message: Message, ctx: AsyncContext) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        if active == 3:
            all_in.set()
        try:
            await asyncio.wait_for(all_in.wait(), 5)
        finally:
            active -= 1

    worker = Worker(handler, queue="many", url=url, wait=1, concurrency=3)
    async with running(worker):
        await wait_until(lambda: worker.stats.acknowledged == 3, seconds=10)
    assert peak == 3 and worker.stats.failed == 0


async def test_stop_lets_in_flight_handlers_finish_and_receives_no_more(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("drain", visibility_timeout=10)
    await api.send("drain", "first")
    started = asyncio.Event()
    finish = asyncio.Event()
    handled: list[str] = []

    async def handler(message: Message, ctx: AsyncContext) -> None:
        handled.append(message.body)
        started.set()
        await finish.wait()

    worker = Worker(handler, queue="drain", url=url, wait=20, grace=10)
    serving = asyncio.create_task(worker.serve())
    async with asyncio.timeout(10):
        await started.wait()
    worker.stop()
    await api.send("drain", "second")  # sent after the stop: never handled
    finish.set()
    async with asyncio.timeout(10):
        await serving
    assert handled == ["first"] and worker.stats.received == 1
    assert worker.stats.acknowledged == 1


async def test_past_the_grace_period_handlers_are_cancelled_and_released(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("grace", visibility_timeout=60)
    await api.send("grace", "slow")
    started = asyncio.Event()
    reasons: list[CancelReason | None] = []

    async def handler(message: Message, ctx: AsyncContext) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            reasons.append(ctx.cancel_reason)
            raise

    worker = Worker(handler, queue="grace", url=url, wait=1, grace=0.5)
    serving = asyncio.create_task(worker.serve())
    async with asyncio.timeout(10):
        await started.wait()
    stopped = time.monotonic()
    worker.stop()
    async with asyncio.timeout(10):
        await serving
    assert 0.5 <= time.monotonic() - stopped < 3
    assert reasons == [CancelReason.SHUTDOWN] and worker.stats.released == 1
    (back,) = await api.receive("grace", wait=0)  # visible at once, not after 60 s
    assert back.receive_count == 2


async def test_a_missing_queue_ends_the_worker_with_queue_not_found(url: str) -> None:
    def handler(message: Message, ctx: Context) -> None:
        raise AssertionError("never called")

    worker = Worker(handler, queue="absent", url=url, wait=1)
    with pytest.raises(QueueNotFound):
        async with asyncio.timeout(10):
            await worker.serve()


async def test_a_queue_without_a_lease_needs_one_from_the_worker(
    url: str, api: AsyncClient
) -> None:
    await api.create_queue("zero-lease", visibility_timeout=0)

    def handler(message: Message, ctx: Context) -> None:
        raise AssertionError("never called")

    worker = Worker(handler, queue="zero-lease", url=url, wait=1)
    with pytest.raises(ValueError, match="give the worker one"):
        async with asyncio.timeout(10):
            await worker.serve()
