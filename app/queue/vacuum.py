"""Vacuuming the messages table when autovacuum does not.

A queue table turns over: every message is inserted, updated on every
receive and heartbeat (never a HOT update: each moves the indexed deadline),
and deleted. With autovacuum off -- some CI and hand-tuned servers run that
way -- nothing reclaims the dead tuples: measured on such a server, the table
grew by 0.2 MB a second at 500 messages/s, without end, and every claim
scanned the dead index entries. So the service looks every few seconds (in
one process of a deployment: app/queue/maintenance.py); when autovacuum is off
for the table and enough tuples are dead, it runs VACUUM itself. With
autovacuum on, this costs one small query a round.
"""

from __future__ import annotations

import logging

from app.db.connector import Connector
from app.db.fleet import FleetLock
from app.queue.periodic import every
from app.queue.sql import Q

_log = logging.getLogger(__name__)

DEAD_TUPLES = 2000
"""Vacuum once this many tuples (plus 1 % of the live ones) are dead: the
thresholds migration 0004 gives autovacuum."""


async def vacuum_if_needed(db: Connector) -> bool:
    """One round; True when this process vacuumed the table."""
    async with db.session() as session:
        (state,) = await session.fetch(Q.messages_vacuum_state)
        if state["autovacuum"] or state["dead"] < DEAD_TUPLES + state["live"] // 100:
            return False
        await session.execute(Q.vacuum_messages)
    _log.info("vacuumed the messages table (%d dead tuples; autovacuum is off)", state["dead"])
    return True


async def vacuum_forever(
    db: Connector, interval: float, only_while: FleetLock | None = None
) -> None:
    """A round every `interval` seconds (while this process holds `only_while`)."""
    await every(
        interval, lambda: vacuum_if_needed(db), what="vacuum check", only_while=only_while
    )
