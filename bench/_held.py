"""The held-horizon rows of bench/history.py: a real queue's shape (bench/apart.py:
producers and consumers apart, a standing backlog) measured in windows, first
clean, then while something holds PostgreSQL's cleanup horizon (bench/_horizon.py).

One run is one queue (or the minimal table) and one holder: a clean window,
then the holder starts and the load goes on in windows until the held time is
up. Each window is one `apart.run` (its rate, CPU per message, WAL, lost and
duplicated, as the apart rows measure them); between two windows the load
pauses for the moment the generator processes take to stop and start again,
the horizon staying held. The messages standing at a window's end are the
next window's backlog (topped up to the plan's), so a message lost anywhere in
the run is counted;
a duplicate is counted within its window (the consumers delete whatever they
receive, and a lease lasts 10 minutes).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

from bench import apart, minimal
from bench._harness import (
    Service,
    call,
    cpu_by_role,
    execute,
    fetch_ids,
    find_queue_id,
    settle,
    wal_counter,
)
from bench._horizon import Holder, SlowDump, dead_rows, holder_age, rotation

MINIMAL_QUEUE = 1  # the minimal table's queue column


@dataclass
class Plan:
    kind: str  # "rest" (leaseq's REST API) or "minimal" (the minimal table in SQL)
    batch: int
    hold: str  # "transaction" (bench/_horizon.Holder) or "pg_dump" (SlowDump)
    held_seconds: float
    window: float
    processes: int = 2
    producers: int = 8
    consumers: int = 8
    backlog: int = 1000
    spread: apart.Spread | None = None  # "rest": a fair or FIFO queue, the groups its messages name


@dataclass
class _Target:
    target: Any  # apart.run's: the service's port or the database's URL
    queue: Any  # the queue's name, or the minimal table's queue number
    table: str  # where its messages are
    remaining_sql: str
    remaining_arg: int
    prefilled: set[str]


def _prepare(service: Service, url: str, plan: Plan) -> _Target:
    if plan.kind == "rest":
        spread = plan.spread
        kind = "" if spread is None else spread.label().replace(" ", "") + "-"
        fifo = spread is not None and spread.fifo
        name = (f"held-{plan.hold.replace('_', '-')}-{kind}{plan.batch}-"
                f"{uuid.uuid4().hex[:6]}{'.fifo' if fifo else ''}")
        call(service.port, "POST", "/v1/queues", {"name": name, **({"fifo": True} if fifo else {})})
        target = _Target(service.port, name, "leaseq.messages",
                         "SELECT message_id::text FROM leaseq.messages WHERE queue_id = $1",
                         find_queue_id(url, name), set())
    else:
        asyncio.run(minimal.create(url))
        asyncio.run(minimal.reset(url))
        target = _Target(url, MINIMAL_QUEUE, f"public.{minimal.TABLE}", minimal.REMAINING,
                         MINIMAL_QUEUE, set())
    target.prefilled = _top_up(plan, target, plan.backlog)
    settle(url, target.table)
    return target


def _top_up(plan: Plan, target: _Target, missing: int) -> set[str]:
    """`missing` more messages sent to the run's queue; their ids."""
    if missing <= 0:
        return set()
    if plan.kind == "rest":
        return apart.prefill_rest(target.target, target.queue, missing, plan.spread)
    return apart.prefill_minimal(target.target, target.queue, missing)


def _canary_ms() -> float:
    """Milliseconds this process takes to hash 64 MiB, the load paused: on a
    shared machine, a window whose canary is slower than the clean window's ran
    on a slower machine, whatever leaseq did."""
    data = bytes(64 * 2**20)
    start = time.perf_counter()
    hashlib.sha256(data).digest()
    return (time.perf_counter() - start) * 1000


def _clean_up(service: Service, url: str, plan: Plan, target: _Target) -> None:
    """The queue deleted and the table rewritten (VACUUM FULL), so that the
    next run starts from a compact table, not from this run's bloat."""
    if plan.kind == "rest":
        call(service.port, "DELETE", f"/v1/queues/{target.queue}")
        asyncio.run(execute(url, "VACUUM (FULL, ANALYZE) leaseq.messages"))
    else:
        asyncio.run(minimal.reset(url))


def run(service: Service, url: str, plan: Plan, *,
        dump: tuple[str, int] | None = None) -> dict[str, Any]:
    """One run; `dump`: pg_dump's binary and the size of a full dump (for the
    pg_dump hold)."""
    target = _prepare(service, url, plan)
    service_cpu = service.cpu_seconds if plan.kind == "rest" else None
    wal = wal_counter(url)
    standing = {"ids": target.prefilled}

    def remaining() -> set[str]:
        standing["ids"] = fetch_ids(url, target.remaining_sql, target.remaining_arg)
        return standing["ids"]

    postmaster = service.postmasters()[0]

    def window(seconds: float) -> dict[str, Any]:
        # Each window's producers take `backlog` as standing when it starts: a
        # window's consumers end with one more receive than its producers can
        # refill, so what they took is sent again first (else the backlog
        # shrinks window by window, and the producers wait for room that never
        # comes once it is gone).
        standing["ids"] |= _top_up(plan, target, plan.backlog - len(standing["ids"]))
        canary = _canary_ms()
        before = cpu_by_role(postmaster, url)
        row = apart.run(
            plan.kind, target.target, target.queue, producers=plan.producers,
            consumers=plan.consumers, batch=plan.batch, backlog=plan.backlog, seconds=seconds,
            processes=plan.processes, prefilled=standing["ids"], remaining=remaining,
            service_cpu=service_cpu, database_cpu=service.database_cpu_seconds, wal_bytes=wal,
            spread=plan.spread)
        row["database_us_by_role"] = _per_message(before, cpu_by_role(postmaster, url), row)
        row["canary_ms"] = canary
        row.update(dead_rows(url, target.table))
        if plan.kind == "rest":
            row.update(rotation(url))
        return row

    clean = window(plan.window)
    holder: Holder | SlowDump
    if plan.hold == "pg_dump":
        assert dump is not None
        holder = SlowDump.outlasting(dump[0], url, size=dump[1], held=plan.held_seconds,
                                     window=plan.window)
        pid = holder.backend_pid(url)
    else:
        holder = Holder(url)
        holder.start()
        pid = holder.pid
    began = time.monotonic()
    windows = []
    try:
        while (left := plan.held_seconds - (time.monotonic() - began)) > min(1.0,
                                                                            plan.window / 4):
            row = window(min(plan.window, left))
            row["held_seconds"] = time.monotonic() - began
            row["holder_age_xids"] = holder_age(url, pid)
            windows.append(row)
    finally:
        held = holder.stop()
    # What the queue really was (a fair queue turns fair on its first tenant).
    attributes = (call(service.port, "GET", f"/v1/queues/{target.queue}")["attributes"]
                  if plan.kind == "rest" else {})
    _clean_up(service, url, plan, target)
    for row in windows:
        row.update(_ratios(row, clean))
    every = [clean, *windows]
    return {
        "kind": plan.kind, "batch": plan.batch, "hold": plan.hold,
        "spread": None if plan.spread is None else plan.spread.label(),
        "fair": attributes.get("fair"), "fifo": attributes.get("fifo"),
        "producers": plan.producers, "consumers": plan.consumers, "backlog": plan.backlog,
        "held_seconds": plan.held_seconds, "window_seconds": plan.window,
        "clean": clean, "windows": windows, "holder": held,
        "lost": sum(row["lost"] for row in every),
        "duplicated": sum(row["duplicated"] for row in every),
    }


def _per_message(before: dict[str, float], after: dict[str, float],
                 row: dict[str, Any]) -> dict[str, float]:
    """PostgreSQL's CPU microseconds per message in a window, by what its
    processes do: the cycle's backends, autovacuum's rounds (among the ended
    processes), a pg_dump's backend, the checkpointer."""
    messages = row["messages_per_second"] * row["seconds"]
    if messages <= 0:
        return {}
    spent = {role: (seconds - before.get(role, 0.0)) * 1e6 / messages
             for role, seconds in after.items()}
    return {role: round(us, 1) for role, us in sorted(spent.items(), key=lambda kv: -kv[1])
            if us >= 0.5}


def _ratios(row: dict[str, Any], clean: dict[str, Any]) -> dict[str, float | None]:
    def ratio(key: str) -> float | None:
        if row.get(key) is None or not clean.get(key):
            return None
        return float(row[key]) / float(clean[key])

    return {"canary_x_clean": ratio("canary_ms"),
            "rate_x_clean": ratio("messages_per_second"),
            "database_us_x_clean": ratio("database_us_per_message"),
            "service_us_x_clean": ratio("service_us_per_message")}


def shown(windows: list[dict[str, Any]], marks: list[float]) -> list[int]:
    """The windows a table shows: all of a short run; else those nearest 1, 2,
    5, 10 and 20 minutes held and each mark, and the last."""
    if len(windows) <= 8:
        return list(range(len(windows)))
    ends = [float(row["held_seconds"]) for row in windows]
    picked = {len(windows) - 1}
    for minutes in {1.0, 2.0, 5.0, 10.0, 20.0, *marks}:
        if minutes * 60 <= ends[-1] + 1:
            distances = [abs(end - minutes * 60) for end in ends]
            picked.add(distances.index(min(distances)))
    return sorted(picked)
