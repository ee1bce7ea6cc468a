"""app/queue/floors.py's rules, on the rows a claim reports: a report becomes a
floor only once a later snapshot's xmin has passed an earlier claim's own
transaction ID, and then no higher than that claim's time; a claim that wrote
nothing leaves no mark; a floor only rises; a claim that read from above the
floor held teaches nothing; the look-back and the backstop lower the floors on
time; most claims report nothing but their mark, and one reports when
REPORT_EVERY has passed or the claim before came back short."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from app.queue.floors import (
    BACKSTOP_EVERY,
    LOOK_BACK,
    LOOK_BACK_EVERY,
    MARGIN,
    REPORT_EVERY,
    Floors,
)

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _report(xmin: int, xid: int | None, at: float, ready: float, lease: float,
            read_from: Floors | None = None) -> Any:
    params = read_from.params() if read_from is not None else {}
    return {
        "snapshot_xmin": xmin, "claim_xid": xid, "looked_at": _at(at),
        "ready_floor": _at(ready), "lease_floor": _at(lease),
        "ready_from": params.get("ready_floor"), "lease_from": params.get("lease_floor"),
    }


def _full(floors: Floors, xmin: int, xid: int | None, at: float, ready: float,
          lease: float) -> None:
    """A claim of both ranges, started from `floors`, that came back full."""
    floors.learn(_report(xmin, xid, at, ready, lease, read_from=floors), full_next=False)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _warm(floors: Floors, at: float = 10) -> None:
    """Two claims, the second past the first's ID: the floors set at `at`."""
    _full(floors, xmin=1, xid=2, at=at, ready=at, lease=at)
    _full(floors, xmin=3, xid=4, at=at + 1, ready=at + 1, lease=at + 1)
    assert floors.ready == _at(at) - MARGIN


def test_a_report_waits_until_an_earlier_claims_own_id_has_ended() -> None:
    floors = Floors(Clock())
    _full(floors, xmin=100, xid=105, at=10, ready=5, lease=10)
    assert floors.params() == {"ready_floor": None, "lease_floor": None}
    # A writer that took ID 103 before the claim took 105 still runs: nothing is
    # taken, though the claim's snapshot may have put its xmax below 103.
    _full(floors, xmin=103, xid=110, at=11, ready=9, lease=11)
    assert floors.ready is None
    # 105 is still running at this snapshot (xmin = 105): not yet either.
    _full(floors, xmin=105, xid=111, at=12, ready=11.5, lease=12)
    assert floors.ready is None
    # Past it: the report counts, no higher than the first claim's time.
    _full(floors, xmin=106, xid=112, at=13, ready=12.5, lease=13)
    assert floors.ready == _at(10) - MARGIN
    assert floors.lease == _at(10) - MARGIN


def test_a_claim_that_wrote_nothing_leaves_no_mark() -> None:
    floors = Floors(Clock())
    _full(floors, xmin=5, xid=None, at=10, ready=10, lease=10)
    _full(floors, xmin=9, xid=None, at=11, ready=11, lease=11)
    assert floors.ready is None
    _full(floors, xmin=9, xid=9, at=12, ready=12, lease=12)
    _full(floors, xmin=10, xid=None, at=13, ready=13, lease=13)
    assert floors.ready == _at(12) - MARGIN


def test_below_the_bound_a_report_is_taken_as_it_is_and_a_floor_only_rises() -> None:
    floors = Floors(Clock())
    _full(floors, xmin=1, xid=2, at=10, ready=10, lease=10)
    _full(floors, xmin=3, xid=4, at=20, ready=4, lease=19)
    assert floors.ready == _at(4)
    assert floors.lease == _at(10) - MARGIN
    # An older snapshot's lower report, arriving late, moves nothing down.
    floors.learn(_report(xmin=5, xid=6, at=30, ready=2, lease=2, read_from=None), full_next=False)
    assert floors.ready == _at(4) and floors.lease == _at(10) - MARGIN


def test_a_claim_that_read_from_above_the_floor_held_teaches_nothing() -> None:
    clock = Clock()
    floors = Floors(clock)
    _warm(floors, at=100)
    high = Floors(Clock())
    high.ready, high.lease = floors.ready, floors.lease
    # The look-back comes due and lowers the floors...
    clock.now = LOOK_BACK_EVERY
    _full(floors, xmin=5, xid=6, at=102, ready=102, lease=102)
    lowered = _at(102) - LOOK_BACK
    assert floors.ready == lowered and floors.lease == lowered
    # ...and a claim begun from the old floors does not raise them back: it never
    # read what lies between.
    floors.learn(_report(xmin=7, xid=8, at=103, ready=103, lease=103, read_from=high),
                 full_next=False)
    assert floors.ready == lowered and floors.lease == lowered
    # One begun from the lowered floors does.
    _full(floors, xmin=9, xid=10, at=104, ready=104, lease=104)
    assert floors.ready == _at(103) - MARGIN


def test_each_look_back_reaches_behind_the_one_before() -> None:
    clock = Clock()
    floors = Floors(clock)
    _warm(floors, at=10)
    clock.now = LOOK_BACK_EVERY - 1
    _full(floors, xmin=5, xid=6, at=40, ready=40, lease=40)
    assert floors.ready == _at(11) - MARGIN  # not yet
    clock.now = LOOK_BACK_EVERY
    _full(floors, xmin=7, xid=8, at=50, ready=50, lease=50)
    assert floors.ready == _at(50) - LOOK_BACK
    # Claims sparse since: the next look-back starts behind the previous one.
    _full(floors, xmin=9, xid=10, at=200, ready=200, lease=200)
    assert floors.ready == _at(50) - MARGIN
    clock.now = 2 * LOOK_BACK_EVERY
    _full(floors, xmin=11, xid=12, at=201, ready=201, lease=201)
    assert floors.ready == _at(50) - LOOK_BACK


def test_the_backstop_reads_from_the_start() -> None:
    clock = Clock()
    floors = Floors(clock)
    _warm(floors)
    clock.now = BACKSTOP_EVERY
    _full(floors, xmin=5, xid=6, at=20, ready=20, lease=20)
    assert floors.params() == {"ready_floor": None, "lease_floor": None}


def _unreported(xid: int | None, at: float, read_from: Floors) -> Any:
    """A claim of the waiting range alone: its mark, no floors, no xmin."""
    params = read_from.params()
    return {
        "snapshot_xmin": None, "claim_xid": xid, "looked_at": _at(at),
        "ready_floor": None, "lease_floor": None,
        "ready_from": params["ready_floor"], "lease_from": params["lease_floor"],
    }


def test_a_report_is_due_at_first_after_its_interval_and_after_a_short_claim() -> None:
    clock = Clock()
    floors = Floors(clock)
    assert floors.report_due()
    _full(floors, xmin=1, xid=2, at=10, ready=10, lease=10)
    assert not floors.report_due()
    floors.learn(_unreported(xid=3, at=10.001, read_from=floors), full_next=False)
    assert not floors.report_due()
    clock.now += REPORT_EVERY
    assert floors.report_due()
    floors.learn(_report(xmin=4, xid=5, at=10.02, ready=10, lease=10, read_from=floors),
                 full_next=False)
    assert not floors.report_due()
    # Fewer messages than wanted: the waiting range may be empty, leases may
    # have run out, so the next claim reads both ranges.
    floors.learn(_unreported(xid=6, at=10.021, read_from=floors), full_next=True)
    assert floors.report_due()
    floors.learn(None, full_next=True)
    assert floors.report_due()


def test_an_unreported_claim_raises_nothing_but_leaves_a_mark_a_report_uses() -> None:
    floors = Floors(Clock())
    floors.learn(_unreported(xid=7, at=10, read_from=floors), full_next=False)
    floors.learn(_unreported(xid=9, at=11, read_from=floors), full_next=False)
    assert floors.params() == {"ready_floor": None, "lease_floor": None}
    # A report whose xmin passed 7 but not 9: no higher than 7's time.
    floors.learn(_report(xmin=8, xid=None, at=12, ready=12, lease=12, read_from=floors),
                 full_next=False)
    assert floors.ready == floors.lease == _at(10) - MARGIN
