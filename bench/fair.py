"""Fair queues under a noisy tenant's burst (docs/fair-queues.md).

    python -m bench.fair [--quick]

One queue, 20 quiet tenants sending 5 messages a second each, 16 consumers
(long polls of up to 10 messages, a handler of 20 ms a message, then one
batch delete). Three rows, each on a fresh queue:
- steady: the quiet tenants alone;
- burst: one more tenant sends 20,000 messages at once, at the start, while
  the quiet tenants go on; the row lasts until the burst is consumed;
- ungrouped burst: the same load with no message naming a tenant (the queue
  is not fair: oldest first), the baseline of the queue's throughput.
Per row: the quiet tenants' dwell time (send to receive) p50 and p99, over the
messages they sent while the burst lasted; the floor of that dwell, had each
quiet message gone to the first receive that began after it was sent (burst
rows: without one the consumers wait in long polls); total
messages consumed per second while the burst lasted; PostgreSQL's and the
service's CPU per message consumed. 0 lost and 0 duplicated in every row.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench._harness import Http, Service, call, percentile, running_service, wait_settled

RESULTS = Path(__file__).parent / "results"
QUIET_TENANTS = 20
QUIET_RATE = 5.0  # messages a second, each quiet tenant
CONSUMERS = 16
HANDLER_SECONDS = 0.020  # a message
BURST_SENDERS = 4


@dataclass
class Load:
    """What one row saw."""

    sent: dict[str, float] = field(default_factory=dict)  # message body -> time sent
    dwell: dict[str, float] = field(default_factory=dict)  # quiet body -> dwell seconds
    received: Counter[str] = field(default_factory=Counter)  # body -> times received
    receives: list[tuple[float, float]] = field(default_factory=list)  # (began, answered)
    burst_left: int = 0
    burst_start: float = 0.0
    burst_end: float = 0.0
    stop: bool = False
    drained: asyncio.Event = field(default_factory=asyncio.Event)  # the burst consumed
    quiet_expected: int | None = None  # once the quiet senders stopped
    quiet_done: asyncio.Event = field(default_factory=asyncio.Event)

    def check_quiet(self) -> None:
        if self.quiet_expected is not None and len(self.dwell) >= self.quiet_expected:
            self.quiet_done.set()


async def _send_burst(port: int, queue: str, load: Load, count: int, grouped: bool) -> None:
    async def sender(first: int, step: int) -> None:
        http = await Http.open(port)
        try:
            for start in range(first * 100, count, step * 100):
                entries: list[dict[str, Any]] = []
                for n in range(start, min(count, start + 100)):
                    body = f"burst {n}"
                    entries.append({"body": body, "group": "burst"} if grouped else
                                   {"body": body})
                status, _ = await http.request(
                    "POST", f"/v1/queues/{queue}/messages", {"messages": entries})
                assert status == 200, status
        finally:
            http.close()

    await asyncio.gather(*(sender(i, BURST_SENDERS) for i in range(BURST_SENDERS)))


async def _quiet_sender(port: int, queue: str, load: Load, tenant: int, grouped: bool) -> None:
    http = await Http.open(port)
    interval = 1.0 / QUIET_RATE
    # Spread over the first interval, so that the tenants do not send together.
    next_at = time.monotonic() + interval * tenant / QUIET_TENANTS
    n = 0
    try:
        while not load.stop:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            body = f"quiet-{tenant} {n} {uuid.uuid4().hex[:6]}"
            message: dict[str, Any] = {"body": body}
            if grouped:
                message["group"] = f"quiet-{tenant}"
            load.sent[body] = time.monotonic()
            status, _ = await http.request("POST", f"/v1/queues/{queue}/messages", message)
            assert status == 201, status
            n += 1
            next_at += interval
    finally:
        http.close()


async def _consumer(port: int, queue: str, load: Load) -> None:
    http = await Http.open(port)
    try:
        while True:  # until cancelled, once every quiet message is in
            began = time.monotonic()
            status, got = await http.request(
                "GET", f"/v1/queues/{queue}/receive?max=10&wait=1&visibility_timeout=60")
            answered = time.monotonic()
            assert status == 200, status
            messages = got["messages"]
            if not messages:
                continue
            load.receives.append((began, answered))
            for message in messages:
                body = message["body"]
                load.received[body] += 1
                if body.startswith("burst"):
                    load.burst_left -= 1
                    if load.burst_left == 0:
                        load.burst_end = answered
                        load.drained.set()
                elif load.received[body] == 1:
                    load.dwell[body] = answered - load.sent[body]
                    load.check_quiet()
            await asyncio.sleep(HANDLER_SECONDS * len(messages))
            status, _ = await http.request(
                "POST", f"/v1/queues/{queue}/messages/delete",
                {"receipt_handles": [m["receipt_handle"] for m in messages]})
            assert status == 200, status
    finally:
        http.close()


def _floor(load: Load, bodies: list[str]) -> list[float]:
    """Each quiet message's dwell had it gone to the first receive that began
    after it was sent (answered when that receive was)."""
    receives = sorted(load.receives)
    starts = [began for began, _ in receives]
    floors = []
    for body in bodies:
        sent = load.sent[body]
        i = bisect.bisect_right(starts, sent)
        if i < len(receives):
            floors.append(receives[i][1] - sent)
    return floors


async def _run(service: Service, queue: str, *, burst: int, grouped: bool,
               seconds: float) -> dict[str, Any]:
    load = Load(burst_left=burst)
    consumers = [asyncio.create_task(_consumer(service.port, queue, load))
                 for _ in range(CONSUMERS)]
    quiet = [asyncio.create_task(_quiet_sender(service.port, queue, load, t, grouped))
             for t in range(QUIET_TENANTS)]
    cpu = (service.cpu_seconds(), service.database_cpu_seconds())
    load.burst_start = time.monotonic()
    if burst:
        await _send_burst(service.port, queue, load, burst, grouped)
        await load.drained.wait()
    else:
        await asyncio.sleep(seconds)
        load.burst_end = time.monotonic()
    window = load.burst_end - load.burst_start
    consumed = sum(load.received.values())
    service_cpu = service.cpu_seconds() - cpu[0]
    database_cpu = service.database_cpu_seconds() - cpu[1]
    load.stop = True
    await asyncio.gather(*quiet)
    # Whatever the quiet tenants sent last is still consumed: nothing is lost.
    load.quiet_expected = len(load.sent)
    load.check_quiet()
    try:
        await asyncio.wait_for(load.quiet_done.wait(), timeout=30)
    except TimeoutError:
        pass  # counted as lost below
    for task in consumers:
        task.cancel()
    await asyncio.gather(*consumers, return_exceptions=True)
    during = [body for body, sent in load.sent.items()
              if load.burst_start <= sent <= load.burst_end and body in load.dwell]
    dwell = [load.dwell[body] for body in during]
    floor = _floor(load, during)
    quiet_sent = list(load.sent)
    return {
        "quiet_messages": len(during),
        "dwell_p50_ms": percentile(dwell, 50) * 1000,
        "dwell_p99_ms": percentile(dwell, 99) * 1000,
        "floor_p50_ms": percentile(floor, 50) * 1000,
        "floor_p99_ms": percentile(floor, 99) * 1000,
        "seconds": window,
        "messages_per_second": consumed / window,
        "database_us_per_message": 1e6 * database_cpu / max(consumed, 1),
        "service_us_per_message": 1e6 * service_cpu / max(consumed, 1),
        "lost": sum(1 for b in quiet_sent if b not in load.received),
        "duplicated": sum(1 for n in load.received.values() if n > 1),
    }


def measure(service: Service, *, burst: int, seconds: float) -> dict[str, Any]:
    rows = {}
    for name, size, grouped in (("steady", 0, True), ("burst", burst, True),
                                ("ungrouped burst", burst, False)):
        queue = f"fair-{name.replace(' ', '-')}-{uuid.uuid4().hex[:6]}"
        call(service.port, "POST", "/v1/queues", {"name": queue})
        rows[name] = asyncio.run(_run(service, queue, burst=size, grouped=grouped,
                                      seconds=seconds))
    return {"burst": burst, "rows": rows}


def print_rows(report: dict[str, Any]) -> None:
    rows = report["rows"]
    baseline = rows["ungrouped burst"]["messages_per_second"]
    print(f"\nfair queues: {QUIET_TENANTS} quiet tenants at {QUIET_RATE:.0f} msg/s each, "
          f"{CONSUMERS} consumers ({HANDLER_SECONDS * 1000:.0f} ms a message), a burst of "
          f"{report['burst']:,} (µs of CPU per message consumed)")
    print(f"{'':16} {'quiet dwell p50':>15} {'p99':>8} {'floor p50':>10} {'p99':>7} "
          f"{'msg/s':>7} {'/ ungrouped':>11} {'postgres':>9} {'service':>8} {'lost':>5} "
          f"{'dup':>4}")
    for name, r in rows.items():
        # Without a burst the consumers wait in long polls: no floor to speak of.
        floor = (f"{r['floor_p50_ms']:7.1f} ms {r['floor_p99_ms']:4.0f} ms" if name != "steady"
                 else f"{'-':>10} {'-':>7}")
        print(f"{name:16} {r['dwell_p50_ms']:12.1f} ms {r['dwell_p99_ms']:5.0f} ms {floor} "
              f"{r['messages_per_second']:7.0f} {r['messages_per_second'] / baseline:11.2f} "
              f"{r['database_us_per_message']:9.0f} {r['service_us_per_message']:8.0f} "
              f"{r['lost']:5d} {r['duplicated']:4d}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a burst of 2,000, 3 s steady")
    parser.add_argument("--output", type=Path, help="write the report here (JSON)")
    args = parser.parse_args()
    with running_service() as service:
        wait_settled(service)
        report = measure(service, burst=2_000 if args.quick else 20_000,
                         seconds=3.0 if args.quick else 10.0)
    print_rows(report)
    path = args.output or RESULTS / f"fair-{datetime.now():%Y%m%d-%H%M%S}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    cli()
