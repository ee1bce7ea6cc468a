"""What each process counts of fair queues' tenants between the fairness
rounds (docs/fair-queues.md): the processing time its acknowledgements held,
written once a second, and the messages it handed out, by which it judges a
tenant noisy itself until the round has.

Why. A tenant whose messages take long to process may hold a share of the
queue's processing time, and the fairness round judges it noisy by that share.
Written by every acknowledgement, a tenant's row took a new version per
acknowledgement; while a transaction holds the cleanup horizon, every later
write and read of the row by its key visits all of them (docs/decisions.md,
"History costs nothing, step three"). Summed here and written once a second,
the row takes versions at the pace of seconds, whatever the message rate.

The messages in flight are counted by the round, once a second, and a claim
no longer marks a tenant noisy the moment it passes the thresholds. So that a
burst does not take every claim for up to a second first, each process counts
the messages of each tenant it handed out and took back in the last second or
two, and its claims also treat as noisy a tenant whose count passes the queue's
thresholds against the queue's count in this process (`noisy`): what one
process alone sees of a burst is enough to tell it, and the round, a second
later at most, judges from every process's.

The round's judgement is read here too, once a second, and handed to the
claims with this process's own (`noisy`): a claim that read the noisy tenants'
rows itself visited every version the rows took since the cleanup horizon,
one a second each while a transaction holds it.

What is lost: the processing time of the last second of a process killed
outright. The share is a judgement over minutes (its e-fold time is one
minute), and a lost second moves it by a second's worth at most.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from app.db.connector import Connector, ConstraintViolation
from app.queue.models import Fairness
from app.queue.periodic import every
from app.queue.sql import Q

_log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0

WINDOW_SECONDS = 1.0
"""What this process handed out is counted over the last one to two of these:
about a fairness round, after which the round's judgement stands."""


class Tally:
    """This process's counts, per (queue, tenant)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._held: dict[tuple[int, str], float] = {}
        # Per queue and tenant: what was handed out less what was taken back,
        # in the window before and in this one.
        self._out: dict[int, dict[str, list[int]]] = {}
        # Per queue: the tenants the fairness round last judged noisy, with
        # their messages in flight as it counted them.
        self._judged: dict[int, dict[str, int]] = {}
        self._clock = clock
        self._window_ends = clock() + WINDOW_SECONDS

    # -- processing time ------------------------------------------------------

    def add(self, queue_id: int, held: Iterable[tuple[str | None, float | None]]) -> None:
        """Acknowledged messages' tenants and lease held times: summed (a message
        that named no tenant, or a claim made before claims were timed, adds
        nothing), and each taken off the count of what is out."""
        for tenant, seconds in held:
            if tenant is None:
                continue
            self._count(queue_id, tenant, -1)
            if seconds is not None and seconds > 0:
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

    async def learn_judged(self, db: Connector) -> int:
        """Reads the fairness round's last judgement; how many tenants are noisy."""
        judged: dict[int, dict[str, int]] = {}
        for row in await db.fetch(Q.judged_noisy):
            judged.setdefault(row["queue_id"], {})[row["tenant"]] = row["in_flight"]
        self._judged = judged
        return sum(len(tenants) for tenants in judged.values())

    async def tick(self, db: Connector) -> None:
        """One second's work: the sums written, the round's judgement read (even
        when the write failed: the claims go by it)."""
        try:
            await self.flush(db)
        finally:
            await self.learn_judged(db)

    async def forever(self, db: Connector, seconds: float = FLUSH_SECONDS) -> None:
        await every(seconds, lambda: self.tick(db), what="tenants' tally")

    # -- messages handed out --------------------------------------------------

    def handed_out(self, queue_id: int, tenants: Iterable[str | None]) -> None:
        """Messages a claim of this process gave leases on, by tenant."""
        for tenant in tenants:
            if tenant is not None:
                self._count(queue_id, tenant, 1)

    def noisy(self, queue_id: int, fairness: Fairness) -> dict[str, int]:
        """The queue's noisy tenants with their messages in flight: those the
        round last judged so, and those whose messages out from this process
        in the last window or two pass its in-flight thresholds (the greater
        count where both)."""
        self._roll()
        noisy = dict(self._judged.get(queue_id, {}))
        windows = self._out.get(queue_id)
        if not windows:
            return noisy
        counts = {tenant: max(before + now, 0) for tenant, (before, now) in windows.items()}
        total = sum(counts.values())
        for tenant, count in counts.items():
            if (tenant != "" and count >= fairness.in_flight_min
                    and count > fairness.in_flight_share * total):
                noisy[tenant] = max(count, noisy.get(tenant, 0))
        return noisy

    def _count(self, queue_id: int, tenant: str, change: int) -> None:
        self._roll()
        self._out.setdefault(queue_id, {}).setdefault(tenant, [0, 0])[1] += change

    def _roll(self) -> None:
        now = self._clock()
        if now < self._window_ends:
            return
        # Two windows on (an idle second or more), nothing is left of either.
        gone = now >= self._window_ends + WINDOW_SECONDS
        self._window_ends = now + WINDOW_SECONDS
        for queue_id, windows in list(self._out.items()):
            for tenant, counts in list(windows.items()):
                counts[:] = [0 if gone else counts[1], 0]
                if counts == [0, 0]:
                    del windows[tenant]
            if not windows:
                del self._out[queue_id]
