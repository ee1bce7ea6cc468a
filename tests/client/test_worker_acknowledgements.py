"""The Worker's acknowledgements in-process against the real service (uvicorn in
this event loop, real PostgreSQL): a busy worker's ride on its receives, and
more than a batch holds go in several requests.

The process-level faults (SIGKILL, SIGSTOP, a cut network) are in
test_worker_faults.py.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from support import wait_until
from worker_support import Counting, running

from leaseq import AsyncClient, AsyncContext, Message, Worker


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
