"""The Worker in-process against the real service (uvicorn in this event loop, real
PostgreSQL): async and sync handlers run and acknowledged, failed messages
released with the worker's backoff or the queue's retry ladder.

The process-level faults (SIGKILL, SIGSTOP, a cut network) are in
test_worker_faults.py.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from support import wait_until
from worker_support import running, stats

from leaseq import AsyncClient, AsyncContext, Backoff, Context, Message, Outcome, Worker

# -- the worker ----------------------------------------------------------------------


async def test_an_async_handler_is_run_and_its_message_acknowledged(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("ack", visibility_timeout=5)
    sent = await api.send("ack", "hello", attributes={"kind": "greeting"})
    seen: list[tuple[Message, int, object]] = []

    async def handler(message: Message, ctx: AsyncContext) -> None:
        seen.append((message, ctx.fencing_token, ctx))

    worker = Worker(handler, queue="ack", url=url, wait=1)
    assert worker.heartbeat_mode == "task"
    async with running(worker):
        await wait_until(lambda: worker.stats.acknowledged == 1)
    ((message, token, ctx),) = seen
    assert message.message_id == sent.message_id and message.body == "hello"
    assert message.attributes == {"kind": "greeting"} and message.receive_count == 1
    assert token == message.fencing_token and isinstance(ctx, AsyncContext)
    assert (await stats(api, "ack"))["visible"] == 0
    assert (await stats(api, "ack"))["in_flight"] == 0


async def test_a_sync_handler_runs_off_the_event_loop_with_a_heartbeat_thread(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("sync", visibility_timeout=1)
    await api.send("sync", "work")
    threads: list[str] = []

    def handler(message: Message, ctx: Context) -> None:
        threads.append(threading.current_thread().name)
        assert isinstance(ctx, Context)
        # three leases long: only heartbeats keep the message ours
        deadline = time.monotonic() + 3.2
        while time.monotonic() < deadline:
            ctx.raise_if_cancelled()
            time.sleep(0.05)

    worker = Worker(handler, queue="sync", url=url, wait=1, visibility_timeout=1)
    assert worker.heartbeat_mode == "thread"
    async with running(worker):
        await wait_until(lambda: worker.stats.acknowledged == 1, seconds=15)
    assert len(threads) == 1 and threads[0].startswith("leaseq-handler-")
    assert worker.stats.beats >= 6 and worker.stats.abandoned == 0
    assert (await stats(api, "sync"))["in_flight"] == 0


async def test_a_failing_handler_is_released_for_a_retry_after_the_backoff(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("retry", visibility_timeout=60)
    await api.send("retry", "flaky")
    attempts: list[tuple[int, float]] = []

    async def handler(message: Message, ctx: AsyncContext) -> None:
        attempts.append((message.receive_count, time.monotonic()))
        if message.receive_count == 1:
            raise RuntimeError("first attempt fails")

    worker = Worker(handler, queue="retry", url=url, wait=1,
                    backoff=Backoff(initial=1, jitter=0))
    async with running(worker):
        # Without the release, the retry would wait for the 60 s lease.
        await wait_until(lambda: worker.stats.acknowledged == 1, seconds=10)
    assert [count for count, _ in attempts] == [1, 2]
    assert attempts[1][1] - attempts[0][1] >= 0.9  # the 1 s backoff
    assert worker.stats.failed == 1 and worker.stats.released == 1


async def test_without_backoff_the_queue_s_retry_ladder_delays_a_failed_message(
    api: AsyncClient, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    ladder = {"initial": 30, "multiplier": 2, "max": 300, "jitter": 0}
    await api.create_queue("ladder", visibility_timeout=60, retry_backoff=ladder)
    sent = await api.send("ladder", "flaky")

    def handler(message: Message, ctx: Context) -> None:
        raise RuntimeError("fails")

    worker = Worker(handler, queue="ladder", url=url, wait=1)
    assert worker.backoff is None
    with caplog.at_level(logging.INFO, logger="leaseq.worker"):
        async with running(worker):
            await wait_until(lambda: worker.stats.released == 1, seconds=10)
            # released through POST .../release with no delay: the ladder's 30 s
            # apply (a release at once, or a lapsed lease, would leave it visible)
            now = await stats(api, "ladder")
            assert (now["visible"], now["in_flight"], now["delayed"]) == (0, 0, 1)
    assert [(m, o) for m, _t, o in worker.stats.recent] == [(sent.message_id, Outcome.RELEASED)]
    assert worker.stats.failed == 1 and worker.stats.received == 1
    assert "released (its handler failed), visible again in 30s" in caplog.text


async def test_an_explicit_backoff_s_delay_overrides_the_queue_s_ladder(
    api: AsyncClient, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    ladder = {"initial": 300, "max": 300, "jitter": 0}
    await api.create_queue("own", visibility_timeout=60, retry_backoff=ladder)
    await api.send("own", "flaky")
    attempts: list[float] = []

    async def handler(message: Message, ctx: AsyncContext) -> None:
        attempts.append(time.monotonic())
        if message.receive_count == 1:
            raise RuntimeError("first attempt fails")

    worker = Worker(handler, queue="own", url=url, wait=1, backoff=Backoff(initial=1, jitter=0))
    with caplog.at_level(logging.INFO, logger="leaseq.worker"):
        async with running(worker):
            # the ladder would hold the message for 300 s; the worker asked for 1 s
            await wait_until(lambda: worker.stats.acknowledged == 1, seconds=10)
    assert len(attempts) == 2 and attempts[1] - attempts[0] >= 0.9
    assert "released (its handler failed), visible again in 1s" in caplog.text


async def test_without_backoff_a_failed_message_is_retried_at_once(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("again", visibility_timeout=60)
    await api.send("again", "flaky")
    counts: list[int] = []

    def handler(message: Message, ctx: Context) -> None:
        counts.append(message.receive_count)
        if message.receive_count < 3:
            raise ValueError("not yet")

    worker = Worker(handler, queue="again", url=url, wait=1)
    async with running(worker):
        await wait_until(lambda: worker.stats.acknowledged == 1, seconds=10)
    assert counts == [1, 2, 3]
