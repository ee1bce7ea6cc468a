"""The background task that deletes messages past their queue's retention, and
FIFO queues' deduplication ids and receive attempts past their five minutes and
the groups' heads no claim reads.

Claims and sends already ignore such rows; this only reclaims their space.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime

from app.db.connector import Connector
from app.db.fleet import FleetLock
from app.db.queries import Query
from app.queue.periodic import every
from app.queue.sql import Q

_log = logging.getLogger(__name__)


async def _in_batches(db: Connector, query: Query[None], batch: int) -> int:
    """`query` (a DELETE of up to :limit rows) run until a run deletes fewer
    than `batch`; how many in all."""
    total = 0
    while True:
        async with db.session() as session:
            count = await session.execute(query, {"limit": batch})
        total += count
        if count < batch:
            return total


async def sweep_expired(db: Connector, batch: int = 1000) -> int:
    """Delete messages past their queue's retention, `batch` a statement; how many."""
    return await _in_batches(db, Q.sweep_expired, batch)


HEADS_EVERY = 60.0
"""Seconds between two sweeps of FIFO groups' heads (a scan of their table)."""
BACKSTOP_EVERY = 600.0
"""Seconds between two sweeps of the deduplication ids and receive attempts
from the start of their expiries."""


class DeduplicationSweep:
    """Forgets FIFO queues' deduplication ids and receive attempts past their
    five minutes, and the groups' heads no claim reads.

    Each round reads the expiries from where the last one stopped. Everything
    below was deleted by an earlier round, and while a transaction holds the
    cleanup horizon the index keeps those entries: read from the start, every
    round would walk the whole history the horizon keeps (about a row a FIFO
    message). A row lands below only if the transaction that wrote it stayed
    open past its expiry (the SQL API's send in a caller's transaction of
    more than five minutes): a send or a replay ignores an expired row
    anyway, and the round from the start every BACKSTOP_EVERY seconds deletes
    it.
    """

    def __init__(self, db: Connector, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._db = db
        self._clock = clock
        self._from: dict[str, datetime | None] = {"deduplication": None, "attempts": None}
        self._backstop_at = clock() + BACKSTOP_EVERY
        self._heads_at = clock()

    async def once(self, batch: int = 1000) -> int:
        """One round: as many statements as it takes; how many rows forgotten
        (the larger of the two tables' counts)."""
        now = self._clock()
        if now >= self._backstop_at:
            self._from = dict.fromkeys(self._from)
            self._backstop_at = now + BACKSTOP_EVERY
        total = 0
        while True:
            (row,) = await self._db.fetch(Q.sweep_deduplication, {
                "limit": batch, "deduplication_from": self._from["deduplication"],
                "attempts_from": self._from["attempts"]})
            for table in self._from:
                reached = row[f"{table}_to"]  # type: ignore[literal-required]
                if reached is not None:
                    self._from[table] = max(reached, self._from[table] or reached)
            count = int(row["swept"])
            total += count
            if count < batch:
                break
        if now >= self._heads_at:
            self._heads_at = now + HEADS_EVERY
            await self.sweep_heads(batch)
        return total

    async def sweep_heads(self, batch: int = 1000) -> int:
        return await _in_batches(self._db, Q.sweep_group_heads, batch)


async def sweep_once(db: Connector, deduplication: DeduplicationSweep) -> int:
    count = await sweep_expired(db)
    if count:
        _log.info("deleted %d messages past retention", count)
    await deduplication.once()
    return count


async def sweep_forever(
    db: Connector,
    interval: float,
    swept: asyncio.Event | None = None,
    only_while: FleetLock | None = None,
) -> None:
    """Sweep every `interval` seconds (while this process holds `only_while`);
    `swept` is set after each round (for tests)."""
    deduplication = DeduplicationSweep(db)
    await every(
        interval, lambda: sweep_once(db, deduplication), what="retention sweep", rounds=swept,
        only_while=only_while,
    )
