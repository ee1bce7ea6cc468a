"""The fairness round of fair queues (docs/fair-queues.md).

A fair queue's claims find its tenants through their turns (leaseq.turns) and
write nothing per tenant; the processes sum the processing time their
acknowledgements held and write it once a second (app/queue/tally.py). Who is
noisy is judged here, once a second, for every fair queue at once: each
tenant's messages in flight counted from the messages, the tenants it may
change (those with messages in flight, the noisy, those above the
processing-time share) judged afresh -- a tenant turns noisy within a second
of passing the thresholds, and quiet again within a second of its backlog
being gone or five minutes after it stopped sending -- and the tenants with
nothing left to judge forgotten. Every thirty rounds it also adopts the
messages stored without a tenant, and gives a turn to the tenants a writer
left without one. It runs in the process holding the maintenance lock; a
round run twice is harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime

from app.db.connector import Connector
from app.db.fleet import FleetLock
from app.queue.periodic import every
from app.queue.rows import FairnessRoundRow
from app.queue.sql import Q

_log = logging.getLogger(__name__)

ROUND_SECONDS = 1.0
"""How often tenants are judged afresh: how long a tenant stays noisy after
its backlog is gone, at most."""

ADOPT_EVERY = 30
"""Rounds between two looks for messages of a fair queue sent without a tenant
by a process that had not yet heard the queue became fair (each reads every
message of the fair queues), and for tenants a writer left without a turn
(one probe per tenant)."""


async def judge_tenants(
    db: Connector, floors: Mapping[int, datetime] | None = None,
) -> FairnessRoundRow:
    """One round: every fair queue's tenants counted and judged. `floors`: the
    floor of a fair queue's turns that this process's claims hold, by queue:
    no message claimable now lies below it, so the round's looks into each
    tenant's messages start there (under a held horizon, below it lie only the
    versions of what was settled)."""
    floors = floors or {}
    async with db.transaction() as session:
        await session.execute(Q.without_jit)
        (row,) = await session.fetch(Q.fairness_round, {
            "floor_queues": list(floors), "floors": list(floors.values()),
        })
    return row


async def adopt_strays(db: Connector) -> int:
    """Messages of fair queues without a tenant given the tenant ''; how many."""
    (row,) = await db.fetch(Q.adopt_strays)
    count = int(row["swept"])
    if count:
        _log.info("gave %d messages of fair queues the tenant ''", count)
    return count


async def restore_turns(db: Connector) -> int:
    """Tenants with messages but no turn at or below the earliest, given one;
    how many (none but after a writer that did not insert its turn)."""
    (row,) = await db.fetch(Q.restore_turns)
    count = int(row["swept"])
    if count:
        _log.warning("restored the turns of %d tenants of fair queues", count)
    return count


class FairnessRounds:
    """The rounds of this process, while it holds the maintenance lock."""

    def __init__(
        self, db: Connector, floors: Callable[[], Mapping[int, datetime]] = dict,
    ) -> None:
        self._db = db
        self._floors = floors
        self._rounds = 0

    async def step(self) -> None:
        if self._rounds % ADOPT_EVERY == 0:
            await adopt_strays(self._db)
            await restore_turns(self._db)
        self._rounds += 1
        await judge_tenants(self._db, self._floors())

    async def forever(self, only_while: FleetLock | None = None) -> None:
        await every(ROUND_SECONDS, self.step, what="fairness round", only_while=only_while)
