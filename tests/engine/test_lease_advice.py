"""The lease advice's arithmetic (app/queue/advice.py): the p99.9 of held times over
a sliding window, the lease it implies, and when it warns."""

from __future__ import annotations

import pytest

from app.queue.advice import MIN_SAMPLES, SLOT_SECONDS, WINDOW_SECONDS, QueueLeases


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_the_p999_is_the_sample_that_999_in_1000_do_not_pass(clock: Clock) -> None:
    leases = QueueLeases(clock)
    leases.claimed(30, 0)
    leases.held([1.0] * 998 + [100.0, 100.0])
    advice = leases.advice()
    assert advice.samples == 1000
    assert advice.held_p999_seconds == pytest.approx(100.0, rel=0.05)
    assert advice.visibility_timeout == pytest.approx(150, rel=0.05)  # 1.5 x p99.9
    assert advice.heartbeat_seconds == 10  # a third of the 30 s granted
    leases = QueueLeases(clock)
    leases.held([1.0] * 999 + [100.0])
    advice = leases.advice()
    assert advice.held_p999_seconds == pytest.approx(1.0, rel=0.05)
    assert advice.visibility_timeout == 7  # p99.9 + 5 s: the headroom has a floor


def test_too_few_samples_claim_no_percentile(clock: Clock) -> None:
    leases = QueueLeases(clock)
    leases.held([2.0] * (MIN_SAMPLES - 1))
    advice = leases.advice()
    assert (advice.samples, advice.held_p999_seconds, advice.visibility_timeout) == (
        MIN_SAMPLES - 1, None, None)
    assert advice.warnings == ()


def test_the_window_forgets_what_is_older_than_ten_minutes(clock: Clock) -> None:
    leases = QueueLeases(clock)
    leases.held([50.0] * 200)
    clock.now += WINDOW_SECONDS / 2
    leases.held([1.0] * 200)
    assert leases.advice().held_p999_seconds == pytest.approx(50.0, rel=0.05)
    clock.now += WINDOW_SECONDS / 2 + SLOT_SECONDS
    advice = leases.advice()
    assert advice.samples == 200
    assert advice.held_p999_seconds == pytest.approx(1.0, rel=0.05)


def test_a_lease_below_the_p999_warns_unless_the_workers_heartbeat(clock: Clock) -> None:
    leases = QueueLeases(clock)
    leases.claimed(10, 0)
    leases.held([12.0] * 200)
    assert leases.advice().warnings == ("lease_below_p999",)
    leases.beat(5)
    assert leases.advice().warnings == ()
    fine = QueueLeases(clock)
    fine.claimed(60, 0)
    fine.held([12.0] * 200)
    assert fine.advice().warnings == ()


def test_redeliveries_rising_means_more_in_the_last_half_of_the_window(clock: Clock) -> None:
    leases = QueueLeases(clock)
    leases.claimed(30, 3)
    clock.now += WINDOW_SECONDS / 2 + 1
    leases.claimed(30, 2)  # fewer than before: falling
    assert leases.advice().warnings == ()
    assert leases.advice().redelivered_after_expiry == 5
    clock.now += SLOT_SECONDS
    leases.claimed(30, 2)  # 4 lately against 3 before: rising
    assert leases.advice().warnings == ("redeliveries_rising",)
