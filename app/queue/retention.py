"""The background task that deletes messages past their queue's retention.

Claims already refuse such messages; this only reclaims their space.
"""

from __future__ import annotations

import asyncio
import logging

from app.errors import DatabaseUnavailable
from app.queue.service import QueueService

_log = logging.getLogger(__name__)


async def sweep_forever(
    service: QueueService, interval: float, swept: asyncio.Event | None = None
) -> None:
    """Sweep every `interval` seconds; `swept` is set after each round (for tests)."""
    while True:
        try:
            count = await service.sweep_expired()
            if count:
                _log.info("deleted %d messages past retention", count)
        except DatabaseUnavailable:
            _log.warning("retention sweep skipped: database unavailable")
        except Exception:
            _log.exception("retention sweep failed")
        if swept is not None:
            swept.set()
        await asyncio.sleep(interval)
