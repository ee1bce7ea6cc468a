"""The fairness round of fair queues (docs/fair-queues.md).

A fair queue's claims and acknowledgements keep running counts of each
tenant's messages in flight and its processing time, and a claim marks a
tenant noisy the moment its messages in flight pass the queue's thresholds.
What they cannot see -- leases that lapsed, messages released or
acknowledged through the SQL API, a tenant whose backlog is gone or that
stopped sending five minutes ago, shares that fell -- this round settles,
once a second, for every fair queue at once: the messages in flight counted
again, the tenants it may change (those with messages in flight, the noisy,
those above the processing-time share, those with nothing stored) judged
afresh, and each one's bound (when it may next have a message
claimable) set from its messages as a claim sets it. Every thirty rounds it
also adopts the messages stored without a tenant, and puts right the tenants
whose row or bound a writer did not keep. It runs in the process holding the
maintenance lock; a round run twice is harmless.
"""

from __future__ import annotations

import logging

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
message of the fair queues), and for tenants whose row or bound a writer
failed to keep (one probe per tenant)."""


async def judge_tenants(db: Connector) -> FairnessRoundRow:
    """One round: every fair queue's tenants counted and judged."""
    async with db.transaction() as session:
        await session.execute(Q.without_jit)
        (row,) = await session.fetch(Q.fairness_round)
    return row


async def adopt_strays(db: Connector) -> int:
    """Messages of fair queues without a tenant given the tenant ''; how many."""
    (row,) = await db.fetch(Q.adopt_strays)
    count = int(row["swept"])
    if count:
        _log.info("gave %d messages of fair queues the tenant ''", count)
    return count


async def restore_tenant_rows(db: Connector) -> int:
    """Tenants with messages whose row was missing or whose bound was late, put
    right; how many (none but after a writer that did not keep the bounds)."""
    (row,) = await db.fetch(Q.restore_tenant_rows)
    count = int(row["swept"])
    if count:
        _log.warning("restored the rows or bounds of %d tenants of fair queues", count)
    return count


class FairnessRounds:
    """The rounds of this process, while it holds the maintenance lock."""

    def __init__(self, db: Connector) -> None:
        self._db = db
        self._rounds = 0

    async def step(self) -> None:
        if self._rounds % ADOPT_EVERY == 0:
            await adopt_strays(self._db)
            await restore_tenant_rows(self._db)
        self._rounds += 1
        await judge_tenants(self._db)

    async def forever(self, only_while: FleetLock | None = None) -> None:
        await every(ROUND_SECONDS, self.step, what="fairness round", only_while=only_while)
