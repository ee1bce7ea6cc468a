"""The horizon gauges of /metrics: how long PostgreSQL's cleanup horizon has been
held back, in seconds and in transactions, and who holds it (app/queue/horizon.py),
read from the database at most once every GAUGE_CACHE_SECONDS, whichever process
answers. Each process times the holder by its own readings, so processes may differ
a little: the alert takes the largest."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from app.api.queue_gauges import GAUGE_CACHE_SECONDS
from app.queue.horizon import Horizon, HorizonReading

HOLDER_INFO = "leaseq_database_horizon_holder_info"
"""The family naming the holder: a session of the database, perhaps not leaseq's,
shown only to keys that may read every queue."""


class HorizonGauges:
    """The last reading of the horizon, as metric families."""

    def __init__(self, horizon: Horizon) -> None:
        self._horizon = horizon
        self._reading: HorizonReading | None = None
        self._read_at = -GAUGE_CACHE_SECONDS

    async def refresh(self) -> None:
        if time.monotonic() - self._read_at >= GAUGE_CACHE_SECONDS:
            self._reading = await self._horizon.read()
            self._read_at = time.monotonic()

    def collect(self) -> Iterator[Metric]:
        seconds = GaugeMetricFamily(
            "leaseq_database_horizon_age_seconds",
            "How long the oldest snapshot, transaction, replication slot or prepared "
            "transaction has held back PostgreSQL's cleanup horizon of leaseq's database: "
            "no VACUUM removes a row version deleted since (0: nothing holds it).",
        )
        transactions = GaugeMetricFamily(
            "leaseq_database_horizon_age_transactions",
            "The same age in transaction IDs: transactions begun since the oldest xmin "
            "held.",
        )
        holder = GaugeMetricFamily(
            HOLDER_INFO,
            "1, naming who holds the horizon back, once it has for "
            "LEASEQ_HORIZON_WARN_SECONDS: kind backend, slot or prepared.",
            labels=["kind", "holder", "pid"],
        )
        reading = self._reading
        if reading is not None:
            seconds.add_metric([], reading.seconds)
            transactions.add_metric([], reading.transactions)
            named = self._horizon.named(reading)
            if named is not None:
                pid = "" if named.pid is None else str(named.pid)
                holder.add_metric([named.kind, named.name, pid], 1)
        yield from (seconds, transactions, holder)
