"""The ids of every API key stored, held by each process.

Key ids are not secret (every receiver sees `SenderId`), so anyone may name
one that does not exist, as often as they like: an id not held here is
refused without a query. Ids are never deleted nor reused, so a revoked or
expired key's id stays held (its key's own query refuses it). The ids are
read again when a notification says keys changed, and, for an id not held,
at most once every IDS_REREAD seconds: a key just created by another process
whose notification is still on its way (or never comes: the LISTEN
connection is down). Until that read, the request naming the id waits for it
(a notification's read ends the wait early); at most MAX_WAITING requests
wait at once, the others are refused, so made-up ids can hold neither
queries nor many connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

IDS_REREAD = 1.0
"""Seconds at least between two reads of the ids that unknown ids cause."""
MAX_WAITING = 100
"""Requests naming an unknown id that wait for the next read at once, per process."""


class KeyIds:
    def __init__(
        self,
        read: Callable[[], Awaitable[Iterable[str]]],
        *,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self._read = read
        self._spawn = spawn
        self._ids: frozenset[str] | None = None  # None: not read yet
        self._stale = True  # a change was announced since the last read began
        self._read_at = -math.inf
        self._reading: asyncio.Future[None] | None = None
        # Done when a read that began after it was made ends: what unknown ids wait on.
        self._next: asyncio.Future[None] | None = None
        self._added: list[str] | None = None  # by this process during a read
        self._waiting = 0
        self._timer: asyncio.TimerHandle | None = None

    def changed(self) -> None:
        """Keys changed (a notification); the caller reads again."""
        self._stale = True

    def add(self, key_id: str) -> None:
        """A key this process created: known at once."""
        if self._added is not None:
            self._added.append(key_id)
        if self._ids is not None:
            self._ids = self._ids | {key_id}

    async def knows(self, key_id: str) -> bool:
        """Whether `key_id` may name a usable key (its own query tells for sure)."""
        if self._ids is not None and key_id in self._ids:
            return True
        if self._ids is None or self._stale or time.monotonic() - self._read_at >= IDS_REREAD:
            await self.read()
        elif self._waiting >= MAX_WAITING:
            return False
        else:
            self._waiting += 1
            try:
                await self._next_read()
            finally:
                self._waiting -= 1
        return self._ids is not None and key_id in self._ids

    async def read(self, *, fresh: bool = False) -> None:
        """Reads the ids. One read at a time: a read in progress is waited for,
        and read after only when a change came meanwhile, or with `fresh`. The
        read is a task of its own: a caller that goes away does not end it."""
        while self._reading is not None:
            await asyncio.shield(self._reading)
            if not self._stale and not fresh:
                return
        self._reading = asyncio.get_running_loop().create_task(self._read_now())
        await asyncio.shield(self._reading)

    async def _read_now(self) -> None:
        waiters, self._next = self._next, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._read_at = time.monotonic()
        self._stale = False
        self._added = []
        try:
            ids = set(await self._read())
        except BaseException as exc:
            self._stale = True
            if waiters is not None:
                if isinstance(exc, asyncio.CancelledError):
                    waiters.cancel()
                else:
                    waiters.set_exception(exc)
                    waiters.exception()  # retrieved: its waiters raise it themselves
            raise
        else:
            # A key this process created while the statement ran may be missing
            # from what it saw.
            self._ids = frozenset(ids.union(self._added))
            if waiters is not None:
                waiters.set_result(None)
        finally:
            self._reading = None
            self._added = None

    async def _next_read(self) -> None:
        if self._next is None:
            loop = asyncio.get_running_loop()
            self._next = loop.create_future()
            delay = max(0.0, self._read_at + IDS_REREAD - time.monotonic())
            self._timer = loop.call_later(delay, self._due, self._next)
        await asyncio.shield(self._next)

    def _due(self, waited: asyncio.Future[None]) -> None:
        self._timer = None
        if self._next is waited:  # no read began since: this one is for its waiters
            self._spawn(self._read_for_waiters())

    async def _read_for_waiters(self) -> None:
        # The waiters get the error from their future; nothing to log here.
        with contextlib.suppress(Exception):
            await self.read(fresh=True)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for future in (self._next, self._reading):
            if future is not None and not future.done():
                future.cancel()
