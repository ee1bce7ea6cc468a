"""app/queue/floors.py's rules, on the rows a claim reports: a report becomes a
floor only once an earlier claim's transactions have all ended, and then no
higher than that claim's time; a floor only rises; a claim that read from above
the floor held teaches nothing; the look-back lowers the floors on time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from app.queue.floors import LOOK_BACK, LOOK_BACK_EVERY, MARGIN, Floors

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _report(xmin: int, xmax: int, at: float, ready: float, lease: float,
            read_from: Floors | None = None) -> Any:
    params = read_from.params() if read_from is not None else {}
    return {
        "snapshot_xmin": xmin, "snapshot_xmax": xmax, "looked_at": _at(at),
        "ready_floor": _at(ready), "lease_floor": _at(lease),
        "ready_from": params.get("ready_floor"), "lease_from": params.get("lease_floor"),
    }


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_report_waits_for_the_transactions_running_at_an_earlier_claim() -> None:
    floors = Floors(Clock())
    floors.learn(_report(xmin=100, xmax=105, at=10, ready=5, lease=10, read_from=floors))
    assert floors.params() == {"ready_floor": None, "lease_floor": None}
    # 103 still runs: the first claim's transactions have not all ended.
    floors.learn(_report(xmin=103, xmax=110, at=11, ready=9, lease=11, read_from=floors))
    assert floors.ready is None
    # Now they have: the report counts, no higher than the first claim's time.
    floors.learn(_report(xmin=105, xmax=112, at=12, ready=11.5, lease=12, read_from=floors))
    assert floors.ready == _at(10) - MARGIN
    assert floors.lease == _at(10) - MARGIN


def test_below_the_bound_a_report_is_taken_as_it_is_and_a_floor_only_rises() -> None:
    floors = Floors(Clock())
    floors.learn(_report(xmin=1, xmax=2, at=10, ready=10, lease=10, read_from=floors))
    floors.learn(_report(xmin=2, xmax=3, at=20, ready=4, lease=19, read_from=floors))
    assert floors.ready == _at(4)
    assert floors.lease == _at(10) - MARGIN
    # An older snapshot's lower report, arriving late, moves nothing down.
    floors.learn(_report(xmin=3, xmax=4, at=30, ready=2, lease=2, read_from=None))
    assert floors.ready == _at(4) and floors.lease == _at(10) - MARGIN


def test_a_claim_that_read_from_above_the_floor_held_teaches_nothing() -> None:
    clock = Clock()
    floors = Floors(clock)
    floors.learn(_report(xmin=1, xmax=2, at=100, ready=100, lease=100, read_from=floors))
    floors.learn(_report(xmin=2, xmax=3, at=101, ready=101, lease=101, read_from=floors))
    high = Floors(Clock())
    high.ready, high.lease = floors.ready, floors.lease
    # The look-back comes due and lowers the floors...
    clock.now = LOOK_BACK_EVERY
    floors.learn(_report(xmin=3, xmax=4, at=102, ready=102, lease=102, read_from=floors))
    lowered = _at(102) - LOOK_BACK
    assert floors.ready == lowered and floors.lease == lowered
    # ...and a claim begun from the old floors does not raise them back: it never
    # read what lies between.
    floors.learn(_report(xmin=4, xmax=5, at=103, ready=103, lease=103, read_from=high))
    assert floors.ready == lowered and floors.lease == lowered
    # One begun from the lowered floors does.
    floors.learn(_report(xmin=5, xmax=6, at=104, ready=104, lease=104, read_from=floors))
    assert floors.ready == _at(103) - MARGIN


def test_the_look_back_comes_every_period_and_not_before() -> None:
    clock = Clock()
    floors = Floors(clock)
    for i in range(1, 4):
        floors.learn(_report(xmin=i, xmax=i + 1, at=i * 10, ready=i * 10, lease=i * 10,
                             read_from=floors))
    assert floors.ready == _at(20) - MARGIN
    clock.now = LOOK_BACK_EVERY - 1
    floors.learn(_report(xmin=4, xmax=5, at=40, ready=40, lease=40, read_from=floors))
    assert floors.ready == _at(30) - MARGIN
    clock.now = LOOK_BACK_EVERY
    floors.learn(_report(xmin=5, xmax=6, at=50, ready=50, lease=50, read_from=floors))
    assert floors.ready == _at(50) - LOOK_BACK
