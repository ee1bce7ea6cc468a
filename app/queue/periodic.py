"""Background rounds: one step every few seconds, for as long as the service runs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from app.db.fleet import FleetLock
from app.errors import DatabaseUnavailable

_log = logging.getLogger(__name__)


async def every(
    seconds: float,
    step: Callable[[], Awaitable[object]],
    *,
    what: str,
    rounds: asyncio.Event | None = None,
    only_while: FleetLock | None = None,
) -> None:
    """Runs `step` every `seconds` until cancelled. A failed round is logged and
    the next one runs as usual; `rounds` is set after each (for tests). With
    `only_while`, rounds run only while this process holds that lock: the first
    as soon as it is taken (a round under way when it is lost still ends)."""
    while True:
        if only_while is not None:
            await only_while.wait_held()
        try:
            await step()
        except DatabaseUnavailable:
            _log.warning("%s skipped: database unavailable", what)
        except Exception:
            _log.exception("%s failed", what)
        if rounds is not None:
            rounds.set()
        await asyncio.sleep(seconds)
