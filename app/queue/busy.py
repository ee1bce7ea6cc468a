"""Fair queues' processing time, summed by each process and written once a
second (docs/fair-queues.md).

Why. A tenant whose messages take long to process may hold a share of the
queue's processing time, and the fairness round judges it noisy by that share.
Written by every acknowledgement, a tenant's row took a new version per
acknowledgement; while a transaction holds the cleanup horizon, every later
write and read of the row by its key visits all of them (docs/decisions.md,
"History costs nothing, step three"). Summed here and written once a second,
the row takes versions at the pace of seconds, whatever the message rate.

What is lost: the time of the last second of a process killed outright. The
share is a judgement over minutes (its e-fold time is one minute), and a lost
second moves it by a second's worth at most.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from app.db.connector import Connector, ConstraintViolation
from app.queue.periodic import every
from app.queue.sql import Q

_log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0


class Busy:
    """The processing time this process's acknowledgements held, per (queue,
    tenant), since the last flush."""

    def __init__(self) -> None:
        self._held: dict[tuple[int, str], float] = {}

    def add(self, queue_id: int, held: Iterable[tuple[str | None, float | None]]) -> None:
        """Each acknowledged message's tenant and lease held time (a message
        that named no tenant, or a claim made before claims were timed, adds
        nothing)."""
        for tenant, seconds in held:
            if tenant is not None and seconds is not None and seconds > 0:
                key = (queue_id, tenant)
                self._held[key] = self._held.get(key, 0.0) + seconds

    def pending(self) -> dict[tuple[int, str], float]:
        """What the next flush writes (for tests)."""
        return dict(self._held)

    async def flush(self, db: Connector) -> int:
        """Writes what was summed; how many tenants. A failed write keeps it for
        the next flush; a queue deleted meanwhile takes its share with it."""
        if not self._held:
            return 0
        taken, self._held = self._held, {}
        keys = sorted(taken)
        try:
            await db.fetch(Q.add_busy, {
                "queue_ids": [queue_id for queue_id, _ in keys],
                "tenants": [tenant for _, tenant in keys],
                "busy": [taken[key] for key in keys],
            })
        except ConstraintViolation:
            _log.info("processing time of %d tenants dropped: their queue is gone", len(keys))
        except BaseException:
            for key, seconds in taken.items():
                self._held[key] = self._held.get(key, 0.0) + seconds
            raise
        return len(keys)

    async def forever(self, db: Connector, seconds: float = FLUSH_SECONDS) -> None:
        await every(seconds, lambda: self.flush(db), what="processing time flush")
