"""Noticing that an HTTP client went away while its request waits (long polls)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.types import Receive


async def _watch(receive: Receive, gone: asyncio.Event) -> None:
    # The request's body has been read, so the next ASGI message is the client
    # going away (or nothing, until the response is sent).
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


@contextlib.asynccontextmanager
async def client_gone(receive: Receive) -> AsyncIterator[asyncio.Event]:
    """An event set when the client disconnects, for as long as the block runs;
    `receive` is the request's ASGI receive, once its body has been read."""
    gone = asyncio.Event()
    watcher = asyncio.create_task(_watch(receive, gone))
    try:
        yield gone
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
