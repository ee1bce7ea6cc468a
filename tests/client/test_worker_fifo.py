"""The Python client and worker on FIFO queues, against the real service (uvicorn in
this event loop, real PostgreSQL): the client's FIFO fields, and a worker that
handles each group's messages one at a time in order while groups run
concurrently, gives back the rest of a group after a failure, heartbeats the
messages it holds for later, and gives back what has not started at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pytest
from support import wait_until
from worker_support import running

from leaseq import (
    ApiError,
    AsyncClient,
    AsyncContext,
    Client,
    Context,
    Message,
    Outcome,
    OutgoingMessage,
    Sent,
    ValidationError,
    Worker,
)


async def send_groups(
    api: AsyncClient, queue: str, groups: list[str], per_group: int
) -> dict[str, list[str]]:
    """`per_group` messages to each group, sent in batches that interleave the
    groups; each group's bodies in send order."""
    sent: dict[str, list[str]] = {g: [] for g in groups}
    for start in range(0, per_group, 10):
        for group in groups:
            bodies = [f"{group}-{n:03d}" for n in range(start, min(start + 10, per_group))]
            results = await api.send_batch(queue, [
                OutgoingMessage(body, group=group, deduplication_id=body) for body in bodies
            ])
            assert all(isinstance(r, Sent) and r.sequence_number for r in results), results
            sent[group].extend(bodies)
    return sent


@dataclass(frozen=True)
class Run:
    group: str
    body: str
    receive_count: int
    start: float
    end: float


def most_at_once(runs: list[Run]) -> int:
    """The most handler runs that overlapped in time."""
    edges = sorted([(r.start, 1) for r in runs] + [(r.end, -1) for r in runs])
    most = current = 0
    for _, step in edges:
        current += step
        most = max(most, current)
    return most


def groups_overlapped(runs: list[Run]) -> bool:
    """Did runs of two different groups overlap in time?"""
    return any(
        a.group != b.group and a.start < b.end and b.start < a.end
        for i, a in enumerate(runs) for b in runs[i + 1:]
    )


def assert_one_at_a_time(runs: list[Run]) -> None:
    """Within each group, every run ended before the next one started."""
    by_group: dict[str, list[Run]] = defaultdict(list)
    for run in sorted(runs, key=lambda r: r.start):
        by_group[run.group].append(run)
    for group, ordered in by_group.items():
        for before, after in itertools.pairwise(ordered):
            assert before.end <= after.start, (group, before, after)


def handled(runs: list[Run], group: str) -> list[tuple[str, int]]:
    return [(r.body, r.receive_count) for r in sorted(runs, key=lambda r: r.start)
            if r.group == group]


# -- the client ------------------------------------------------------------------


async def test_the_clients_send_and_receive_fifo_fields(api: AsyncClient, url: str) -> None:
    created = await api.create_queue("orders.fifo", fifo=True, visibility_timeout=30)
    attrs = created.attributes
    assert (attrs.fifo, attrs.content_based_deduplication, attrs.deduplication_scope,
            attrs.fifo_throughput_limit) == (True, False, "queue", "per_queue")
    changed = await api.update_queue(
        "orders.fifo", content_based_deduplication=True, deduplication_scope="message_group",
        fifo_throughput_limit="per_message_group_id",
    )
    attrs = changed.attributes
    assert (attrs.fifo, attrs.content_based_deduplication, attrs.deduplication_scope,
            attrs.fifo_throughput_limit) == (True, True, "message_group", "per_message_group_id")

    first = await api.send("orders.fifo", "one", group="A", deduplication_id="d-1")
    again = await api.send("orders.fifo", "one, again", group="A", deduplication_id="d-1")
    assert first.sequence_number is not None
    assert (again.message_id, again.sequence_number) == (first.message_id, first.sequence_number)
    by_content = await api.send("orders.fifo", "two", group="A")  # content-based dedup
    results = await api.send_batch("orders.fifo", [
        OutgoingMessage("three", group="A", deduplication_id="d-3"),
        OutgoingMessage("b-one", group="B", deduplication_id="d-b1", attributes={"k": "v"}),
        OutgoingMessage("no group", deduplication_id="d-x"),
    ])
    three, b_one, refused = results
    assert isinstance(three, Sent) and isinstance(b_one, Sent)
    assert isinstance(refused, ApiError) and refused.status == 422
    assert by_content.sequence_number is not None and three.sequence_number is not None
    numbers = [first.sequence_number, by_content.sequence_number, three.sequence_number]
    assert [int(n) for n in numbers] == sorted(int(n) for n in numbers)
    with pytest.raises(ValidationError):
        await api.send("orders.fifo", "late", group="A", deduplication_id="d-9", delay=5)

    got = await api.receive("orders.fifo", max=10, wait=0)
    assert [(m.body, m.group) for m in got] == [
        ("one", "A"), ("two", "A"), ("three", "A"), ("b-one", "B"),
    ]
    assert [m.sequence_number for m in got[:3]] == numbers
    assert got[0].deduplication_id == "d-1" and got[2].deduplication_id == "d-3"
    assert got[1].deduplication_id  # the body's hash
    assert got[3].attributes == {"k": "v"}

    def blocking() -> tuple[Sent, list[Message]]:
        with Client(url) as client:  # the blocking client has the same fields
            client.create_queue("plain")
            sent = client.send("plain", "x")
            return sent, client.receive("plain", wait=0)

    sent, (plain,) = await asyncio.to_thread(blocking)
    assert sent.sequence_number is None
    assert (plain.group, plain.sequence_number, plain.deduplication_id) == (None, None, None)
    assert (await api.get_queue("plain")).attributes.fifo is False


async def test_the_send_batcher_carries_the_group(api: AsyncClient) -> None:
    await api.create_queue("batched.fifo", fifo=True)
    async with api.batcher(max_wait=0.05) as batcher:
        sent = await asyncio.gather(*(
            batcher.send("batched.fifo", f"m{n}", group="G", deduplication_id=f"m{n}")
            for n in range(5)
        ))
    assert batcher.requests == 1
    assert all(s.sequence_number for s in sent)
    got = await api.receive("batched.fifo", max=10, wait=0)
    assert [m.body for m in got] == [f"m{n}" for n in range(5)]


# -- the worker ------------------------------------------------------------------


async def test_each_group_is_handled_in_order_one_at_a_time_and_groups_concurrently(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("work.fifo", fifo=True, visibility_timeout=30)
    groups = [f"g{n}" for n in range(10)]
    sent = await send_groups(api, "work.fifo", groups, 20)
    runs: list[Run] = []
    previous: dict[str, str] = {}  # group -> the message id handled last
    unacknowledged: list[str] = []  # started while the one before was not acknowledged

    async def handler(message: Message, ctx: AsyncContext) -> None:
        assert message.group is not None and ctx.fencing_token == message.fencing_token
        start = time.monotonic()
        acknowledged = {m for m, _, outcome in worker.stats.recent
                        if outcome is Outcome.ACKNOWLEDGED}
        if message.group in previous and previous[message.group] not in acknowledged:
            unacknowledged.append(message.body)
        await asyncio.sleep(0.01)  # the work; lets other groups' handlers run meanwhile
        previous[message.group] = message.message_id
        runs.append(Run(message.group, message.body, message.receive_count, start,
                        time.monotonic()))

    worker = Worker(handler, queue="work.fifo", url=url, wait=1, concurrency=8)
    async with running(worker):
        await wait_until(lambda: worker.stats.acknowledged == 200, seconds=60)
    assert worker.fifo is True
    for group in groups:
        assert handled(runs, group) == [(body, 1) for body in sent[group]], group
    assert_one_at_a_time(runs)
    assert unacknowledged == []  # each started once the one before it was acknowledged
    assert groups_overlapped(runs)
    assert 2 <= most_at_once(runs) <= 8
    assert (worker.stats.failed, worker.stats.released, worker.stats.returned,
            worker.stats.abandoned, worker.stats.ack_rejected) == (0, 0, 0, 0, 0)
    stats = (await api.get_queue("work.fifo")).stats
    assert stats is not None and (stats.visible, stats.in_flight, stats.delayed) == (0, 0, 0)


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_failure_gives_back_the_rest_of_its_group_which_comes_again_in_order(
    api: AsyncClient, url: str, kind: str
) -> None:
    queue = f"fail-{kind}.fifo"
    await api.create_queue(queue, fifo=True, visibility_timeout=30)
    sent = await send_groups(api, queue, ["A", "B"], 5)
    runs: list[Run] = []
    cursors: list[Any] = []
    lock = threading.Lock()

    def ran(message: Message, start: float) -> bool:
        """Records the run; should it fail?"""
        assert message.group is not None
        with lock:
            runs.append(Run(message.group, message.body, message.receive_count, start,
                            time.monotonic()))
        return message.body == "A-002" and message.receive_count == 1

    async def async_handler(message: Message, ctx: AsyncContext) -> None:
        start = time.monotonic()
        if message.body == "A-002":
            cursors.append(message.checkpoint)
            if message.receive_count == 1:
                await ctx.checkpoint({"done": 1})
        await asyncio.sleep(0.01)
        if ran(message, start):
            raise RuntimeError("the first attempt at A-002 fails")

    def sync_handler(message: Message, ctx: Context) -> None:
        start = time.monotonic()
        if message.body == "A-002":
            cursors.append(message.checkpoint)
            if message.receive_count == 1:
                ctx.checkpoint({"done": 1})
        time.sleep(0.01)
        if ran(message, start):
            raise RuntimeError("the first attempt at A-002 fails")

    handler: Any = async_handler if kind == "async" else sync_handler
    # All ten messages were sent before the worker starts: its first receive
    # (of up to 8) holds the five of A, then three of B.
    worker = Worker(handler, queue=queue, url=url, wait=1, concurrency=8)
    async with running(worker):
        await wait_until(lambda: worker.stats.acknowledged == 10, seconds=30)
    assert handled(runs, "A") == [
        ("A-000", 1), ("A-001", 1), ("A-002", 1), ("A-002", 2), ("A-003", 2), ("A-004", 2),
    ]
    assert handled(runs, "B") == [(body, 1) for body in sent["B"]]
    assert_one_at_a_time(runs)
    assert cursors == [None, {"done": 1}]  # the checkpoint came back with the redelivery
    assert (worker.stats.failed, worker.stats.released, worker.stats.returned) == (1, 1, 2)
    outcomes = [outcome for _, _, outcome in worker.stats.recent]
    assert outcomes.count(Outcome.RETURNED) == 2 and outcomes.count(Outcome.RELEASED) == 1


async def test_messages_waiting_for_their_turn_keep_their_leases(
    api: AsyncClient, url: str
) -> None:
    # Leases of one second; the group's third message waits three for its turn.
    await api.create_queue("slow.fifo", fifo=True, visibility_timeout=1)
    sent = await send_groups(api, "slow.fifo", ["G"], 4)
    runs: list[Run] = []

    async def handler(message: Message, ctx: AsyncContext) -> None:
        assert message.group is not None
        start = time.monotonic()
        await asyncio.sleep(1.2)
        runs.append(Run(message.group, message.body, message.receive_count, start,
                        time.monotonic()))

    worker = Worker(handler, queue="slow.fifo", url=url, wait=1, concurrency=4,
                    visibility_timeout=1)
    async with running(worker):
        await wait_until(lambda: worker.stats.acknowledged == 4, seconds=30)
    assert handled(runs, "G") == [(body, 1) for body in sent["G"]]
    assert_one_at_a_time(runs)
    assert worker.stats.abandoned == worker.stats.ack_rejected == worker.stats.returned == 0
    assert worker.stats.beats >= 6  # the waiting ones were heartbeated too


async def test_at_shutdown_messages_not_started_are_given_back_in_order(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("stop.fifo", fifo=True, visibility_timeout=30)
    sent = await send_groups(api, "stop.fifo", ["G"], 5)
    started: list[str] = []
    finish = asyncio.Event()

    async def handler(message: Message, ctx: AsyncContext) -> None:
        started.append(message.body)
        await finish.wait()

    worker = Worker(handler, queue="stop.fifo", url=url, wait=1, concurrency=8, grace=30)
    task = asyncio.create_task(worker.serve())
    try:
        await wait_until(lambda: started == ["G-000"] and worker.stats.received == 5)
        worker.stop()  # with grace: G-000 may finish; the four behind it go back now
        await wait_until(lambda: worker.stats.returned == 4)
        stats = (await api.get_queue("stop.fifo")).stats
        assert stats is not None and (stats.visible, stats.in_flight) == (4, 1)
        # the group is still blocked by G-000, in flight
        assert await api.receive("stop.fifo", max=10, wait=0) == []
        finish.set()
        async with asyncio.timeout(30):
            await task
    finally:
        worker.stop(now=True)
        finish.set()
        with contextlib.suppress(Exception):
            await task
    assert started == ["G-000"] and worker.stats.acknowledged == 1
    again = await api.receive("stop.fifo", max=10, wait=0)
    assert [(m.body, m.receive_count) for m in again] == [(b, 2) for b in sent["G"][1:]]


async def test_the_worker_knows_a_fifo_queue_by_its_attributes(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("known.fifo", fifo=True)
    await api.create_queue("standard")
    await api.send("standard", "x")

    async def handler(message: Message, ctx: AsyncContext) -> None:
        return None

    fifo = Worker(handler, queue="known.fifo", url=url, wait=1)
    standard = Worker(handler, queue="standard", url=url, wait=1)
    async with running(fifo), running(standard):
        await wait_until(lambda: fifo.fifo is True)  # before any message
        await wait_until(lambda: standard.stats.acknowledged == 1)
    assert standard.fifo is None and fifo.stats.received == 0


async def test_the_python_client_sends_the_attempt_id(served: tuple[str, Any]) -> None:
    from leaseq import AsyncClient

    async with AsyncClient(served[0]) as api:
        await api.create_queue("orders.fifo", fifo=True)
        for n in range(2):
            await api.send("orders.fifo", f"m{n}", group="G", deduplication_id=f"m{n}")
        first = await api.receive("orders.fifo", max=2, attempt_id="a")
        again = await api.receive("orders.fifo", max=2, attempt_id="a")
        assert [m.receipt_handle for m in again] == [m.receipt_handle for m in first]
        settled = await api.receive_settling("orders.fifo", max=2, attempt_id="a")
        assert [m.receipt_handle for m in settled.messages] == [
            m.receipt_handle for m in first]
        assert await api.receive("orders.fifo", max=2, attempt_id="b") == []
