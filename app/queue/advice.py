"""Lease advice: the essay's rule made visible. A lease should cover the p99.9 of
the handler's duration plus headroom; a worker that cannot afford the stall of a
long lease renews a short one every third of it. What a queue's handlers take is
measured by the database (claim to acknowledgement: `held`), over a sliding window
of this process's acknowledgements.

Each process sees the acknowledgements it answers: with several processes or
replicas behind a balancer, each holds a sample of the same distribution.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_SECONDS = 600.0
"""How far back the advice looks: ten minutes, in one-minute slots."""
SLOT_SECONDS = 60.0
MIN_SAMPLES = 100
"""Fewer acknowledgements than this in the window, and no percentile is claimed."""
HEADROOM = 1.5
"""The advised lease: the p99.9 times this, and at least MIN_HEADROOM_SECONDS more."""
MIN_HEADROOM_SECONDS = 5.0
MAX_LEASE = 43_200
_RATIO = 1.05  # bucket width: a percentile read from the buckets is within 5 %
_SMALLEST = 0.001


def _bucket(seconds: float) -> int:
    return 0 if seconds <= _SMALLEST else 1 + int(math.log(seconds / _SMALLEST, _RATIO))


def _upper(bucket: int) -> float:
    return _SMALLEST * _RATIO ** bucket


@dataclass(frozen=True)
class LeaseAdvice:
    samples: int
    """Acknowledgements timed in the window."""
    held_p999_seconds: float | None
    """The p99.9 of lease held time (None: fewer than MIN_SAMPLES)."""
    visibility_timeout: int | None
    """The lease the rule implies for a worker that does not heartbeat."""
    heartbeat_seconds: int | None
    """For a worker that heartbeats: a third of the lease it is granted."""
    lease_seconds: int | None
    """The lease the last receive in the window was granted."""
    heartbeats: int
    redelivered_after_expiry: int
    warnings: tuple[str, ...]
    """`lease_below_p999`: the lease granted is shorter than the p99.9 and nothing
    heartbeats; `redeliveries_rising`: more claims took a lapsed lease in the last
    half of the window than in the first."""


class _Slot:
    __slots__ = ("beats", "buckets", "lapsed", "start")

    def __init__(self, start: float) -> None:
        self.start = start
        self.buckets: dict[int, int] = {}
        self.beats = 0
        self.lapsed = 0


class QueueLeases:
    """One queue's window."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._slots: deque[_Slot] = deque()
        self.visibility_timeout: int | None = None
        """The last claim's, for the heartbeat period advised with it."""

    def _now_slot(self) -> _Slot:
        now = self._clock()
        while self._slots and self._slots[0].start <= now - WINDOW_SECONDS:
            self._slots.popleft()
        if not self._slots or self._slots[-1].start <= now - SLOT_SECONDS:
            self._slots.append(_Slot(now))
        return self._slots[-1]

    def held(self, seconds: list[float]) -> None:
        buckets = self._now_slot().buckets
        for value in seconds:
            bucket = _bucket(value)
            buckets[bucket] = buckets.get(bucket, 0) + 1

    def claimed(self, visibility_timeout: int, lapsed: int) -> None:
        self.visibility_timeout = visibility_timeout
        self._now_slot().lapsed += lapsed

    def beat(self, count: int) -> None:
        self._now_slot().beats += count

    def advice(self) -> LeaseAdvice:
        self._now_slot()
        counts: dict[int, int] = {}
        for slot in self._slots:
            for bucket, count in slot.buckets.items():
                counts[bucket] = counts.get(bucket, 0) + count
        samples = sum(counts.values())
        beats = sum(slot.beats for slot in self._slots)
        lapsed = sum(slot.lapsed for slot in self._slots)
        p999 = None
        if samples >= MIN_SAMPLES:
            # The bucket holding the sample that 99.9 % of the others do not pass.
            rank, seen = math.ceil(samples * 0.999), 0
            for bucket in sorted(counts):
                seen += counts[bucket]
                if seen >= rank:
                    p999 = _upper(bucket)
                    break
        advised = None
        if p999 is not None:
            advised = min(MAX_LEASE, math.ceil(max(p999 * HEADROOM,
                                                    p999 + MIN_HEADROOM_SECONDS)))
        warnings = []
        lease = self.visibility_timeout
        if p999 is not None and lease is not None and lease < p999 and beats == 0:
            warnings.append("lease_below_p999")
        now = self._clock()
        recent = sum(s.lapsed for s in self._slots if s.start > now - WINDOW_SECONDS / 2)
        if recent > lapsed - recent:
            warnings.append("redeliveries_rising")
        return LeaseAdvice(
            samples=samples,
            held_p999_seconds=None if p999 is None else round(p999, 3),
            visibility_timeout=advised,
            heartbeat_seconds=(
                None if self.visibility_timeout is None else max(1, self.visibility_timeout // 3)
            ),
            lease_seconds=self.visibility_timeout,
            heartbeats=beats,
            redelivered_after_expiry=lapsed,
            warnings=tuple(warnings),
        )


class LeaseWatch:
    """Every queue's window, by queue name."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._queues: dict[str, QueueLeases] = {}

    def of(self, queue: str) -> QueueLeases:
        leases = self._queues.get(queue)
        if leases is None:
            leases = self._queues[queue] = QueueLeases(self._clock)
        return leases

    def advice(self, queue: str) -> LeaseAdvice | None:
        leases = self._queues.get(queue)
        return None if leases is None else leases.advice()

    def queues(self) -> list[str]:
        return list(self._queues)

    def forget(self, queue: str) -> None:
        """A deleted queue's window goes with it."""
        self._queues.pop(queue, None)
