"""app/queue/floors.py's rules, on the rows a claim reports: a report becomes a
floor only once a later snapshot's xmin has passed an earlier claim's own
transaction ID, and then no higher than that claim's time; a claim that wrote
nothing leaves no mark; a floor only rises; a claim that read from above the
floor held teaches nothing; the look-back and the backstop lower the floors on
time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from app.queue.floors import BACKSTOP_EVERY, LOOK_BACK, LOOK_BACK_EVERY, MARGIN, Floors

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


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _warm(floors: Floors, at: float = 10) -> None:
    """Two claims, the second past the first's ID: the floors set at `at`."""
    floors.learn(_report(xmin=1, xid=2, at=at, ready=at, lease=at, read_from=floors))
    floors.learn(_report(xmin=3, xid=4, at=at + 1, ready=at + 1, lease=at + 1, read_from=floors))
    assert floors.ready == _at(at) - MARGIN


def test_a_report_waits_until_an_earlier_claims_own_id_has_ended() -> None:
    floors = Floors(Clock())
    floors.learn(_report(xmin=100, xid=105, at=10, ready=5, lease=10, read_from=floors))
    assert floors.params() == {"ready_floor": None, "lease_floor": None}
    # A writer that took ID 103 before the claim took 105 still runs: nothing is
    # taken, though the claim's snapshot may have put its xmax below 103.
    floors.learn(_report(xmin=103, xid=110, at=11, ready=9, lease=11, read_from=floors))
    assert floors.ready is None
    # 105 is still running at this snapshot (xmin = 105): not yet either.
    floors.learn(_report(xmin=105, xid=111, at=12, ready=11.5, lease=12, read_from=floors))
    assert floors.ready is None
    # Past it: the report counts, no higher than the first claim's time.
    floors.learn(_report(xmin=106, xid=112, at=13, ready=12.5, lease=13, read_from=floors))
    assert floors.ready == _at(10) - MARGIN
    assert floors.lease == _at(10) - MARGIN


def test_a_claim_that_wrote_nothing_leaves_no_mark() -> None:
    floors = Floors(Clock())
    floors.learn(_report(xmin=5, xid=None, at=10, ready=10, lease=10, read_from=floors))
    floors.learn(_report(xmin=9, xid=None, at=11, ready=11, lease=11, read_from=floors))
    assert floors.ready is None
    floors.learn(_report(xmin=9, xid=9, at=12, ready=12, lease=12, read_from=floors))
    floors.learn(_report(xmin=10, xid=None, at=13, ready=13, lease=13, read_from=floors))
    assert floors.ready == _at(12) - MARGIN


def test_below_the_bound_a_report_is_taken_as_it_is_and_a_floor_only_rises() -> None:
    floors = Floors(Clock())
    floors.learn(_report(xmin=1, xid=2, at=10, ready=10, lease=10, read_from=floors))
    floors.learn(_report(xmin=3, xid=4, at=20, ready=4, lease=19, read_from=floors))
    assert floors.ready == _at(4)
    assert floors.lease == _at(10) - MARGIN
    # An older snapshot's lower report, arriving late, moves nothing down.
    floors.learn(_report(xmin=5, xid=6, at=30, ready=2, lease=2, read_from=None))
    assert floors.ready == _at(4) and floors.lease == _at(10) - MARGIN


def test_a_claim_that_read_from_above_the_floor_held_teaches_nothing() -> None:
    clock = Clock()
    floors = Floors(clock)
    _warm(floors, at=100)
    high = Floors(Clock())
    high.ready, high.lease = floors.ready, floors.lease
    # The look-back comes due and lowers the floors...
    clock.now = LOOK_BACK_EVERY
    floors.learn(_report(xmin=5, xid=6, at=102, ready=102, lease=102, read_from=floors))
    lowered = _at(102) - LOOK_BACK
    assert floors.ready == lowered and floors.lease == lowered
    # ...and a claim begun from the old floors does not raise them back: it never
    # read what lies between.
    floors.learn(_report(xmin=7, xid=8, at=103, ready=103, lease=103, read_from=high))
    assert floors.ready == lowered and floors.lease == lowered
    # One begun from the lowered floors does.
    floors.learn(_report(xmin=9, xid=10, at=104, ready=104, lease=104, read_from=floors))
    assert floors.ready == _at(103) - MARGIN


def test_each_look_back_reaches_behind_the_one_before() -> None:
    clock = Clock()
    floors = Floors(clock)
    _warm(floors, at=10)
    clock.now = LOOK_BACK_EVERY - 1
    floors.learn(_report(xmin=5, xid=6, at=40, ready=40, lease=40, read_from=floors))
    assert floors.ready == _at(11) - MARGIN  # not yet
    clock.now = LOOK_BACK_EVERY
    floors.learn(_report(xmin=7, xid=8, at=50, ready=50, lease=50, read_from=floors))
    assert floors.ready == _at(50) - LOOK_BACK
    # Claims sparse since: the next look-back starts behind the previous one.
    floors.learn(_report(xmin=9, xid=10, at=200, ready=200, lease=200, read_from=floors))
    assert floors.ready == _at(50) - MARGIN
    clock.now = 2 * LOOK_BACK_EVERY
    floors.learn(_report(xmin=11, xid=12, at=201, ready=201, lease=201, read_from=floors))
    assert floors.ready == _at(50) - LOOK_BACK


def test_the_backstop_reads_from_the_start() -> None:
    clock = Clock()
    floors = Floors(clock)
    _warm(floors)
    clock.now = BACKSTOP_EVERY
    floors.learn(_report(xmin=5, xid=6, at=20, ready=20, lease=20, read_from=floors))
    assert floors.params() == {"ready_floor": None, "lease_floor": None}
