"""What the in-process worker tests share (tests/client/test_worker_*.py): a
worker serving in the test's event loop, a queue's counts, and taking a message
away from its holder."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx

from leaseq import AsyncClient, Message, Worker


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


async def steal(api: AsyncClient, queue: str, handle: str) -> Message:
    """Take a message away from its holder: release it with the holder's handle,
    then claim it. The holder's handle is dead from then on."""
    await api.release(queue, handle, 0)
    (mine,) = await api.receive(queue, visibility_timeout=60, wait=0)
    return mine


class Counting(httpx.AsyncBaseTransport):
    """A worker's transport that counts its requests by method and what they act on
    (a message, else the last part of the path)."""

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
