"""Heartbeat capacity: how many heartbeats/s one PostgreSQL primary takes.

    python -m bench.heartbeat_capacity [--quick] [--leases N] [--seconds S]

Starts `leaseq serve` (embedded PostgreSQL unless DATABASE_URL is set) and
measures, in one run on one service and one database:
- raw: N leases claimed in SQL (bench.cycle's claim) on one queue, then 16
  asyncpg connections running the engine's own heartbeat statement
  (change_visibility of app/queue/queries.sql, 100 rows a statement) back to
  back: the database's limit for heartbeats here;
- rest: N leases on another queue, sent and received through the REST API,
  then 16 clients sending `POST /v1/queues/{q}/messages/visibility` with 100
  handles a request, back to back.
Each client owns its share of the leases, in chunks of 100, so no two clients
extend the same row. The clients run in 2 generator processes (as bench.cycle's
do); their CPU is printed beside the service's and PostgreSQL's, per heartbeat.
Results are printed and written to bench/results/heartbeat-capacity-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench._harness import (
    Http,
    Service,
    call,
    find_queue_id,
    percentile,
    running_service,
    wait_settled,
)
from bench.cycle import RAW_CLAIM, RAW_SEND, _cpu
from bench.heartbeats import in_flight
from bench.longpoll import database_url

RESULTS = Path(__file__).parent / "results"

TIMEOUT = 600
"""Seconds each heartbeat extends its lease by (no lease lapses during a run)."""

CHUNK = 100
"""Leases per request or statement (the bench service's LEASEQ_MAX_BATCH)."""

RAW_HEARTBEAT = """
WITH
written AS MATERIALIZED (
    SELECT CASE WHEN pg_current_xact_id() IS NOT NULL THEN clock_timestamp() END AS at
)
UPDATE leaseq.messages AS m
SET visible_at = written.at + h.visibility_timeout * interval '1 second',
    leased     = h.visibility_timeout > 0
FROM unnest(CAST($1 AS bigint[]), CAST($2 AS uuid[]),
            CAST($3 AS integer[])) AS h(id, token, visibility_timeout),
     leaseq.messages AS before, written
WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = $4
  AND before.id = m.id
RETURNING m.id, m.visible_at AS lease_expires_at, h.visibility_timeout,
          m.visible_at < before.visible_at AS sooner
"""
"""change_visibility of app/queue/queries.sql, its fragments in place and its named
parameters as $n, on the parent table as a client of leaseq's tables writes it (a
generation's table may be emptied by a rotation)."""


@dataclass
class Tally:
    """What one generator process did."""

    beats: int = 0
    failed: int = 0
    errors: int = 0  # requests answered with anything but 200
    seconds: list[float] = field(default_factory=list)  # each request's or statement's
    cpu_seconds: float = 0.0


RawChunk = tuple[list[int], list[str]]
"""A raw client's chunk: message row ids and their claim tokens."""


async def _rest_client(port: int, queue: str, chunks: list[list[str]], until: float,
                       tally: Tally) -> None:
    http = await Http.open(port)
    path = f"/v1/queues/{queue}/messages/visibility"
    bodies = [{"entries": [{"receipt_handle": h, "timeout": TIMEOUT} for h in chunk]}
              for chunk in chunks]
    try:
        while time.monotonic() < until:
            for body, chunk in zip(bodies, chunks, strict=True):
                if time.monotonic() >= until:
                    break
                start = time.perf_counter()
                status, result = await http.request("POST", path, body)
                tally.seconds.append(time.perf_counter() - start)
                if status == 200:
                    tally.beats += result["succeeded"]
                    tally.failed += result["failed"]
                else:
                    tally.errors += 1
                    tally.failed += len(chunk)
    finally:
        http.close()


async def _raw_client(dsn: str, queue_id: int, chunks: list[RawChunk], until: float,
                      tally: Tally) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        while time.monotonic() < until:
            for ids, tokens in chunks:
                if time.monotonic() >= until:
                    break
                start = time.perf_counter()
                rows = await conn.fetch(RAW_HEARTBEAT, ids, tokens, [TIMEOUT] * len(ids),
                                        queue_id)
                tally.seconds.append(time.perf_counter() - start)
                tally.beats += len(rows)
                tally.failed += len(ids) - len(rows)
    finally:
        await conn.close()


def _generator(kind: str, target: Any, queue: Any, clients: list[list[Any]],
               seconds: float) -> Tally:
    """One generator process: one client per entry of `clients` (its chunks),
    back to back for `seconds`."""
    tally = Tally()
    cpu = _cpu()

    async def main() -> None:
        until = time.monotonic() + seconds
        if kind == "raw":
            runs = [_raw_client(target, queue, chunks, until, tally) for chunks in clients]
        else:
            runs = [_rest_client(target, queue, chunks, until, tally) for chunks in clients]
        await asyncio.gather(*runs)

    asyncio.run(main())
    tally.cpu_seconds = _cpu() - cpu
    return tally


def _run(kind: str, target: Any, queue: Any, chunks: list[Any], *, clients: int,
         processes: int, seconds: float, service: Service) -> dict[str, Any]:
    """`clients` clients over `processes` generator processes, the chunks dealt
    out among the clients in turn; beats/s, failures, latency and CPU per beat."""
    processes = max(1, min(processes, clients))
    owned: list[list[Any]] = [chunks[i::clients] for i in range(clients)]
    per_process = [owned[i::processes] for i in range(processes)]
    service_before = service.cpu_seconds()
    database_before = service.database_cpu_seconds()
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=processes) as pool:
        futures = [pool.submit(_generator, kind, target, queue, mine, seconds)
                   for mine in per_process]
        tallies = [f.result() for f in futures]
    wall = time.monotonic() - start
    service_cpu = service.cpu_seconds() - service_before
    database_cpu = service.database_cpu_seconds() - database_before
    generator_cpu = sum(t.cpu_seconds for t in tallies)
    beats = sum(t.beats for t in tallies)
    latencies = [s for t in tallies for s in t.seconds]
    per_beat = 1e6 / max(beats, 1)
    return {
        "kind": kind,
        "clients": clients,
        "processes": processes,
        "seconds": seconds,
        "wall_seconds": wall,
        "beats": beats,
        "beats_per_second": beats / seconds,
        "failed": sum(t.failed for t in tallies),
        "errors": sum(t.errors for t in tallies),
        "requests": len(latencies),
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "cpu_us_per_beat": {
            "service": service_cpu * per_beat,
            "database": database_cpu * per_beat,
            "generators": generator_cpu * per_beat,
        },
        "cpu_percent": {
            "service": 100 * service_cpu / wall,
            "database": 100 * database_cpu / wall,
            "generators": 100 * generator_cpu / wall,
        },
    }


def _raw_leases(url: str, queue_id: int, leases: int) -> list[RawChunk]:
    """`leases` messages inserted and claimed in SQL: (ids, tokens) in chunks."""
    async def go() -> list[tuple[int, str]]:
        conn = await asyncpg.connect(url)
        try:
            for start in range(0, leases, 1000):
                await conn.fetch(RAW_SEND, queue_id, ["held"] * min(1000, leases - start))
            claimed: list[tuple[int, str]] = []
            while len(claimed) < leases:
                rows = await conn.fetch(RAW_CLAIM, queue_id, min(1000, leases - len(claimed)))
                if not rows:
                    raise RuntimeError(f"claimed {len(claimed)} of {leases} leases")
                claimed.extend((int(r["id"]), str(r["claim_token"])) for r in rows)
            return claimed
        finally:
            await conn.close()

    claimed = asyncio.run(go())
    return [([i for i, _ in claimed[s:s + CHUNK]], [t for _, t in claimed[s:s + CHUNK]])
            for s in range(0, len(claimed), CHUNK)]


def _vacuum(url: str) -> None:
    """Each side starts from a vacuumed table, not from the other's dead rows."""
    async def go() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("VACUUM (ANALYZE) leaseq.messages")
        finally:
            await conn.close()

    asyncio.run(go())


def measure(service: Service, url: str, *, leases: int, seconds: float, clients: int = 16,
            processes: int = 2, prefix: str = "hb-capacity") -> dict[str, Any]:
    """Raw, then REST, each with `leases` in-flight leases on a queue of its own."""
    raw_queue, rest_queue = f"{prefix}-raw", f"{prefix}-rest"
    call(service.port, "POST", "/v1/queues", {"name": raw_queue})
    raw_chunks = _raw_leases(url, find_queue_id(url, raw_queue), leases)
    handles = in_flight(service.port, rest_queue, leases, TIMEOUT)
    rest_chunks = [handles[s:s + CHUNK] for s in range(0, len(handles), CHUNK)]
    _vacuum(url)
    raw = _run("raw", url, find_queue_id(url, raw_queue), raw_chunks, clients=clients,
               processes=processes, seconds=seconds, service=service)
    _vacuum(url)
    rest = _run("rest", service.port, rest_queue, rest_chunks, clients=clients,
                processes=processes, seconds=seconds, service=service)
    for queue in (raw_queue, rest_queue):
        call(service.port, "POST", f"/v1/queues/{queue}/purge")
    return {
        "leases": leases,
        "clients": clients,
        "processes": processes,
        "seconds": seconds,
        "per_request": CHUNK,
        "raw": raw,
        "rest": rest,
        "ratio": rest["beats_per_second"] / max(raw["beats_per_second"], 1e-9),
        "failed": raw["failed"] + rest["failed"],
    }


def _split(side: dict[str, Any]) -> str:
    cpu = side["cpu_us_per_beat"]
    return f"{cpu['service']:.0f} + {cpu['database']:.0f} + {cpu['generators']:.0f}"


def summary(result: dict[str, Any]) -> str:
    """The one line `python -m bench` prints too."""
    raw, rest = result["raw"], result["rest"]
    return (
        f"heartbeat capacity: {result['leases']} leases, {result['clients']} clients, "
        f"{result['per_request']} a request: raw {raw['beats_per_second']:.0f} beats/s, "
        f"REST {rest['beats_per_second']:.0f} beats/s, REST/raw {result['ratio']:.2f}, "
        f"failed {result['failed']}; us per beat (service + PostgreSQL + generators): "
        f"raw {_split(raw)}, REST {_split(rest)}; p99 statement {raw['p99_ms']:.1f} ms, "
        f"request {rest['p99_ms']:.1f} ms"
    )


def print_report(result: dict[str, Any]) -> None:
    print(f"\nheartbeat capacity ({os.cpu_count()} cores, {result['database']}, "
          f"{result['leases']} leases in flight, {result['clients']} clients in "
          f"{result['processes']} processes, {result['per_request']} leases a "
          f"request/statement, {result['seconds']:.0f} s each)")
    print(f"{'':<10}{'beats/s':>10}{'failed':>8}{'p50':>10}{'p99':>10}"
          f"{'svc CPU':>9}{'db CPU':>8}{'gen CPU':>9}   us per beat: svc + db + gen")
    for label, side in (("raw SQL", result["raw"]), ("REST", result["rest"])):
        cpu = side["cpu_percent"]
        print(f"{label:<10}{side['beats_per_second']:>10.0f}{side['failed']:>8}"
              f"{side['p50_ms']:>8.1f}ms{side['p99_ms']:>8.1f}ms"
              f"{cpu['service']:>8.0f}%{cpu['database']:>7.0f}%{cpu['generators']:>8.0f}%"
              f"   {_split(side)}")
    leases = result["rest"]["beats_per_second"] * 10
    print(f"  REST/raw {result['ratio']:.2f}; at one beat per lease every 10 s (30 s leases, "
          f"beating every lease/3) REST carries about {leases:,.0f} leases, with nothing "
          "else running")
    print(summary(result))


def cli() -> None:
    parser = argparse.ArgumentParser(description="leaseq heartbeat capacity")
    parser.add_argument("--quick", action="store_true", help="2,000 leases, 2 s each side")
    parser.add_argument("--leases", type=int, help="leases in flight (default 10,000)")
    parser.add_argument("--seconds", type=float, help="seconds each side (default 8)")
    parser.add_argument("--output", type=Path, help="where to write the JSON results")
    args = parser.parse_args()
    leases = args.leases or (2000 if args.quick else 10000)
    seconds = args.seconds or (2.0 if args.quick else 8.0)
    with running_service() as service:
        wait_settled(service)
        result = measure(service, database_url(service), leases=leases, seconds=seconds)
    result["when"] = datetime.now().isoformat(timespec="seconds")
    result["database"] = "DATABASE_URL" if os.environ.get("DATABASE_URL") else "embedded"
    print_report(result)
    path = args.output or RESULTS / f"heartbeat-capacity-{datetime.now():%Y%m%d-%H%M%S}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    cli()
