"""/metrics through prometheus_client: request counts and latencies (SQS actions by
name), long-poll waiters and group commit of this process, the process itself, and
from the database every queue's depth and who holds its cleanup horizon back.

With `leaseq serve --workers N` (PROMETHEUS_MULTIPROC_DIR set by the CLI) the
per-process metrics live in files the processes share, and a scrape of any process
answers their sum; the queue and horizon gauges come from the database, so they are
the same whoever answers (the horizon's age within each process's timing of it).
Label values are bounded: route templates, known SQS actions and methods, queue
names (resources that exist), the horizon's one holder, never a path or a string an
HTTP client chose, a tenant or a key id. A deleted queue's series leave every scrape at once: each
scrape asks the database which of the queues its series name still exist and
leaves the rest out (the multiprocess files cannot drop an entry), and a process
forgets its own series of a queue once it is gone (a scrape, or within a second of
hearing a deletion announced).
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from app.api.horizon_gauges import HOLDER_INFO, HorizonGauges
from app.api.queue_gauges import QueueGauges
from app.queue.advice import LeaseAdvice, LeaseWatch
from app.queue.events import QueueEvents
from app.queue.group_commit import GroupCommit
from app.queue.maintenance import Maintenance
from app.queue.waiting import WaitHub

WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
                21600.0, 86400.0)
"""Send to first receive: from a worker's instant pickup to a backlog of a day."""

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0,
)
_log = logging.getLogger("leaseq.leases")
HELD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                600.0, 1800.0, 3600.0, 10800.0, 43200.0)
"""Claim to acknowledgement: a handler's duration as the queue sees it."""
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_REASONS = ("lease_below_p999", "redeliveries_rising")
_QUEUE_LABELS = ("queue", "dead_letter_queue")


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class Metrics(QueueEvents):
    """One app's metrics and its exposition; the engine's events (QueueEvents)
    counted per queue."""

    def __init__(self, hub: WaitHub, group: GroupCommit, gauges: QueueGauges,
                 maintenance: Maintenance, horizon: HorizonGauges) -> None:
        self._hub, self._group, self._gauges = hub, group, gauges
        self._horizon = horizon
        self._maintenance = maintenance
        self._multiprocess = multiprocess_dir() is not None
        # Single process: an own registry (several apps may share a test process)
        # with the process collectors. Multiprocess: the values go to files, and
        # each scrape reads them into a fresh registry.
        self._registry = None if self._multiprocess else CollectorRegistry(auto_describe=True)
        registry = self._registry
        self.requests = Counter(
            "leaseq_http_requests_total", "HTTP requests answered, by route and status.",
            ["method", "route", "status"], registry=registry,
        )
        self.latency = Histogram(
            "leaseq_http_request_duration_seconds",
            "Time to answer an HTTP request (the SQS door's: leaseq_sqs_request_duration_seconds).",
            ["method", "route"], buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.sqs_latency = Histogram(
            "leaseq_sqs_request_duration_seconds", "Time to answer an SQS action, by action.",
            ["action"], buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.waiting = Gauge(
            "leaseq_waiting_receivers", "Long-polling receivers waiting now.",
            registry=registry, multiprocess_mode="livesum",
        )
        self.seats = Gauge(
            "leaseq_waiting_receivers_limit",
            "Long-poll seats: the most receivers that may wait at once (LEASEQ_MAX_WAITERS; "
            "with several processes, their sum).",
            registry=registry, multiprocess_mode="livesum",
        )
        self.maintenance_held = Gauge(
            "leaseq_maintenance_lock_held",
            "1 in the process holding the maintenance lock, where the retention sweep and "
            "the vacuum check run: summed over a deployment's processes, 1.",
            registry=registry, multiprocess_mode="livesum",
        )
        self.wakeups = Counter(
            "leaseq_wakeups_total", "Wake-ups delivered to waiting receivers.", registry=registry,
        )
        self.watch_fences = Counter(
            "leaseq_watch_fences_total",
            "Queues this process began to watch (a long poll about to wait where none had "
            "waited for a minute): sends in callers' transactions notify only watched queues.",
            registry=registry,
        )
        self.grouped_requests = Counter(
            "leaseq_grouped_requests_total", "Requests that went through group commit.",
            ["operation"], registry=registry,
        )
        self.grouped_statements = Counter(
            "leaseq_grouped_statements_total", "Statements those requests shared.",
            ["operation"], registry=registry,
        )
        def per_queue(name: str, text: str) -> Counter:
            return Counter(name, text, ["queue"], registry=registry)

        self.sent_total = per_queue("leaseq_messages_sent_total", "Messages accepted.")
        self.received_total = per_queue(
            "leaseq_messages_received_total", "Messages claimed by receives (deliveries)."
        )
        self.deleted_total = per_queue("leaseq_messages_deleted_total", "Messages acknowledged.")
        self.released_total = per_queue(
            "leaseq_messages_released_total",
            "Messages given back by their holder (a release, a visibility timeout of 0).",
        )
        self.lease_lost_total = per_queue(
            "leaseq_lease_lost_total",
            "Acknowledgements and lease changes refused because the claim was gone (409).",
        )
        self.redelivered_total = per_queue(
            "leaseq_redelivered_after_expiry_total",
            "Claims that took a message whose previous lease had run out: work that "
            "outlived its lease and may be done twice.",
        )
        self.dead_lettered_total = per_queue(
            "leaseq_dead_lettered_total", "Messages moved to the dead-letter queue."
        )
        self.empty_receives_total = per_queue(
            "leaseq_empty_receives_total", "Receives answered with no message."
        )
        self.first_receive = Histogram(
            "leaseq_send_to_first_receive_seconds",
            "From a message's send to its first delivery, on the database clock.",
            ["queue"], buckets=WAIT_BUCKETS, registry=registry,
        )
        self.held = Histogram(
            "leaseq_lease_held_seconds",
            "From a claim to its acknowledgement, on the database clock: the handler's "
            "duration as the queue sees it.",
            ["queue"], buckets=HELD_BUCKETS, registry=registry,
        )
        self.extended_total = per_queue(
            "leaseq_leases_extended_total", "Leases renewed by their holders (heartbeats)."
        )
        self.held_p999 = Gauge(
            "leaseq_lease_held_p999_seconds",
            "The p99.9 of lease held time over the last ten minutes (this process's "
            "acknowledgements; the largest of the processes').",
            ["queue"], registry=registry, multiprocess_mode="max",
        )
        self.advised = Gauge(
            "leaseq_lease_advised_visibility_timeout_seconds",
            "The lease that p99.9 implies for a worker that does not heartbeat "
            "(p99.9 with headroom: docs/workers.md).",
            ["queue"], registry=registry, multiprocess_mode="max",
        )
        self.warning = Gauge(
            "leaseq_lease_warning",
            "1 while the lease advice warns: lease_below_p999 (the lease granted is "
            "shorter than the p99.9 and nothing heartbeats) or redeliveries_rising.",
            ["queue", "reason"], registry=registry, multiprocess_mode="max",
        )
        self._by_queue = (
            self.sent_total, self.received_total, self.deleted_total, self.released_total,
            self.lease_lost_total, self.redelivered_total, self.dead_lettered_total,
            self.empty_receives_total, self.first_receive, self.held, self.extended_total,
            self.held_p999, self.advised,
        )
        self.leases = LeaseWatch()
        self._warned: dict[str, tuple[str, ...]] = {}
        self._gone: frozenset[str] = frozenset()
        # A queue changed or was deleted (in any process: the NOTIFY the catalog
        # hears): the next tidy() looks which of this process's queues are gone.
        self._changed = False
        heard = hub.on_queue_changed

        def changed(queue_id: int | None) -> None:
            heard(queue_id)
            self._changed = True

        hub.on_queue_changed = changed
        self._exported: dict[tuple[str, str], int] = {}
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        if registry is not None:
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
            registry.register(gauges)
            registry.register(horizon)

    def _child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, kept: prometheus_client looks a child up under a
        lock each time, which every request and every operation would pay."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe(self, method: str, route: str, action: str | None, status: int,
                seconds: float) -> None:
        """One answered request (the access log's hook)."""
        method = method if method in _METHODS else "OTHER"
        self._child(self.requests, method, route, str(status)).inc()
        if action is None:
            self._child(self.latency, method, route).observe(seconds)
        else:
            self._child(self.sqs_latency, action).observe(seconds)

    # -- the engine's events (QueueEvents) -----------------------------------

    def sent(self, queue: str, count: int) -> None:
        self._child(self.sent_total, queue).inc(count)

    def received(
        self, queue: str, count: int, visibility_timeout: int, lapsed: int,
        waited: Sequence[float],
    ) -> None:
        self._child(self.received_total, queue).inc(count)
        self.leases.of(queue).claimed(visibility_timeout, lapsed)
        if lapsed:
            self._child(self.redelivered_total, queue).inc(lapsed)
        if waited:
            histogram = self._child(self.first_receive, queue)
            for seconds in waited:
                histogram.observe(seconds)

    def empty_receive(self, queue: str) -> None:
        self._child(self.empty_receives_total, queue).inc()

    def deleted(self, queue: str, count: int, held: Sequence[float]) -> None:
        self._child(self.deleted_total, queue).inc(count)
        if held:
            histogram = self._child(self.held, queue)
            for seconds in held:
                histogram.observe(seconds)
            self.leases.of(queue).held(list(held))

    def extended(self, queue: str, count: int) -> None:
        self._child(self.extended_total, queue).inc(count)
        self.leases.of(queue).beat(count)

    def released(self, queue: str, count: int) -> None:
        self._child(self.released_total, queue).inc(count)

    def lease_lost(self, queue: str, count: int) -> None:
        self._child(self.lease_lost_total, queue).inc(count)

    def dead_lettered(self, queue: str, count: int) -> None:
        self._child(self.dead_lettered_total, queue).inc(count)

    # -- exposition -----------------------------------------------------------

    def advice(self, queue: str) -> LeaseAdvice | None:
        """What the lease advice says of `queue` now (None: nothing seen of it)."""
        return self.leases.advice(queue)

    def _refresh_advice(self) -> None:
        for queue in self.leases.queues():
            advice = self.leases.advice(queue)
            assert advice is not None
            if advice.held_p999_seconds is not None:
                self.held_p999.labels(queue).set(advice.held_p999_seconds)
            if advice.visibility_timeout is not None:
                self.advised.labels(queue).set(advice.visibility_timeout)
            for reason in _REASONS:
                self.warning.labels(queue, reason).set(reason in advice.warnings)
            if advice.warnings != self._warned.get(queue, ()):
                self._warned[queue] = advice.warnings
                if advice.warnings:
                    _log.warning(
                        "queue %s: lease advice warns %s: leases of %ss, p99.9 held %ss over "
                        "%d acknowledgements, %d heartbeats, %d redeliveries after expiry; "
                        "advised visibility timeout %ss, or heartbeats every %ss",
                        queue, ", ".join(advice.warnings), advice.lease_seconds,
                        advice.held_p999_seconds, advice.samples, advice.heartbeats,
                        advice.redelivered_after_expiry, advice.visibility_timeout,
                        advice.heartbeat_seconds,
                        extra={"queue": queue, "warnings": list(advice.warnings)},
                    )

    def refresh_local(self) -> None:
        """This process's own figures into the metrics (exact at a scrape of a single
        process; with several, each refreshes its own every second)."""
        self._refresh_advice()
        self.waiting.set(self._hub.parked())
        self.seats.set(self._hub.max_waiters)
        self.maintenance_held.set(1 if self._maintenance.lock.held else 0)
        self._advance(self.wakeups, ("wakeups", ""), self._hub.wakeups)
        self._advance(self.watch_fences, ("watch_fences", ""), self._hub.watches.fences)
        for name, line in self._group.coalescers().items():
            self._advance(self.grouped_requests.labels(name), ("requests", name), line.requests)
            self._advance(self.grouped_statements.labels(name), ("statements", name),
                          line.statements)

    def _advance(self, counter: Any, key: tuple[str, str], total: int) -> None:
        counter.inc(total - self._exported.get(key, 0))
        self._exported[key] = total

    def local_queues(self) -> set[str]:
        """The queues this process holds series or lease windows of."""
        by_queue = {id(metric) for metric in self._by_queue}
        names = {labels[0] for (metric, labels) in self._children if metric in by_queue}
        names.update(self.leases.queues())  # and the advice's gauges, set from these
        return names

    def forget(self, queues: set[str]) -> None:
        """Drops every series and lease window of `queues` (deleted) in this
        process; a queue of the same name made again starts afresh (with several
        processes, its counters go on from the files' totals: still counters)."""
        if not queues:
            return
        by_queue = {id(metric) for metric in self._by_queue}
        self._children = {
            key: child for key, child in self._children.items()
            if not (key[0] in by_queue and key[1][0] in queues)
        }
        with warnings.catch_warnings():
            # prometheus_client warns that the multiprocess files keep the entry:
            # a scrape leaves those out (exposition).
            warnings.simplefilter("ignore", UserWarning)
            for queue in queues:
                for metric in self._by_queue:
                    metric.remove(queue)
                for reason in _REASONS:
                    self.warning.remove(queue, reason)
        for queue in queues:
            self.leases.forget(queue)
            self._warned.pop(queue, None)

    async def tidy(self) -> None:
        """After a queue change was heard: forgets the queues that are gone, so
        a process nobody scrapes holds nothing of them either."""
        if not self._changed:
            return
        self._changed = False
        local = self.local_queues()
        if local:
            try:
                existing = await self._gauges.existing(sorted(local))
            except Exception as exc:
                self._changed = True  # the database is away: look again later
                _log.debug("metrics: cannot tell which queues are gone (%s)", exc)
                return
            self.forget(local - existing)

    async def exposition(self, readable: Callable[[str], bool] | None = None) -> bytes:
        """The Prometheus text of the queues that exist now; with `readable`, only
        the series of the queues it allows (and those of no queue): a scoped key
        never learns another queue's name or depth."""
        self.refresh_local()
        await self._gauges.refresh()
        await self._horizon.refresh()
        registry: Any = self._registry
        if registry is None:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            registry.register(self._gauges)
            registry.register(self._horizon)
        families = list(registry.collect())
        named = {
            sample.labels[label] for family in families for sample in family.samples
            for label in _QUEUE_LABELS if label in sample.labels
        }
        gone = named - await self._gauges.existing(sorted(named)) if named else set()
        self._gone = frozenset(gone)
        self.forget(gone)

        def shown(queue: str) -> bool:
            return queue not in gone and (readable is None or readable(queue))

        # The horizon's holder is a session of the database, perhaps not leaseq's:
        # named to keys that may read every queue only.
        private = frozenset() if readable is None else frozenset({HOLDER_INFO})
        return bytes(generate_latest(_QueuesFiltered(families, shown, private)))

    @property
    def multiprocess(self) -> bool:
        return self._multiprocess

    @property
    def gauges(self) -> QueueGauges:
        return self._gauges

    def message_totals(self) -> dict[str, tuple[float, float]]:
        """queue -> (sent, acknowledged) so far: this process's, or with several
        processes the sum of all of theirs."""
        wanted = {"leaseq_messages_sent_total": 0, "leaseq_messages_deleted_total": 1}
        if self._registry is not None:
            families: Iterable[Metric] = [*self.sent_total.collect(), *self.deleted_total.collect()]
        else:
            families = multiprocess.MultiProcessCollector(None).collect()  # type: ignore[no-untyped-call]
        totals: dict[str, list[float]] = {}
        for family in families:
            for sample in family.samples:
                index = wanted.get(sample.name)
                if index is not None and sample.labels["queue"] not in self._gone:
                    totals.setdefault(sample.labels["queue"], [0.0, 0.0])[index] += sample.value
        return {queue: (sent, deleted) for queue, (sent, deleted) in totals.items()}


class _QueuesFiltered:
    """Collected families without the samples of queues `shown` refuses, nor any
    of the `private` families."""

    def __init__(self, families: list[Metric], shown: Callable[[str], bool],
                 private: frozenset[str] = frozenset()) -> None:
        self._families = families
        self._shown = shown
        self._private = private

    def collect(self) -> Iterator[Metric]:
        for family in self._families:
            kept = [] if family.name in self._private else [
                s for s in family.samples
                if all(self._shown(s.labels[label])
                       for label in _QUEUE_LABELS if label in s.labels)]
            if len(kept) != len(family.samples):
                family = copy.copy(family)
                family.samples = kept
            yield family
