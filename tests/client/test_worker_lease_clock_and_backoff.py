"""The worker SDK's lease arithmetic and retry backoff, on a fake clock: when a
lease ends and beats, how renewals move it, the watchdog, the backoff ladder.

The process-level faults (SIGKILL, SIGSTOP, a cut network) are in
test_worker_faults.py.
"""

from __future__ import annotations

import pytest

from leaseq import Backoff, CancelReason, LeaseClock

# -- lease arithmetic and backoff, on a fake clock -----------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_lease_is_measured_from_the_send_and_moved_only_by_newer_renewals() -> None:
    clock = FakeClock()
    lease = LeaseClock("h", 9, sent_at=100.0, clock=clock)
    assert lease.period == 3.0 and lease.deadline == 109.0 and lease.next_beat == 103.0
    clock.now = 104.0
    lease.renewed(103.0, 9)
    assert lease.deadline == 112.0 and lease.next_beat == 106.0
    lease.renewed(102.0, 9)  # an older answer arriving late moves nothing
    assert lease.deadline == 112.0
    lease.renewed(104.0, 3)  # a shorter grant (a checkpoint) beats sooner
    assert lease.deadline == 107.0 and lease.next_beat == 105.0
    lease.beat_failed(105.0)
    assert lease.next_beat == 106.5
    assert not lease.cancelled
    clock.now = 107.0
    assert lease.cancelled and lease.reason is CancelReason.LEASE_EXPIRED


def test_the_watchdog_fires_once_with_the_first_reason() -> None:
    clock = FakeClock()
    lease = LeaseClock("h", 3, sent_at=100.0, clock=clock)
    calls: list[CancelReason] = []
    lease.on_cancel(calls.append)
    assert lease.cancel(CancelReason.LEASE_LOST)
    assert not lease.cancel(CancelReason.SHUTDOWN)
    lease.on_cancel(calls.append)  # registered late: called at once
    assert calls == [CancelReason.LEASE_LOST, CancelReason.LEASE_LOST]
    closed = LeaseClock("h", 3, sent_at=100.0, clock=clock)
    closed.close()
    assert not closed.cancel(CancelReason.LEASE_LOST) and closed.reason is None
    with pytest.raises(ValueError):
        LeaseClock("h", 3, sent_at=0.0, period=3.0)


def test_backoff_grows_with_the_receive_count_and_is_capped() -> None:
    assert Backoff().delay(5) == 0
    ladder = Backoff(initial=2, multiplier=3, maximum=100, jitter=0)
    assert [ladder.delay(n) for n in range(1, 7)] == [2, 6, 18, 54, 100, 100]
    assert ladder.delay(10_000) == 100
    jittered = Backoff(initial=10, jitter=0.5)
    assert jittered.delay(1, rng=lambda: 0.0) == 5 and jittered.delay(1, rng=lambda: 1.0) == 15
    with pytest.raises(ValueError):
        Backoff(multiplier=0.5)
