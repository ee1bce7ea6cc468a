"""The background task that deletes messages past their queue's retention, and
FIFO queues' deduplication ids and receive attempts past their five minutes.

Claims and sends already ignore such rows; this only reclaims their space.
"""

from __future__ import annotations

import asyncio
import logging

from app.db.fleet import FleetLock
from app.queue.periodic import every
from app.queue.service import QueueService

_log = logging.getLogger(__name__)


async def sweep_once(service: QueueService) -> int:
    count = await service.sweep_expired()
    if count:
        _log.info("deleted %d messages past retention", count)
    await service.sweep_deduplication()
    return count


async def sweep_forever(
    service: QueueService,
    interval: float,
    swept: asyncio.Event | None = None,
    only_while: FleetLock | None = None,
) -> None:
    """Sweep every `interval` seconds (while this process holds `only_while`);
    `swept` is set after each round (for tests)."""
    await every(
        interval, lambda: sweep_once(service), what="retention sweep", rounds=swept,
        only_while=only_while,
    )
