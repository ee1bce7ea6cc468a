"""Where a standard queue's claims start reading: a floor under each of its two
ranges of claimable messages, kept by each process for each queue.

Why. A claim reads the index messages_by_state oldest deadline first. Every
message it ever took or deleted left index entries behind, pointing at row
versions no claim can take; VACUUM removes them, but not while any transaction
older than them is open (a pg_dump, a report, a forgotten psql: the cleanup
horizon). Read from the start of the queue, a claim then walks the queue's
whole history, and the cycle slows down as long as the horizon is held
(docs/performance.md, "History costs nothing"). Read from a floor below which
nothing is claimable any more, it walks only what was settled since the last
claim.

The rule. Each claim reports, for each range (waiting, and leases run out),
the oldest claimable deadline its snapshot sees at or above the floor it was
given, or its own time when it sees none (queries.sql, fragment
floored_candidates), with its snapshot's bounds: xmin, the oldest transaction
still running, and xmax, the first not yet begun. What that snapshot cannot see
is written by a transaction running at it or begun after it. Every deadline
such a write can set that a claim reaches from below is measured from the
moment of the write, read only once the writing transaction holds its ID
(queries.sql, fragment written; the SQL API's functions alike). So once a
later claim's snapshot shows every transaction of an earlier claim's snapshot
ended (the later's xmin at or past the earlier's xmax), nothing can appear
below the earlier claim's time any more: the later claim's report, taken no
higher than that time, is a floor. A floor only rises; a claim that read from
a lower floor than the one now held teaches nothing new.

The guard. A deadline is still read from the wall clock, which a step of the
system's time can move back. Every LOOK_BACK_EVERY seconds, a queue's floors
go back LOOK_BACK from the newest claim's time (one walk of that much history,
however long the horizon is held), so a message that slipped below a floor
waits that long at worst, and is never lost.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from app.queue.rows import FloorColumns

MARGIN = timedelta(milliseconds=5)
"""Kept below a safe time: the clock read after the ID is handed out is read
at the same moment in no two processes, to the microsecond."""

LOOK_BACK = timedelta(seconds=30)
LOOK_BACK_EVERY = 30.0
MARKS = 64
"""Recent claims remembered (snapshot xmax, time): a later claim needs one whose
transactions have all ended, which is nearly always one of the last few."""


class Floors:
    """A queue's floors in this process (None: from the start)."""

    __slots__ = ("_clock", "_look_back_at", "_marks", "lease", "ready")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.ready: datetime | None = None
        self.lease: datetime | None = None
        self._marks: deque[tuple[int, datetime]] = deque(maxlen=MARKS)
        self._clock = clock
        self._look_back_at = clock() + LOOK_BACK_EVERY

    def params(self) -> dict[str, Any]:
        """The claim's (and the outlook's) parameters."""
        return {"ready_floor": self.ready, "lease_floor": self.lease}

    def learn(self, row: FloorColumns) -> None:
        """What a claim that started from these floors reported."""
        settled = [at for xmax, at in self._marks if xmax <= row["snapshot_xmin"]]
        self._marks.append((row["snapshot_xmax"], row["looked_at"]))
        if settled:
            bound = max(settled) - MARGIN
            self.ready = _raised(self.ready, row["ready_from"], min(row["ready_floor"], bound))
            self.lease = _raised(self.lease, row["lease_from"], min(row["lease_floor"], bound))
        if self._clock() >= self._look_back_at:
            self._look_back_at = self._clock() + LOOK_BACK_EVERY
            back = row["looked_at"] - LOOK_BACK
            self.ready = None if self.ready is None else min(self.ready, back)
            self.lease = None if self.lease is None else min(self.lease, back)


def _raised(held: datetime | None, read_from: datetime | None, seen: datetime) -> datetime | None:
    """The floor after a claim that read from `read_from` (None: the start) and
    saw nothing claimable below `seen`. One that read from above the floor held
    (lowered since it began) says nothing of what lies between."""
    if read_from is not None and (held is None or read_from > held):
        return held
    return seen if held is None else max(held, seen)
