"""The message cycle's statements, grouped across concurrent requests.

Sends, short-poll claims, acknowledgements and visibility changes of one
queue each go through a Coalescer (app/queue/coalesce.py): requests that
arrive while one statement of their kind runs share the next one. These are
the statements of queries.sql that already take arrays; a group just passes
longer ones, and every request gets back the part that is its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy.ext.asyncio import AsyncConnection

from app.queue.coalesce import Coalescer
from app.queue.models import Queue, ReceivedMessage, SentMessage
from app.queue.sql import Q, fetch
from app.queue.waiting import payload

GROUP_ITEMS = 500
"""Most claims, acknowledgements or visibility changes one statement carries."""

GROUP_SEND_BYTES = 4 * 1024 * 1024
"""Most body and attribute bytes one INSERT carries (a larger send runs alone)."""


class Outgoing(NamedTuple):
    """A validated message as the INSERT takes it."""

    body: str
    attributes: str
    attribute_types: str | None
    sender_id: str | None
    delay: int
    not_before: datetime | None


class Handle(NamedTuple):
    """A decoded receipt: the message's row and the claim it must still hold."""

    row: int
    token: Any


class Change(NamedTuple):
    row: int
    token: Any
    timeout: int


Transaction = Callable[[], AbstractAsyncContextManager[AsyncConnection]]
ClaimRows = Callable[[AsyncConnection, Queue, int, int], Awaitable[list[ReceivedMessage]]]


def _send_weight(items: list[Outgoing]) -> int:
    return sum(len(m.body) + len(m.attributes) + 64 for m in items)


class GroupCommit:
    def __init__(
        self,
        transaction: Transaction,
        claim_rows: ClaimRows,
        notify_here: Callable[[str], None],
        give_back: Callable[[Queue, list[ReceivedMessage]], Awaitable[None]],
        *,
        change_connections: int,
    ) -> None:
        self._transaction = transaction
        # Heartbeats are the one kind of write whose volume grows with the work
        # in flight rather than with the traffic: a burst of them across many
        # queues must not take the connections that claims and acknowledgements
        # need. Visibility changes hold at most this many at once (grouping
        # keeps them to one per queue already); beats wait their turn instead.
        self._change_budget = asyncio.Semaphore(change_connections)
        self.changes_in_flight = 0
        self.changes_in_flight_peak = 0
        self._claim_rows = claim_rows
        self._notify_here = notify_here
        self._give_back = give_back
        self.sends: Coalescer[tuple[int, int], Outgoing, list[SentMessage]] = Coalescer(
            self._send, limit=GROUP_SEND_BYTES, weigh=_send_weight
        )
        self.claims: Coalescer[tuple[Queue, int], int, list[ReceivedMessage]] = Coalescer(
            self._claim, limit=GROUP_ITEMS, weigh=sum, abandoned=self._abandoned
        )
        self.deletes: Coalescer[int, Handle, set[int]] = Coalescer(
            self._delete, limit=GROUP_ITEMS, row=lambda h: h.row
        )
        self.changes: Coalescer[int, Change, dict[int, Any]] = Coalescer(
            self._change, limit=GROUP_ITEMS, row=lambda c: c.row
        )

    def coalescers(self) -> dict[str, Coalescer[Any, Any, Any]]:
        return {"send": self.sends, "claim": self.claims, "delete": self.deletes,
                "change_visibility": self.changes}

    # -- entry points ---------------------------------------------------------

    async def send(self, queue: Queue, messages: list[Outgoing]) -> list[SentMessage]:
        """Durable on return: the INSERT carrying them has committed."""
        return await self.sends.submit((queue.id, queue.attributes.message_retention), messages)

    async def claim(self, queue: Queue, lease: int, max_messages: int) -> list[ReceivedMessage]:
        return await self.claims.submit((queue, lease), [max_messages])

    async def delete(self, queue_id: int, handles: list[Handle]) -> set[int]:
        """The rows deleted, of those asked for."""
        return await self.deletes.submit(queue_id, handles)

    async def change(self, queue_id: int, changes: list[Change]) -> dict[int, Any]:
        """Row -> (lease_expires_at, timeout) for the rows whose claim held."""
        return await self.changes.submit(queue_id, changes)

    # -- the grouped statements ------------------------------------------------

    async def _send(
        self, key: tuple[int, int], groups: list[list[Outgoing]]
    ) -> list[list[SentMessage]]:
        queue_id, retention = key
        flat = [m for group in groups for m in group]
        async with self._transaction() as conn:
            rows = await fetch(
                conn, "send_messages",
                {
                    "queue_id": queue_id,
                    "retention": retention,
                    "bodies": [m.body for m in flat],
                    "attributes": [m.attributes for m in flat],
                    "attribute_types": [m.attribute_types for m in flat],
                    "sender_ids": [m.sender_id for m in flat],
                    "delays": [m.delay for m in flat],
                    "not_befores": [m.not_before for m in flat],
                },
            )
        dues = [float(row.due_in) for row in rows]
        self._notify_here(
            payload(
                queue_id,
                ready=sum(1 for due in dues if due <= 0),
                due_in=min((due for due in dues if due > 0), default=None),
            )
        )
        sent = [SentMessage(message_id=str(row.message_id), sent_at=row.sent_at) for row in rows]
        return list(_split(sent, groups))

    async def _claim(
        self, key: tuple[Queue, int], groups: list[list[int]]
    ) -> list[list[ReceivedMessage]]:
        queue, lease = key
        wanted = [sum(group) for group in groups]
        async with self._transaction() as conn:
            received = await self._claim_rows(conn, queue, sum(wanted), lease)
        # First come, first served, in the claim's (fencing token) order.
        shares: list[list[ReceivedMessage]] = []
        for count in wanted:
            shares.append(received[:count])
            received = received[count:]
        return shares

    async def _abandoned(self, key: tuple[Queue, int], claimed: list[ReceivedMessage]) -> None:
        if claimed:
            await self._give_back(key[0], claimed)

    async def _delete(self, queue_id: int, groups: list[list[Handle]]) -> list[set[int]]:
        flat = [h for group in groups for h in group]
        async with self._transaction() as conn:
            rows = await fetch(
                conn, "delete_messages",
                {
                    "queue_id": queue_id,
                    "ids": [h.row for h in flat],
                    "tokens": [h.token for h in flat],
                },
            )
        deleted = {row.id for row in rows}
        return [deleted.intersection(h.row for h in group) for group in groups]

    async def _change(self, queue_id: int, groups: list[list[Change]]) -> list[dict[int, Any]]:
        async with self._change_budget:
            self.changes_in_flight += 1
            self.changes_in_flight_peak = max(self.changes_in_flight_peak, self.changes_in_flight)
            try:
                return await self._change_now(queue_id, groups)
            finally:
                self.changes_in_flight -= 1

    async def _change_now(
        self, queue_id: int, groups: list[list[Change]]
    ) -> list[dict[int, Any]]:
        flat = [c for group in groups for c in group]
        async with self._transaction() as conn:
            rows = await fetch(
                conn, "change_visibility",
                {
                    "queue_id": queue_id,
                    "ids": [c.row for c in flat],
                    "tokens": [c.token for c in flat],
                    "timeouts": [c.timeout for c in flat],
                },
            )
            # Releases wake receivers now; a lease shortened (rare) sets their timer.
            ready = sum(1 for row in rows if row.timeout == 0)
            due_in = min(
                (row.timeout for row in rows if row.sooner and row.timeout > 0), default=None
            )
            notice = None
            if ready or due_in is not None:
                notice = payload(queue_id, ready=ready, due_in=due_in)
                # Autocommit: delivered after the UPDATE above has committed.
                await conn.execute(Q.notify_queue, {"notice": notice})
        if notice is not None:
            self._notify_here(notice)
        changed = {row.id: row for row in rows}
        return [
            {c.row: changed[c.row] for c in group if c.row in changed} for group in groups
        ]


def _split(values: list[Any], groups: list[list[Any]]) -> Iterator[list[Any]]:
    start = 0
    for group in groups:
        yield values[start:start + len(group)]
        start += len(group)
