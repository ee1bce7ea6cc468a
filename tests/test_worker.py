"""The worker SDK in-process: its clients, the Worker's heartbeat, watchdog,
acknowledgement, release, checkpoints, concurrency and stop — against the real
service (uvicorn in this event loop, real PostgreSQL).

The process-level faults (SIGKILL, SIGSTOP, a cut network) are in
test_worker_faults.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from processes import LEASEQ, service_env
from support import eventually, wait_until

import leaseq
from leaseq import (
    ApiError,
    AsyncClient,
    AsyncContext,
    Backoff,
    CancelReason,
    Client,
    Context,
    HandlerCancelled,
    InvalidReceiptHandle,
    LeaseClock,
    LeaseLost,
    Message,
    Outcome,
    OutgoingMessage,
    PeekedMessage,
    PeekPage,
    Queue,
    QueueAlreadyExists,
    QueueNotFound,
    QueuePage,
    RedriveTask,
    Released,
    RetryBackoff,
    Unreachable,
    ValidationError,
    Worker,
)
from leaseq.cli import _parser, worker_backoff

TESTS = Path(__file__).resolve().parent

SERVER_MODULES = (
    "fastapi", "starlette", "sqlalchemy", "asyncpg", "uvicorn", "pydantic", "pydantic_settings",
    "alembic", "app",
)


def server_modules(loaded: list[str]) -> list[str]:
    return [m for m in loaded if any(m == s or m.startswith(s + ".") for s in SERVER_MODULES)]


@pytest.fixture
async def api(served: tuple[str, Any]) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(served[0]) as client:
        yield client


@pytest.fixture
def url(served: tuple[str, Any]) -> str:
    return served[0]


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """The worker serving in this loop; stopped (without grace) on the way out."""
    task = asyncio.create_task(worker.serve())
    try:
        yield task
    finally:
        worker.stop(now=True)
        async with asyncio.timeout(30):
            await task


async def stats(api: AsyncClient, queue: str) -> dict[str, Any]:
    detail = await api.get_queue(queue)
    assert detail.stats is not None
    return dataclasses.asdict(detail.stats)


# -- the package stands alone --------------------------------------------------------


@pytest.mark.e2e
def test_importing_the_client_loads_no_server_module() -> None:
    # The package's names load when first used (leaseq/__init__.py): use them.
    code = ("import json, sys\nfrom leaseq import AsyncClient, Client, Worker\n"
            "print(json.dumps(sorted(sys.modules)))")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
        cwd=TESTS.parent,
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert "leaseq" in loaded and "httpx" in loaded
    assert server_modules(loaded) == []


@pytest.mark.e2e
def test_leaseq_worker_loads_no_server_module(tmp_path: Path) -> None:
    # The probe handler module records sys.modules when the worker imports it;
    # `missing` then makes the command stop with exit 2.
    out = tmp_path / "modules.json"
    env = service_env() | {"LEASEQ_TEST_MODULES": str(out)}
    result = subprocess.run(
        [LEASEQ, "worker", "--queue", "q", "--app-dir", str(TESTS),
         "worker_handlers.modules_probe:missing"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "cannot load worker_handlers.modules_probe:missing" in result.stderr
    loaded = json.loads(out.read_text())
    assert "leaseq.cli" in loaded and "app" not in loaded
    assert server_modules(loaded) == []


def test_the_public_surface() -> None:
    assert sorted(leaseq.__all__) == sorted(
        name for name in dir(leaseq) if not name.startswith("_")
        and name not in {
            "backoff", "batching", "cli", "client", "context", "errors", "lease", "models",
            "tracing", "worker",
        }
    )


# -- the clients ---------------------------------------------------------------------


async def test_the_clients_cover_queues_peek_and_redrive_with_typed_results(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("typed-dlq")
    created = await api.create_queue(
        "typed", visibility_timeout=5, dead_letter_queue="typed-dlq", max_receive_count=1,
        retry_backoff={"initial": 2, "max": 8, "multiplier": 2, "jitter": 0},
    )
    assert isinstance(created, Queue) and created.stats is None
    assert created.attributes.dead_letter_queue == "typed-dlq"
    assert created.attributes.retry_backoff == RetryBackoff(2, 2, 8, 0)
    changed = await api.update_queue("typed", visibility_timeout=7, retry_backoff=None)
    assert changed.attributes.visibility_timeout == 7 and changed.attributes.retry_backoff is None
    page = await api.list_queues(prefix="typed", limit=1)
    assert [q.name for q in page.queues] == ["typed"] and page.next_after == "typed"
    rest = await api.list_queues(prefix="typed", after=page.next_after)
    assert [q.name for q in rest.queues] == ["typed-dlq"]
    assert await api.dead_letter_sources("typed-dlq") == ["typed"]

    await api.send("typed", "x" * 50, attributes={"k": "v"})
    peeked = await api.peek("typed", state="visible", body_chars=10)
    (one,) = peeked.messages
    assert isinstance(one, PeekedMessage) and one.body == "x" * 10 and one.truncated
    assert one.attributes == {"k": "v"} and one.state == "visible" and peeked.next_after is None
    # received once, then dead-lettered by the next claim (max_receive_count 1)
    (got,) = await api.receive("typed", visibility_timeout=0, wait=0)
    assert await api.receive("typed", wait=0) == []
    detail = await api.get_queue("typed-dlq")
    assert detail.stats is not None and detail.stats.visible == 1
    assert (await api.peek("typed-dlq")).messages[0].dead_letter_source == "typed"

    task = await api.start_redrive("typed-dlq")
    assert isinstance(task, RedriveTask) and task.source == "typed-dlq"
    assert [t.task_id for t in await api.list_redrives("typed-dlq")] == [task.task_id]

    async def finished() -> bool:
        return (await api.get_redrive(task.task_id)).status != "running"

    await eventually(finished)
    done = await api.get_redrive(task.task_id)
    assert (done.status, done.moved) == ("completed", 1)
    with pytest.raises(ApiError) as info:
        await api.cancel_redrive("not-a-task")
    assert (info.value.status, info.value.code) == (404, "task_not_found")

    def blocking_calls() -> tuple[Queue, QueuePage, PeekPage]:
        with Client(url) as blocking:  # the blocking client has the same calls
            return (blocking.get_queue("typed"), blocking.list_queues(prefix="typed-"),
                    blocking.peek("typed"))

    queue, listed, peek = await asyncio.to_thread(blocking_calls)
    assert queue.stats is not None and [q.name for q in listed.queues] == ["typed-dlq"]
    assert peek.messages[0].message_id == got.message_id


async def test_the_async_client_speaks_the_whole_message_api(api: AsyncClient) -> None:
    created = await api.create_queue("sdk", visibility_timeout=30)
    assert created.name == "sdk" and created.attributes.visibility_timeout == 30
    assert (await api.create_queue("sdk", visibility_timeout=30)).name == "sdk"
    with pytest.raises(QueueAlreadyExists):
        await api.create_queue("sdk", visibility_timeout=31)

    one = await api.send("sdk", "one", attributes={"kind": "a"})
    batch = await api.send_batch("sdk", ["two", OutgoingMessage("three", delay=0)])
    assert all(not isinstance(r, ApiError) for r in batch)
    got = await api.receive("sdk", max=10, visibility_timeout=7, wait=0)
    assert sorted(m.body for m in got) == ["one", "three", "two"]
    first = next(m for m in got if m.message_id == one.message_id)
    assert first.attributes == {"kind": "a"} and first.receive_count == 1
    assert first.lease_seconds == 7 and first.checkpoint is None
    assert len({m.fencing_token for m in got}) == 3

    lease = await api.extend("sdk", first.receipt_handle, 12)
    assert lease.lease_seconds == 12
    saved = await api.checkpoint("sdk", first.receipt_handle, {"next": 4})
    assert saved.lease_seconds == 30  # the service renews a checkpoint by the queue's timeout
    saved = await api.checkpoint("sdk", first.receipt_handle, {"next": 4}, timeout=11)
    assert saved.lease_seconds == 11  # ... or by the timeout it is given
    extended = await api.extend_batch("sdk", [(m.receipt_handle, 9) for m in got])
    assert [r.lease_seconds for r in extended if not isinstance(r, ApiError)] == [9, 9, 9]

    released = await api.release("sdk", first.receipt_handle)  # no ladder: at once
    assert isinstance(released, Released) and released.delay_seconds == 0
    (again,) = await api.receive("sdk", wait=0)
    assert again.message_id == one.message_id and again.checkpoint == {"next": 4}
    assert again.receive_count == 2 and again.fencing_token > first.fencing_token

    # the first claim is dead for good: every write with its handle is refused
    with pytest.raises(LeaseLost) as lost:
        await api.extend("sdk", first.receipt_handle, 5)
    assert lost.value.status == 409 and lost.value.code == "lease_lost"
    with pytest.raises(LeaseLost):
        await api.delete("sdk", first.receipt_handle)
    with pytest.raises(LeaseLost):
        await api.checkpoint("sdk", first.receipt_handle, 1)

    results = await api.delete_batch(
        "sdk", [again.receipt_handle, first.receipt_handle,
                *(m.receipt_handle for m in got if m is not first)]
    )
    assert results[0] is None and isinstance(results[1], LeaseLost)
    assert results[2:] == [None, None]
    assert await stats(api, "sdk") == {
        "visible": 0, "in_flight": 0, "delayed": 0, "oldest_age_seconds": 0.0
    }


async def test_problems_become_exceptions_by_their_code(api: AsyncClient) -> None:
    with pytest.raises(QueueNotFound) as missing:
        await api.receive("nowhere", wait=0)
    assert missing.value.status == 404 and not missing.value.transient
    await api.create_queue("errs")
    with pytest.raises(InvalidReceiptHandle):
        await api.delete("errs", "not-a-handle")
    with pytest.raises(ValidationError):
        await api.receive("errs", max=11)
    with pytest.raises(ValidationError):
        await api.send("errs", "")


async def test_an_unreachable_service_is_one_exception() -> None:
    async with AsyncClient("http://127.0.0.1:1", timeout=5) as dead:
        with pytest.raises(Unreachable):
            await dead.receive("q", wait=0)
    with Client("http://127.0.0.1:1", timeout=5) as sync_dead, pytest.raises(Unreachable):
        sync_dead.send("q", "x")


async def test_the_blocking_client(url: str) -> None:
    def round_trip() -> list[Message]:
        with Client(url) as client:
            client.create_queue("blocking", visibility_timeout=10)
            client.send("blocking", "b")
            received = client.receive("blocking", max=1, wait=1)
            client.delete("blocking", received[0].receipt_handle)
            with pytest.raises(LeaseLost):
                client.delete("blocking", received[0].receipt_handle)
            return received

    (message,) = await asyncio.to_thread(round_trip)
    assert message.body == "b" and message.lease_seconds == 10


async def test_a_long_poll_outlasts_the_default_timeout(api: AsyncClient) -> None:
    # The read timeout of a receive follows its `wait`: a 2 s poll on a client
    # whose own timeout is 1 s answers (empty) instead of timing out.
    await api.create_queue("slowpoll")
    async with AsyncClient(api.url, timeout=1.0) as short:
        assert await short.receive("slowpoll", wait=2) == []


# -- lease arithmetic and backoff, on a fake clock -----------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_lease_is_measured_from_the_send_and_moved_only_by_newer_renewals() -> None:
    clock = FakeClock()
    lease = LeaseClock("h", 9, sent_at=100.0, clock=clock)
    assert lease.period == 3.0 and lease.deadline == 109.0 and lease.next_beat == 103.0
    clock.now = 104.0
    lease.renewed(103.0, 9)
    assert lease.deadline == 112.0 and lease.next_beat == 106.0
    lease.renewed(102.0, 9)  # an older answer arriving late moves nothing
    assert lease.deadline == 112.0
    lease.renewed(104.0, 3)  # a shorter grant (a checkpoint) beats sooner
    assert lease.deadline == 107.0 and lease.next_beat == 105.0
    lease.beat_failed(105.0)
    assert lease.next_beat == 106.5
    assert not lease.cancelled
    clock.now = 107.0
    assert lease.cancelled and lease.reason is CancelReason.LEASE_EXPIRED


def test_the_watchdog_fires_once_with_the_first_reason() -> None:
    clock = FakeClock()
    lease = LeaseClock("h", 3, sent_at=100.0, clock=clock)
    calls: list[CancelReason] = []
    lease.on_cancel(calls.append)
    assert lease.cancel(CancelReason.LEASE_LOST)
    assert not lease.cancel(CancelReason.SHUTDOWN)
    lease.on_cancel(calls.append)  # registered late: called at once
    assert calls == [CancelReason.LEASE_LOST, CancelReason.LEASE_LOST]
    closed = LeaseClock("h", 3, sent_at=100.0, clock=clock)
    closed.close()
    assert not closed.cancel(CancelReason.LEASE_LOST) and closed.reason is None
    with pytest.raises(ValueError):
        LeaseClock("h", 3, sent_at=0.0, period=3.0)


def test_backoff_grows_with_the_receive_count_and_is_capped() -> None:
    assert Backoff().delay(5) == 0
    ladder = Backoff(initial=2, multiplier=3, maximum=100, jitter=0)
    assert [ladder.delay(n) for n in range(1, 7)] == [2, 6, 18, 54, 100, 100]
    assert ladder.delay(10_000) == 100
    jittered = Backoff(initial=10, jitter=0.5)
    assert jittered.delay(1, rng=lambda: 0.0) == 5 and jittered.delay(1, rng=lambda: 1.0) == 15
    with pytest.raises(ValueError):
        Backoff(multiplier=0.5)


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


async def steal(api: AsyncClient, queue: str, handle: str) -> Message:
    """Take a message away from its holder: release it with the holder's handle,
    then claim it. The holder's handle is dead from then on."""
    await api.release(queue, handle, 0)
    (mine,) = await api.receive(queue, visibility_timeout=60, wait=0)
    return mine


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


class Counting(httpx.AsyncBaseTransport):
    """Counts requests by method and the last part of their path."""

    def __init__(self, seen: Counter[str]) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.seen = seen

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        kind = "message" if "/messages/" in path and path.count("/") == 5 else (
            path.rsplit("/", 1)[-1])
        self.seen[f"{request.method} {kind}"] += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_busy_worker_s_acknowledgements_ride_on_its_receives(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("ride")
    await api.send_batch("ride", [f"m{i}" for i in range(10)])
    await api.send_batch("ride", [f"m{i}" for i in range(10, 20)])
    seen: Counter[str] = Counter()

    async def handler(message: Message, ctx: AsyncContext) -> None:
        return None

    worker = Worker(handler, queue="ride", url=url, wait=1, visibility_timeout=30,
                    transport=lambda: Counting(seen))
    async with running(worker):
        await wait_until(lambda: worker.stats.acknowledged == 20)
    assert worker.stats.ack_rejected == 0
    assert seen["DELETE message"] == 0  # none sent alone
    carried = seen["POST receive"]
    assert carried >= 10, seen  # most acknowledgements went with a receive
    assert seen["POST delete"] <= 20 - carried, seen
    assert (await api.get_queue("ride")).stats.visible == 0


async def test_more_finished_messages_than_a_batch_holds_are_acknowledged(
    serve_factory: Any,
) -> None:
    """Twenty-five handlers finishing at once queue more acknowledgements than one
    request may carry (the service's default batch limit, 10): they go in several."""
    url, _ = await serve_factory(max_batch=10)
    async with AsyncClient(url) as api:
        await _many_finish_at_once(api, url)


async def _many_finish_at_once(api: AsyncClient, url: str) -> None:
    await api.create_queue("many")
    for start in range(0, 25, 10):
        await api.send_batch("many", [f"m{i}" for i in range(start, min(start + 10, 25))])
    started: list[str] = []
    release = asyncio.Event()

    async def handler(message: Message, ctx: AsyncContext) -> None:
        started.append(message.body)
        await release.wait()

    worker = Worker(handler, queue="many", url=url, wait=1, concurrency=25,
                    visibility_timeout=60)
    async with running(worker) as serving:
        await wait_until(lambda: len(started) == 25)
        release.set()
        await wait_until(lambda: worker.stats.acknowledged == 25)
        assert not serving.done()  # the worker goes on
    assert worker.stats.ack_rejected == 0
    assert (await api.get_queue("many")).stats.visible == 0


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


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"visibility_timeout": 0}, "visibility timeout"),
        ({"lease": 0}, "visibility timeout"),  # the option's earlier name
        ({"lease": 3, "visibility_timeout": 4}, "not both"),
        ({"visibility_timeout": 3, "heartbeat_period": 3}, "heartbeat period"),
        ({"wait": 21}, "wait"),
    ],
)
def test_worker_options_are_checked(options: dict[str, Any], message: str) -> None:
    def handler(message: Message, ctx: Context) -> None:
        pass

    with pytest.raises(ValueError, match=message):
        Worker(handler, queue="q", **options)


def test_the_visibility_timeout_option_keeps_its_earlier_name() -> None:
    def handler(message: Message, ctx: Context) -> None:
        pass

    assert Worker(handler, queue="q", lease=7).visibility_timeout == 7
    for flag in ("--visibility-timeout", "--lease"):
        args = _parser().parse_args(["worker", "--queue", "q", flag, "9", "m:f"])
        assert args.visibility_timeout == 9


def test_the_cli_s_retry_options_give_the_worker_a_backoff_or_leave_it_to_the_queue() -> None:
    def backoff(*options: str) -> Backoff | None:
        return worker_backoff(_parser().parse_args(["worker", "--queue", "q", *options, "m:f"]))

    assert backoff() is None  # the queue's retry ladder decides
    assert backoff("--retry-delay", "0") == Backoff(initial=0)
    assert backoff("--retry-delay", "5", "--retry-max", "60", "--retry-jitter", "0") == Backoff(
        initial=5, maximum=60, jitter=0
    )
    with pytest.raises(ValueError, match="--retry-multiplier needs --retry-delay"):
        backoff("--retry-multiplier", "3")


@pytest.mark.e2e
def test_the_cli_refuses_a_handler_it_cannot_load() -> None:
    result = subprocess.run(
        [LEASEQ, "worker", "--queue", "q", "no_such_module_here:handle"],
        env=service_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert "cannot load no_such_module_here:handle" in result.stderr
    bad = subprocess.run(
        [LEASEQ, "worker", "--queue", "q", "no-colon"],
        env=service_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert bad.returncode == 2 and "is not module:function" in bad.stderr


@pytest.mark.e2e
async def test_the_cli_reports_a_missing_queue(url: str) -> None:
    process = await asyncio.create_subprocess_exec(
        LEASEQ, "worker", "--queue", "absent", "--url", url, "--app-dir", str(TESTS),
        "worker_handlers.faults:steps",
        env=service_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        _out, err = await process.communicate()
    assert process.returncode == 1, err.decode()
    assert "queue_not_found" in err.decode().splitlines()[-1]
