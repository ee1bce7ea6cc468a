"""The standing rows of bench/history.py: one client's receive + delete over a
queue that holds many messages (backlog) or many tenants' messages (a fair
queue, docs/fair-queues.md).

The queue is filled through the SQL API (`leaseq.send_batch`, 10,000 messages
a call, each naming its tenant in `groups` on a fair queue: tenant n % T for
message n), vacuumed and analysed, and left idle two seconds (PostgreSQL's
CPU meanwhile is the row's idle figure: on a fair queue, mostly the service's
fairness round). Then one client receives one message at a time (`wait=0`)
and deletes it, for the row's seconds (and at least 3 times), in phases of
at most half the messages standing: between two phases the messages taken
are sent again, outside the measured time, so that the backlog stands. Per
row: the latency of the receive and of the whole cycle, the CPU per message
of PostgreSQL and of the service over the phases. The queue's tenants' rows
(leaseq.tenants) are the service's own doing: a tenant gets one when one of
its messages is first claimed.
Lost = messages sent - deleted - still stored; duplicated = receives of a
message already received.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from bench._harness import Http, Service, call, percentile, settle
from bench.apart import Spread
from bench.cycle import acknowledge

CHUNK = 10_000  # messages a leaseq.send_batch call
IDLE_SECONDS = 2.0
LEAST_CYCLES = 3


def fill(url: str, queue: str, count: int, tenants: int | None, *, first: int = 0) -> float:
    """`count` messages sent through leaseq.send_batch, numbered from `first`
    (message n names tenant n % `tenants`); the seconds it took."""
    spread = None if tenants is None else Spread(tenants)

    async def go() -> None:
        conn = await asyncpg.connect(url)
        try:
            for start in range(0, count, CHUNK):
                n = min(CHUNK, count - start)
                groups = (None if spread is None else
                          [spread.group(first + start + i) for i in range(n)])
                await conn.fetchval(
                    "SELECT count(*) FROM leaseq.send_batch($1, array_fill('x'::text, "
                    "ARRAY[$2::int]), groups => $3::text[])", queue, n, groups)
        finally:
            await conn.close()

    start = time.monotonic()
    asyncio.run(go())
    return time.monotonic() - start


def stored(port: int, queue: str) -> int:
    """Messages the queue holds, whatever their state (its REST stats)."""
    stats = call(port, "GET", f"/v1/queues/{queue}")["stats"]
    return int(stats["visible"]) + int(stats["in_flight"]) + int(stats["delayed"])


@dataclass
class _Seen:
    receive: list[float] = field(default_factory=list)
    cycle: list[float] = field(default_factory=list)
    claimed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    empty: int = 0
    seconds: float = 0.0  # measured: the phases' time, not the top-ups'
    database: float = 0.0  # PostgreSQL's CPU seconds in the phases
    service: float = 0.0  # the service's
    sent: int = 0  # the first fill and the top-ups


async def _phase(port: int, queue: str, seen: _Seen, *, cycles: int, until: float) -> None:
    """Receive + delete, `cycles` times or until `until` (and LEAST_CYCLES in all)."""
    http = await Http.open(port)
    base = f"/v1/queues/{queue}"
    try:
        for _ in range(cycles):
            if time.monotonic() >= until and len(seen.cycle) >= LEAST_CYCLES:
                return
            start = time.perf_counter()
            status, got = await http.request(
                "GET", f"{base}/receive?max=1&wait=0&visibility_timeout=600")
            received = time.perf_counter()
            if status != 200:
                raise RuntimeError(f"receive: {status} {got}")
            messages = got["messages"]
            if not messages:
                seen.empty += 1
                if seen.empty > 100:
                    raise RuntimeError("the queue ran dry")
                continue
            seen.claimed.extend(m["message_id"] for m in messages)
            seen.deleted.extend(await acknowledge(http, base, messages, 1))
            seen.receive.append(received - start)
            seen.cycle.append(time.perf_counter() - start)
    finally:
        http.close()


def _measure(service: Service, url: str, queue: str, *, count: int, tenants: int | None,
             seconds: float) -> _Seen:
    """Phases of at most half the standing messages; between two, the messages
    taken are sent again (untimed, uncounted), so that the backlog stands."""
    seen = _Seen(sent=count)
    while seen.seconds < seconds or len(seen.cycle) < LEAST_CYCLES:
        before = len(seen.deleted)
        database, own, start = (service.database_cpu_seconds(), service.cpu_seconds(),
                                time.monotonic())
        asyncio.run(_phase(service.port, queue, seen, cycles=max(count // 2, 1),
                           until=start + seconds - seen.seconds))
        seen.seconds += time.monotonic() - start
        seen.database += service.database_cpu_seconds() - database
        seen.service += service.cpu_seconds() - own
        if seen.seconds < seconds or len(seen.cycle) < LEAST_CYCLES:
            taken = len(seen.deleted) - before
            fill(url, queue, taken, tenants, first=seen.sent)
            seen.sent += taken
    return seen


def row(service: Service, url: str, *, count: int, tenants: int | None,
        seconds: float) -> dict[str, Any]:
    """One row on a fresh queue (fair when `tenants` is given), deleted after."""
    name = f"{'tenants' if tenants else 'backlog'}-{uuid.uuid4().hex[:8]}"
    call(service.port, "POST", "/v1/queues", {"name": name, **({"fair": True} if tenants else {})})
    fill_seconds = fill(url, name, count, tenants)
    settle(url, "leaseq.messages")
    before = service.database_cpu_seconds()
    time.sleep(IDLE_SECONDS)
    idle = service.database_cpu_seconds() - before
    seen = _measure(service, url, name, count=count, tenants=tenants, seconds=seconds)
    left = stored(service.port, name)
    call(service.port, "DELETE", f"/v1/queues/{name}")
    done = max(len(set(seen.deleted)), 1)
    return {
        "messages": count, "tenants": tenants, "fill_seconds": fill_seconds,
        "seconds": seen.seconds, "cycles": len(seen.cycle),
        "cycles_per_second": len(seen.cycle) / seen.seconds,
        "receive_p50_ms": percentile(seen.receive, 50) * 1000,
        "receive_p99_ms": percentile(seen.receive, 99) * 1000,
        "cycle_p50_ms": percentile(seen.cycle, 50) * 1000,
        "cycle_p99_ms": percentile(seen.cycle, 99) * 1000,
        "database_us_per_message": 1e6 * seen.database / done,
        "service_us_per_message": 1e6 * seen.service / done,
        "idle_database_cpu_percent": 100 * idle / IDLE_SECONDS,
        "empty_receives": seen.empty,
        "lost": seen.sent - len(set(seen.deleted)) - left,
        "duplicated": len(seen.claimed) - len(set(seen.claimed)),
    }


def rows(service: Service, url: str, *, counts: list[int], tenants: list[int | None],
         seconds: float) -> list[dict[str, Any]]:
    """One row per (count, tenants) pair, each with its ratios to the first row."""
    found = [row(service, url, count=c, tenants=t, seconds=seconds)
             for c, t in zip(counts, tenants, strict=True)]
    first = found[0]
    for entry in found:
        for key in ("cycle_p50_ms", "cycle_p99_ms", "receive_p50_ms",
                    "database_us_per_message"):
            entry[f"{key}_x_first"] = entry[key] / max(first[key], 1e-9)
    return found
