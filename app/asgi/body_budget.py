"""How much request body one process holds for callers not proven yet.

On the SQS door the signature covers the body, so a request is proven only once
its body is read; and key ids are not secret (every receiver of a message sees
its sender's). Without a bound, requests that name a real key id and carry a
forged signature make the service hold a full body each until it is refused.
Here each such request reserves its declared length before its body is read and
gives it back once its signature is checked, pass or fail. The whole length is
reserved up front, never a part at a time: two half-read bodies each waiting for
the other's bytes would never finish. Waiters are served in order, so a large
request is not starved by small ones; one that cannot be served in time is
refused without its body being read.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib


class Reservation:
    """Bytes taken from a budget; `release` gives them back (once, however often
    it is called)."""

    __slots__ = ("_budget", "_bytes")

    def __init__(self, budget: BodyBudget, size: int) -> None:
        self._budget = budget
        self._bytes = size

    def release(self) -> None:
        if self._bytes:
            size, self._bytes = self._bytes, 0
            self._budget._give_back(size)


class BodyBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.high_water = 0
        """The most ever held at once (for tests and the curious)."""
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = (
            collections.deque())

    async def reserve(self, size: int, wait: float) -> Reservation | None:
        """`size` bytes (at most the whole budget), within `wait` seconds; None if
        they could not be had in time."""
        size = min(size, self.limit)
        if not self._waiting and self.held + size <= self.limit:
            self._take(size)
            return Reservation(self, size)
        if wait <= 0:
            return None
        served: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, served)
        self._waiting.append(entry)
        try:
            async with asyncio.timeout(wait):
                await served
        except TimeoutError:
            if not _served(served):
                self._leave(entry)
                return None
        except asyncio.CancelledError:
            if _served(served):  # served as it was cancelled
                self._give_back(size)
            else:
                self._leave(entry)
            raise
        return Reservation(self, size)

    def _leave(self, entry: tuple[int, asyncio.Future[None]]) -> None:
        with contextlib.suppress(ValueError):  # _serve may have dropped it
            self._waiting.remove(entry)
        self._serve()  # the head leaving may let those behind it in

    def _take(self, size: int) -> None:
        self.held += size
        self.high_water = max(self.high_water, self.held)

    def _give_back(self, size: int) -> None:
        self.held -= size
        self._serve()

    def _serve(self) -> None:
        while self._waiting and self.held + self._waiting[0][0] <= self.limit:
            size, served = self._waiting.popleft()
            if not served.done():
                self._take(size)
                served.set_result(None)


def _served(future: asyncio.Future[None]) -> bool:
    # A task cancelled (or timed out) while it awaits cancels the future too.
    return future.done() and not future.cancelled()
