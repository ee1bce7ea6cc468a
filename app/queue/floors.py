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
the oldest deadline come that its snapshot sees at or above the floor it was
given, or its own time when it sees none (queries.sql, fragment
floored_candidates), with its snapshot's xmin (every transaction ID below it
has ended) and, when it wrote a row, its own transaction ID and the time its
transaction began. That ID was handed out after the claim's transaction began.
A later claim whose xmin is past it sees every transaction that held an ID up
to it ended; whatever that later claim cannot see is written by a transaction
whose ID came after, so later than the earlier claim began. Every deadline a
claim reaches from below is measured from the moment of its write, read only
once the writing transaction holds its ID (queries.sql, fragment written; the
SQL API's functions alike): no such write can set one earlier than the earlier
claim's time. So the later claim's report, taken no higher than that time, is
a floor. A floor only rises; a claim that read from a lower floor than the one
now held teaches nothing new.

Which claims report. Reading the two ranges and the two minimums makes a
claim costlier to plan (it is planned on every execution) by about as much
as the claim itself was. So most claims read the waiting range alone from
its floor and report nothing but their mark (queries.sql,
claim_ready_waiting_messages, claim_waiting_messages); a claim reads both
ranges and reports when REPORT_EVERY has passed since the last report, or
when the claim before it came back short (the waiting range may be empty, and
leases may have run out) or gave leases of 0 seconds (a receive that looks
again at once finds them). While the horizon is held, a claim then walks at
most what was settled in the last REPORT_EVERY or so.

What it does not get past: a transaction that holds an ID (it wrote something,
anywhere in the database) and stays open keeps every later xmin at or below
it, so no report is taken until it ends and the claims walk what is settled
meanwhile. A read-only one (pg_dump, a report, an idle `BEGIN` that only read,
a replication slot, a standby's feedback) does not.

The guards. A deadline is read from the wall clock, which a step of the
database server's time can move back. Every LOOK_BACK_EVERY seconds a queue's
floors go back to LOOK_BACK before the previous look-back (one walk of that
much history, however long the horizon is held); every BACKSTOP_EVERY
seconds they go back to the start. A message that slipped below a floor is
claimed late, never lost.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from app.queue.rows import FloorColumns

MARGIN = timedelta(milliseconds=5)
"""Kept below a settled claim's time: two processes' clock readings are never
exactly one."""

LOOK_BACK = timedelta(seconds=30)
LOOK_BACK_EVERY = 30.0
BACKSTOP_EVERY = 600.0
REPORT_EVERY = 0.02
"""Seconds between two claims of a queue in a process that read both ranges
and report their floors (when the claims in between came back full)."""
MARKS = 64
"""Recent claims remembered (transaction ID, time its transaction began): a
later claim needs one whose ID its xmin has passed, nearly always one of the
last few."""


class Floors:
    """A queue's floors in this process (None: from the start)."""

    __slots__ = (
        "_backstop_at",
        "_clock",
        "_full_next",
        "_look_back_at",
        "_looked_back",
        "_marks",
        "_report_at",
        "lease",
        "ready",
    )

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.ready: datetime | None = None
        self.lease: datetime | None = None
        self._marks: deque[tuple[int, datetime]] = deque(maxlen=MARKS)
        self._clock = clock
        self._look_back_at = clock() + LOOK_BACK_EVERY
        self._backstop_at = clock() + BACKSTOP_EVERY
        self._looked_back: datetime | None = None
        self._report_at = clock()
        self._full_next = True

    def reset(self) -> None:
        """From the start again: something was written below the floors (a
        repair of fair queues' turns, app/queue/fairness.py)."""
        self.ready = self.lease = None

    def report_due(self) -> bool:
        """Whether the next claim reads both ranges and reports (claim_messages,
        claim_ready_messages) rather than the waiting range alone."""
        return self._full_next or self._clock() >= self._report_at

    def params(self) -> dict[str, Any]:
        """The claim's (and the outlook's) parameters."""
        return {"ready_floor": self.ready, "lease_floor": self.lease}

    def learn(self, row: FloorColumns | None, *, full_next: bool) -> None:
        """What a claim that started from these floors reported (None: it
        claimed nothing and reported nothing), and whether the next claim must
        read both ranges: it took fewer messages than were wanted, or the
        leases it gave end at once (a visibility timeout of 0)."""
        self._full_next = full_next
        if row is None:
            return
        xmin = row["snapshot_xmin"]
        settled = [] if xmin is None else [at for xid, at in self._marks if xid < xmin]
        if row["claim_xid"] is not None:
            self._marks.append((row["claim_xid"], row["looked_at"]))
        if xmin is not None:
            self._report_at = self._clock() + REPORT_EVERY
        ready, lease = row["ready_floor"], row["lease_floor"]
        if settled and ready is not None and lease is not None:
            bound = max(settled) - MARGIN
            self.ready = _raised(self.ready, row["ready_from"], min(ready, bound))
            self.lease = _raised(self.lease, row["lease_from"], min(lease, bound))
        now = self._clock()
        if now >= self._backstop_at:
            self._backstop_at = now + BACKSTOP_EVERY
            self._look_back_at = now + LOOK_BACK_EVERY
            self.ready = self.lease = self._looked_back = None
        elif now >= self._look_back_at:
            self._look_back_at = now + LOOK_BACK_EVERY
            back = min(row["looked_at"], self._looked_back or row["looked_at"]) - LOOK_BACK
            self._looked_back = row["looked_at"]
            self.ready = None if self.ready is None else min(self.ready, back)
            self.lease = None if self.lease is None else min(self.lease, back)


def _raised(held: datetime | None, read_from: datetime | None, seen: datetime) -> datetime | None:
    """The floor after a claim that read from `read_from` (None: the start) and
    saw nothing claimable below `seen`. One that read from above the floor held
    (lowered since it began) says nothing of what lies between."""
    if read_from is not None and (held is None or read_from > held):
        return held
    return seen if held is None else max(held, seen)
