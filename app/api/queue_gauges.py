"""The queue gauges of /metrics: every queue's depth by state, its dead-letter
counts and its fair tenants, read from the database (the `queue_gauges`
statement) at most once every GAUGE_CACHE_SECONDS, whichever process answers."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from app.queue.rows import GaugeRow

GAUGE_CACHE_SECONDS = 2.0
"""How long one reading of the queue gauges answers scrapes: several Prometheus
servers (or a dashboard) scraping at once cost the database one query."""


def _fair_families(quiet: dict[str, list[float]]) -> Iterator[Metric]:
    """Fair queues' tenants (SQS's noisy-group metrics), from the gauges pass."""
    families = (
        GaugeMetricFamily(
            "leaseq_queue_noisy_tenants",
            "Tenants of a fair queue served after the quiet ones now "
            "(SQS: ApproximateNumberOfNoisyGroups).", labels=["queue"],
        ),
        GaugeMetricFamily(
            "leaseq_queue_quiet_visible_messages",
            "Visible messages of a fair queue's quiet tenants "
            "(SQS: ApproximateNumberOfMessagesVisibleInQuietGroups).", labels=["queue"],
        ),
        GaugeMetricFamily(
            "leaseq_queue_quiet_in_flight_messages",
            "Messages in flight of a fair queue's quiet tenants.", labels=["queue"],
        ),
        GaugeMetricFamily(
            "leaseq_queue_quiet_oldest_visible_age_seconds",
            "Age of the oldest visible message of a fair queue's quiet tenants "
            "(0: none visible).", labels=["queue"],
        ),
    )
    for name, values in sorted(quiet.items()):
        for family, value in zip(families, values, strict=True):
            family.add_metric([name], value)
    yield from families


class QueueGauges:
    """The queue_gauges statement's last reading, as metric families."""

    def __init__(
        self, read: Callable[[], Awaitable[list[GaugeRow]]],
        existing: Callable[[Sequence[str]], Awaitable[set[str]]],
    ) -> None:
        self._read = read
        self.existing = existing
        """Which of some names are queues now (cheap: by the unique name)."""
        self._rows: list[GaugeRow] = []
        self._read_at = -GAUGE_CACHE_SECONDS

    async def refresh(self) -> None:
        if time.monotonic() - self._read_at >= GAUGE_CACHE_SECONDS:
            self._rows = await self._read()
            self._read_at = time.monotonic()

    async def read(self) -> list[GaugeRow]:
        """The rows of the last reading, refreshed when older than the cache."""
        await self.refresh()
        return self._rows

    def collect(self) -> Iterator[Metric]:
        visible = GaugeMetricFamily(
            "leaseq_queue_visible_messages", "Messages a receive could claim now.", labels=["queue"]
        )
        in_flight = GaugeMetricFamily(
            "leaseq_queue_in_flight_messages", "Messages claimed, their lease running.",
            labels=["queue"],
        )
        delayed = GaugeMetricFamily(
            "leaseq_queue_delayed_messages",
            "Messages not yet visible: delayed on send, or released with a delay.",
            labels=["queue"],
        )
        oldest = GaugeMetricFamily(
            "leaseq_queue_oldest_visible_age_seconds",
            "Age of the oldest visible message (0: none visible).", labels=["queue"],
        )
        dead = GaugeMetricFamily(
            "leaseq_queue_dead_letter_messages",
            "Messages of a source queue now in its dead-letter queue.",
            labels=["queue", "dead_letter_queue"],
        )
        totals: dict[str, list[float]] = {}
        quiet: dict[str, list[float]] = {}
        for row in self._rows:
            name = row["name"]
            counts = totals.setdefault(name, [0, 0, 0, 0.0])
            counts[0] += row["visible"]
            counts[1] += row["in_flight"]
            counts[2] += row["delayed"]
            counts[3] = max(counts[3], float(row["oldest_visible_age"] or 0))
            if row["source"] is not None:
                dead.add_metric([row["source"], name], row["messages"])
            if row["fair"]:
                fair = quiet.setdefault(name, [float(row["noisy_tenants"] or 0), 0, 0, 0.0])
                fair[1] += row["quiet_visible"]
                fair[2] += row["quiet_in_flight"]
                fair[3] = max(fair[3], float(row["quiet_oldest_visible_age"] or 0))
        for name, (v, f, d, age) in sorted(totals.items()):
            visible.add_metric([name], v)
            in_flight.add_metric([name], f)
            delayed.add_metric([name], d)
            oldest.add_metric([name], age)
        yield from (visible, in_flight, delayed, oldest, dead)
        yield from _fair_families(quiet)
