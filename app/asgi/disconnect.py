"""Noticing that an HTTP client went away while its request waits (long polls)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.types import Receive


class ClientGone:
    """Set when the client disconnects. The connection is watched only once
    a request may wait (a long poll parks): one that never waits (a short
    poll, a send) costs no watcher task."""

    __slots__ = ("_event", "_receive", "_watcher")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._event = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None

    def is_set(self) -> bool:
        return self._event.is_set()

    def watch(self) -> None:
        """Start noticing. Called when a long poll parks, before it looks: a
        wake that comes during the look must not find the watcher unstarted,
        or a claim would go to a client that left while it was parked."""
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch())

    async def wait(self) -> bool:
        self.watch()
        return await self._event.wait()

    async def _watch(self) -> None:
        # The request's body has been read, so the next ASGI message is the
        # client going away (or nothing, until the response is sent).
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._event.set()
                return

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher


@contextlib.asynccontextmanager
async def client_gone(receive: Receive) -> AsyncIterator[ClientGone]:
    """Whether the client disconnected, for as long as the block runs;
    `receive` is the request's ASGI receive, once its body has been read."""
    gone = ClientGone(receive)
    try:
        yield gone
    finally:
        await gone.close()
