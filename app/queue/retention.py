"""The background task that deletes messages past their queue's retention, and
FIFO queues' deduplication ids and receive attempts past their five minutes.

Claims and sends already ignore such rows; this only reclaims their space.
"""

from __future__ import annotations

import asyncio
import logging

from app.db.connector import Connector
from app.db.fleet import FleetLock
from app.queue.periodic import every
from app.queue.sql import Q

_log = logging.getLogger(__name__)


async def sweep_expired(db: Connector, batch: int = 1000) -> int:
    """Delete messages past their queue's retention, `batch` a statement; how many."""
    total = 0
    while True:
        async with db.session() as session:
            count = await session.execute(Q.sweep_expired, {"limit": batch})
        total += count
        if count < batch:
            return total


async def sweep_deduplication(db: Connector, batch: int = 1000) -> int:
    """Forget deduplication ids and receive attempts past their window; how many."""
    total = 0
    while True:
        (row,) = await db.fetch(Q.sweep_deduplication, {"limit": batch})
        count = int(row["swept"])
        total += count
        if count < batch:
            return total


async def sweep_once(db: Connector) -> int:
    count = await sweep_expired(db)
    if count:
        _log.info("deleted %d messages past retention", count)
    await sweep_deduplication(db)
    return count


async def sweep_forever(
    db: Connector,
    interval: float,
    swept: asyncio.Event | None = None,
    only_while: FleetLock | None = None,
) -> None:
    """Sweep every `interval` seconds (while this process holds `only_while`);
    `swept` is set after each round (for tests)."""
    await every(
        interval, lambda: sweep_once(db), what="retention sweep", rounds=swept,
        only_while=only_while,
    )
