"""Group commit: concurrent requests on one queue share one statement.

Every commit costs PostgreSQL a WAL flush and the service a pool checkout and
a round trip. While one statement for a key (a queue, an operation) is in
flight, the requests that arrive wait and then go together in the next one.
An idle queue pays nothing: a lone request runs at once, in a group of one.
Under load the groups grow by themselves, as large as the load is.

Each request keeps its own result and its own error: when a group's statement
fails for a reason other than a lost connection, each request of it is run
again alone, so one bad entry fails only the request that brought it. A lost
connection is not retried (the statement may have committed); every request
of the group gets the error, as each would have alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from app.errors import DatabaseUnavailable

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)

Run = Callable[[K, list[list[T]]], Awaitable[Sequence[R]]]
"""Runs one statement for the requests' items; one result per request, in order."""


@dataclass(eq=False)
class _Request(Generic[T, R]):
    items: list[T]
    weight: int
    rows: frozenset[Hashable]
    future: asyncio.Future[R]


@dataclass(eq=False)
class _Line(Generic[T, R]):
    pending: deque[_Request[T, R]] = field(default_factory=deque)
    running: bool = False


class Coalescer(Generic[K, T, R]):
    """One statement at a time per key; requests arriving meanwhile form the next.

    `limit` caps a group's total weight (`weigh` of each request's items;
    their count by default) -- a request heavier than the limit still runs,
    alone. `rows` names the database rows an item touches: a request touching
    a row already in the group waits for the next statement, so one statement
    never changes a row twice and concurrent requests on one row keep their
    order. `abandoned` gets the result of a request whose caller stopped
    waiting (cancelled) after its statement ran, to undo what it claimed.
    """

    def __init__(
        self,
        run: Run[K, T, R],
        *,
        limit: int,
        weigh: Callable[[list[T]], int] = len,
        rows: Callable[[T], Iterable[Hashable]] | None = None,
        abandoned: Callable[[K, R], Awaitable[None]] | None = None,
    ) -> None:
        self._run = run
        self._limit = limit
        self._weigh = weigh
        self._rows = rows
        self._abandoned = abandoned
        self._lines: dict[K, _Line[T, R]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.statements = 0
        """Statements run so far; with `requests`, how well requests are grouped."""
        self.requests = 0

    async def submit(self, key: K, items: list[T]) -> R:
        self.requests += 1
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        rows = (
            frozenset(row for item in items for row in self._rows(item))
            if self._rows else frozenset()
        )
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = _Line()
        line.pending.append(_Request(items, self._weigh(items), rows, future))
        if not line.running:
            line.running = True
            task = asyncio.create_task(self._drain(key, line))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _drain(self, key: K, line: _Line[T, R]) -> None:
        try:
            while line.pending:
                await self._run_group(key, self._take(line))
        finally:
            line.running = False
            for request in line.pending:  # only when this task was cancelled
                request.future.cancel()
            line.pending.clear()
            if self._lines.get(key) is line:
                del self._lines[key]

    def _take(self, line: _Line[T, R]) -> list[_Request[T, R]]:
        group: list[_Request[T, R]] = []
        weight = 0
        touched: set[Hashable] = set()
        deferred: list[_Request[T, R]] = []
        while line.pending:
            request = line.pending.popleft()
            if request.future.done():  # its caller stopped waiting: run nothing for it
                continue
            if group and weight + request.weight > self._limit:
                line.pending.appendleft(request)
                break
            if not touched.isdisjoint(request.rows):
                deferred.append(request)
                continue
            group.append(request)
            weight += request.weight
            touched |= request.rows
        line.pending.extendleft(reversed(deferred))
        return group

    async def _run_group(self, key: K, group: list[_Request[T, R]]) -> None:
        if not group:
            return
        try:
            self.statements += 1
            results = await self._run(key, [request.items for request in group])
        except asyncio.CancelledError:  # shutting down
            for request in group:
                request.future.cancel()
            raise
        except DatabaseUnavailable as exc:
            for request in group:
                _fail(request, exc)
            return
        except Exception as exc:
            if len(group) == 1:
                _fail(group[0], exc)
                return
            for request in group:  # find whose entries the statement refused
                await self._run_group(key, [request])
            return
        for request, result in zip(group, results, strict=True):
            if not request.future.done():
                request.future.set_result(result)
            elif self._abandoned is not None:
                try:
                    await self._abandoned(key, result)
                except Exception:  # the lease runs out instead: nothing is lost
                    log.warning("could not give back an abandoned claim", exc_info=True)


def _fail(request: _Request[T, R], exc: BaseException) -> None:
    if not request.future.done():
        request.future.set_exception(exc)
