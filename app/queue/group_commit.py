"""Group commit: the engine's array statements, shared by concurrent requests.

Sends, short-poll claims, acknowledgements and visibility changes of one
queue each go through a Coalescer (coalesce.py): requests that arrive while
one statement of their kind runs share the next one. The engine describes
each such statement as a Grouped -- the named query, how a group's items
become its array parameters, how its rows are shared back out -- and hands it
to GroupCommit.run with the request's items. GroupCommit runs it on a session
of the connector and returns each request its share; it knows nothing of
messages, receipts, queues or waiting receivers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from app.db.connector import Connector, Session
from app.db.queries import Query
from app.queue.coalesce import Coalescer

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
R = TypeVar("R")

Statement = tuple[Query[Any], Mapping[str, Any]]


@dataclass(frozen=True, eq=False)
class Grouped(Generic[K, T, R]):
    """A statement that takes arrays, and how requests share it."""

    name: str
    query: Query[Any]
    params: Callable[[K, list[T]], Mapping[str, Any]]
    """The statement's parameters for the items of every request of a group."""
    share: Callable[[list[Any], list[list[T]]], list[R]]
    """The rows, shared out: one result per request, in the group's order."""
    limit: int
    """Most total weight a group carries; a heavier request still runs, alone."""
    weigh: Callable[[list[T]], int] = len
    rows: Callable[[T], Iterable[Hashable]] | None = None
    """The message rows an item writes: one statement never writes a row twice."""
    then: Callable[[K, list[Any]], Statement | None] | None = None
    """A statement to run after it on the same connection (a NOTIFY): with each
    statement its own transaction, it is delivered after the write committed."""
    seen: Callable[[K, list[T], list[Any]], None] | None = None
    """What the engine keeps of the rows beyond the requests' shares (a standard
    queue's claim: where the next one starts reading, app/queue/floors.py)."""
    undo: Callable[[K, R], Statement | None] | None = None
    """The statement that gives back a share whose requester stopped waiting
    (None: nothing to give back)."""
    budgeted: bool = False
    """Runs within GroupCommit's connection budget."""
    variant: Callable[[K, list[T]], Query[Any]] | None = None
    """The statement for these items when a cheaper one of the kind serves them
    (its rows shared out the same way, on the same kind of connection)."""

    def query_for(self, key: K, flat: list[T]) -> Query[Any]:
        if self.variant is None:
            return self.query
        chosen = self.variant(key, flat)
        assert chosen.cached_plan == self.query.cached_plan, chosen.name
        return chosen


class GroupCommit:
    """Runs the grouped statements it is given, each in lines per key."""

    def __init__(
        self, db: Connector, statements: list[Grouped[Any, Any, Any]], *, budget: int
    ) -> None:
        self._db = db
        # Heartbeats are the one kind of write whose volume grows with the work
        # in flight rather than with the traffic: a burst of them across many
        # queues must not take the connections that claims and acknowledgements
        # need. Budgeted statements hold at most this many connections at once
        # (grouping keeps them to one per queue already); the rest wait.
        self._budget = asyncio.Semaphore(budget)
        self.budgeted_in_flight = 0
        self.budgeted_in_flight_peak = 0
        self._lines: dict[str, Coalescer[Any, Any, Any]] = {
            grouped.name: self._line(grouped) for grouped in statements
        }

    def coalescers(self) -> dict[str, Coalescer[Any, Any, Any]]:
        """Each grouped statement's coalescer by name, for the request/statement counts."""
        return dict(self._lines)

    def line(self, name: str) -> Coalescer[Any, Any, Any]:
        return self._lines[name]

    async def run(self, grouped: Grouped[K, T, R], key: K, items: list[T]) -> R:
        """This request's share of the next statement of its kind for `key`."""
        result: R = await self._lines[grouped.name].submit(key, items)
        return result

    def _line(self, grouped: Grouped[K, T, R]) -> Coalescer[K, T, R]:
        async def run(key: K, groups: list[list[T]]) -> list[R]:
            if not grouped.budgeted:
                return await self._statement(grouped, key, groups)
            async with self._budget:
                self.budgeted_in_flight += 1
                self.budgeted_in_flight_peak = max(
                    self.budgeted_in_flight_peak, self.budgeted_in_flight
                )
                try:
                    return await self._statement(grouped, key, groups)
                finally:
                    self.budgeted_in_flight -= 1

        abandoned = None
        if grouped.undo is not None:
            undo = grouped.undo

            async def abandoned(key: K, result: R) -> None:
                statement = undo(key, result)
                if statement is not None:
                    await self._db.fetch(*statement)

        return Coalescer(
            run, limit=grouped.limit, weigh=grouped.weigh, rows=grouped.rows, abandoned=abandoned
        )

    async def _statement(
        self, grouped: Grouped[K, T, R], key: K, groups: list[list[T]]
    ) -> list[R]:
        async with self._db.session(cached_plans=grouped.query.cached_plan) as session:
            return await run_in(session, grouped, key, groups)


async def run_in(
    session: Session, grouped: Grouped[K, T, R], key: K, groups: list[list[T]]
) -> list[R]:
    """The statement (and its follow-up) for `groups` in `session`: what a group runs."""
    flat = [item for group in groups for item in group]
    rows = await session.fetch(grouped.query_for(key, flat), grouped.params(key, flat))
    if grouped.seen is not None:
        grouped.seen(key, flat, rows)
    after = None if grouped.then is None else grouped.then(key, rows)
    if after is not None:
        await session.fetch(*after)
    return grouped.share(rows, groups)
