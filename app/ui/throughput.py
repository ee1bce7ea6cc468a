"""The queue list's sparklines: each queue's messages sent and acknowledged per
second over the last five minutes, from the metrics' own counters.

The counters are sampled every `interval` seconds while someone watches (a
dashboard asked within `idle_after`): nothing is kept or read for a service no
one looks at. With several processes the counters are the sum of all of them
(the metrics' multiprocess files), so any process draws the same line.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable

Totals = dict[str, tuple[float, float]]
"""queue -> (messages sent, messages acknowledged), counted since the start."""


class Throughput:
    def __init__(
        self,
        totals: Callable[[], Totals],
        *,
        interval: float = 2.0,
        window: float = 300.0,
        idle_after: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._totals = totals
        self.interval = interval
        self.window = window
        self._idle_after = idle_after
        self._clock = clock
        self._samples: deque[tuple[float, Totals]] = deque(maxlen=int(window / interval) + 1)
        self._watched_at: float | None = None

    def watch(self) -> None:
        """A dashboard looks: keep sampling (the first look takes the baseline)."""
        self._watched_at = self._clock()
        if not self._samples:
            self._sample(self._watched_at)

    def tick(self) -> None:
        """Called every second or so: samples when one is due."""
        now = self._clock()
        if self._watched_at is None or now - self._watched_at > self._idle_after:
            self._samples.clear()
            self._watched_at = None
            return
        if not self._samples or now - self._samples[-1][0] >= self.interval * 0.95:
            self._sample(now)

    def _sample(self, now: float) -> None:
        self._samples.append((now, self._totals()))

    def series(self, queue: str) -> tuple[list[float], list[float]]:
        """Sent and acknowledged per second between consecutive samples, oldest first."""
        sent: list[float] = []
        deleted: list[float] = []
        samples = self._samples
        for (before_at, before), (after_at, after) in itertools.pairwise(samples):
            seconds = after_at - before_at
            old = before.get(queue, (0.0, 0.0))
            new = after.get(queue, (0.0, 0.0))
            # A counter only falls when its process restarted: no rate for that step.
            sent.append(max(new[0] - old[0], 0.0) / seconds)
            deleted.append(max(new[1] - old[1], 0.0) / seconds)
        return sent, deleted
