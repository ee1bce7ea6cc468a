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

FIFO queues' message_groups is the other way round: a few rows (one per
group holding messages), each rewritten by every send, claim and
acknowledgement of its group, its claim hint indexed. Autovacuum visits a
table at most once a naptime (a minute by default); in that minute a FIFO
queue at 4,000 messages a second leaves hundreds of thousands of dead row
versions behind a hundred live ones, and every claim's and acknowledgement's
index scans walk them. So the service vacuums it whenever its dead versions
outnumber the live ones by GROUP_DEAD_TUPLES, autovacuum on or off: a second's
worth at most, a few milliseconds of VACUUM on a table this small.
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


GROUP_DEAD_TUPLES = 1000
"""Vacuum message_groups once this many more of its row versions are dead than
live (docs/performance.md, "FIFO: message_groups vacuumed by the service")."""


async def vacuum_groups_if_needed(db: Connector) -> bool:
    """One round for message_groups; True when this process vacuumed it."""
    async with db.session() as session:
        (state,) = await session.fetch(Q.groups_vacuum_state)
        if state["dead"] < GROUP_DEAD_TUPLES + state["live"]:
            return False
        await session.execute(Q.vacuum_message_groups)
    _log.debug("vacuumed message_groups (%d dead row versions)", state["dead"])
    return True


async def vacuum_forever(
    db: Connector, interval: float, only_while: FleetLock | None = None
) -> None:
    """A round every `interval` seconds (while this process holds `only_while`)."""
    await every(
        interval, lambda: vacuum_if_needed(db), what="vacuum check", only_while=only_while
    )


async def vacuum_groups_forever(
    db: Connector, interval: float, only_while: FleetLock | None = None
) -> None:
    """vacuum_groups_if_needed every `interval` seconds (while this process holds
    `only_while`)."""
    await every(
        interval, lambda: vacuum_groups_if_needed(db), what="message_groups vacuum check",
        only_while=only_while,
    )
