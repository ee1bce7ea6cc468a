"""The Worker's leases in-process against the real service (uvicorn in this event
loop, real PostgreSQL): a lost lease cancels or tells the handler, failing
heartbeats cancel it when the lease runs out, and the lease clock starts when
the receive is sent.

The process-level faults (SIGKILL, SIGSTOP, a cut network) are in
test_worker_faults.py.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from support import wait_until
from worker_support import running, steal

from leaseq import AsyncClient, AsyncContext, CancelReason, Context, Message, Worker


async def test_a_lost_lease_cancels_an_async_handler_within_one_period(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("lost", visibility_timeout=3)
    await api.send("lost", "long")
    handles: list[str] = []
    cancelled: list[tuple[float, CancelReason | None]] = []

    async def handler(message: Message, ctx: AsyncContext) -> None:
        handles.append(message.receipt_handle)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append((time.monotonic(), ctx.cancel_reason))
            raise

    worker = Worker(handler, queue="lost", url=url, wait=1, visibility_timeout=3)  # beats every 1 s
    async with running(worker):
        await wait_until(lambda: bool(handles))
        mine = await steal(api, "lost", handles[0])
        taken = time.monotonic()
        await wait_until(lambda: worker.stats.abandoned == 1, seconds=5)
    ((at, reason),) = cancelled
    assert reason is CancelReason.LEASE_LOST
    assert at - taken < 1.0 + 0.25  # the next beat got 409, and the handler stopped
    assert worker.stats.acknowledged == 0 and worker.stats.released == 0
    await api.delete("lost", mine.receipt_handle)  # our claim was never touched


async def test_a_lost_lease_is_told_to_a_sync_handler_and_never_acknowledged(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("lostsync", visibility_timeout=3)
    await api.send("lostsync", "long")
    handles: list[str] = []
    told: list[tuple[float, CancelReason | None]] = []

    def handler(message: Message, ctx: Context) -> None:
        handles.append(message.receipt_handle)
        while not ctx.cancelled:
            time.sleep(0.01)
        told.append((time.monotonic(), ctx.cancel_reason))
        # returning normally after the token fired is still not a success

    worker = Worker(handler, queue="lostsync", url=url, wait=1, visibility_timeout=3)
    async with running(worker):
        await wait_until(lambda: bool(handles))
        mine = await steal(api, "lostsync", handles[0])
        taken = time.monotonic()
        await wait_until(lambda: worker.stats.abandoned == 1, seconds=5)
    ((at, reason),) = told
    assert reason is CancelReason.LEASE_LOST and at - taken < 1.0 + 0.25
    assert worker.stats.acknowledged == 0
    await api.delete("lostsync", mine.receipt_handle)


class Partition(httpx.AsyncBaseTransport):
    """The real network, except that heartbeats fail to connect (and are recorded)."""

    def __init__(self, attempts: list[float]) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.attempts = attempts

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PATCH":
            self.attempts.append(time.monotonic())
            raise httpx.ConnectError("partitioned", request=request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_failing_beats_cancel_the_handler_when_the_lease_runs_out(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("cut", visibility_timeout=2)
    await api.send("cut", "long")
    attempts: list[float] = []
    deadlines: list[float] = []
    cancelled: list[tuple[float, CancelReason | None]] = []

    async def handler(message: Message, ctx: AsyncContext) -> None:
        deadlines.append(time.monotonic() + ctx.lease_remaining)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append((time.monotonic(), ctx.cancel_reason))
            raise

    worker = Worker(handler, queue="cut", url=url, wait=1, visibility_timeout=2,
                    transport=lambda: Partition(attempts))
    async with running(worker):
        await wait_until(lambda: worker.stats.abandoned == 1, seconds=6)
        beats = list(attempts)  # those of the first delivery
        assert worker.stats.acknowledged == 0 and worker.stats.released == 0
    (at, reason), *_ = cancelled
    deadline, *_ = deadlines
    assert reason is CancelReason.LEASE_EXPIRED
    assert deadline - 0.01 <= at < deadline + 0.25  # at the deadline, not a beat later
    assert len(beats) >= 3  # it kept trying ...
    assert max(beats) < deadline  # ... but never once the lease was past
    # the message comes back (here, to this same worker too) when the service's
    # lease ends, which is never before ours
    (again,) = await api.receive("cut", wait=3)
    assert again.receive_count >= 2


class SlowReceive(httpx.AsyncBaseTransport):
    """Answers of receive requests arrive `delay` seconds late."""

    def __init__(self, delay: float) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.delay = delay

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/receive"):
            await asyncio.sleep(self.delay)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_the_lease_clock_starts_when_the_receive_is_sent(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("clock", visibility_timeout=4)
    await api.send("clock", "m")
    remaining: list[float] = []

    async def handler(message: Message, ctx: AsyncContext) -> None:
        remaining.append(ctx.lease_remaining)

    worker = Worker(handler, queue="clock", url=url, wait=1, visibility_timeout=4,
                    transport=lambda: SlowReceive(0.8))
    async with running(worker):
        await wait_until(lambda: worker.stats.acknowledged == 1)
    # From the answer's arrival it would be ~4 s; from the request's sending, <= 3.2 s.
    assert 2.5 < remaining[0] <= 3.2
