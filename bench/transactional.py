"""Sending inside the caller's own transaction (docs/transactions.md), against
the REST send of the same messages.

    python -m bench.transactional [--quick]     (also a part of `python -m bench`)

Each row: 16 clients in 2 generator processes, each sending one message at a
time for the row's seconds, nobody receiving (the queue grows, as under a
burst). The caller's own row goes in a table of its own (`bench_orders`).
- rest: a POST of the message: the REST send alone;
- rest + row: the caller's row INSERTed (its own transaction), then the POST:
  what an application does without the SQL API, with the crash window between
  the two that the SQL API closes;
- raw: BEGIN; INSERT the caller's row; INSERT the message's row straight into
  leaseq.messages; COMMIT: the floor of any send in the caller's transaction
  (no checks, no grants, no wake-up), which `sql` is held to;
- sql: BEGIN; INSERT the caller's row; SELECT leaseq.send(...); COMMIT, on one
  asyncpg connection: both or neither.
Per row: messages per second, PostgreSQL's and the service's CPU per message
(µs), WAL bytes per message. Then the time from an SQL send's COMMIT returning
to a REST long poll that was waiting on the queue answering with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench._harness import (
    Http,
    Service,
    call,
    execute,
    percentile,
    running_service,
    settle,
    wait_settled,
    wal_counter,
)
from bench.longpoll import database_url, until_parked

RESULTS = Path(__file__).parent / "results"
KINDS = ("rest", "rest+row", "raw", "sql")
ORDERS = """
CREATE TABLE IF NOT EXISTS public.bench_orders (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reference text NOT NULL,
    placed_at timestamptz NOT NULL DEFAULT now()
)
"""
ORDER = "INSERT INTO public.bench_orders (reference) VALUES ($1)"
SEND = "SELECT message_id FROM leaseq.send($1, $2)"
RAW = """
INSERT INTO leaseq.messages (queue_id, body, attributes, visible_at)
SELECT id, $2, '{}', statement_timestamp() FROM leaseq.queues WHERE name = $1
"""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _client(kind: str, port: int, dsn: str, queue: str, until: float) -> int:
    sent = 0
    http = await Http.open(port) if kind not in ("sql", "raw") else None
    conn = await asyncpg.connect(dsn) if kind != "rest" else None
    try:
        while time.monotonic() < until:
            reference = uuid.uuid4().hex
            if conn is not None and kind in ("sql", "raw"):
                async with conn.transaction():
                    await conn.execute(ORDER, reference)
                    if kind == "sql":
                        await conn.fetchval(SEND, queue, reference)
                    else:
                        await conn.execute(RAW, queue, reference)
            else:
                assert http is not None
                if conn is not None:
                    await conn.execute(ORDER, reference)
                status, _ = await http.request(
                    "POST", f"/v1/queues/{queue}/messages", {"body": reference})
                assert status == 201, status
            sent += 1
    finally:
        if http is not None:
            http.close()
        if conn is not None:
            await conn.close()
    return sent


def _generator(kind: str, port: int, dsn: str, queue: str, clients: int,
               seconds: float) -> tuple[int, float]:
    cpu = _cpu()

    async def main() -> int:
        until = time.monotonic() + seconds
        counts = await asyncio.gather(
            *(_client(kind, port, dsn, queue, until) for _ in range(clients)))
        return sum(counts)

    sent = asyncio.run(main())
    return sent, _cpu() - cpu


def row(service: Service, url: str, kind: str, *, clients: int, seconds: float,
        processes: int) -> dict[str, Any]:
    queue = f"tx-{kind.replace('+', '-')}-{uuid.uuid4().hex[:6]}"
    call(service.port, "POST", "/v1/queues", {"name": queue})
    settle(url, "leaseq.messages", "TRUNCATE public.bench_orders")
    wal = wal_counter(url)
    per = [clients // processes + (1 if i < clients % processes else 0)
           for i in range(processes)]
    service_before, database_before, wal_before = (
        service.cpu_seconds(), service.database_cpu_seconds(), wal())
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=processes) as pool:
        shares = [f.result() for f in [
            pool.submit(_generator, kind, service.port, url, queue, n, seconds) for n in per]]
    wall = time.monotonic() - start
    sent = sum(s for s, _ in shares)
    result = {
        "kind": kind,
        "clients": clients,
        "messages_per_second": sent / seconds,
        "database_us_per_message": 1e6 * (service.database_cpu_seconds() - database_before)
        / max(sent, 1),
        "service_us_per_message": 1e6 * (service.cpu_seconds() - service_before) / max(sent, 1),
        "wal_bytes_per_message": (wal() - wal_before) / max(sent, 1),
        "generator_cpu_percent": 100 * sum(c for _, c in shares) / wall,
    }
    stored = asyncio.run(_count(url, queue))
    result["lost"] = sent - stored
    asyncio.run(execute(url, f"DELETE FROM leaseq.messages WHERE queue_id = "
                             f"(SELECT id FROM leaseq.queues WHERE name = '{queue}')"))
    return result


async def _count(url: str, queue: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval(
            "SELECT count(*) FROM leaseq.messages AS m JOIN leaseq.queues AS q "
            "ON q.id = m.queue_id WHERE q.name = $1", queue))
    finally:
        await conn.close()


async def commit_to_wake(port: int, url: str, rounds: int) -> list[float]:
    """Seconds from an SQL send's COMMIT returning to the answer of a REST long
    poll that was waiting for it (negative: the answer was read first)."""
    queue = f"tx-wake-{uuid.uuid4().hex[:6]}"
    control = await Http.open(port)
    await control.request("POST", "/v1/queues", {"name": queue})
    waiter = await Http.open(port)
    conn = await asyncpg.connect(url)
    times = []
    try:
        for _ in range(rounds):
            poll = asyncio.create_task(waiter.request(
                "GET", f"/v1/queues/{queue}/receive?wait=20&visibility_timeout=1"))
            await until_parked(control, 1)
            async with conn.transaction():
                await conn.execute(ORDER, "wake")
                message_id = await conn.fetchval(SEND, queue, "wake")
            committed = time.perf_counter()
            _, got = await poll
            times.append(time.perf_counter() - committed)
            (message,) = got["messages"]
            assert message["message_id"] == str(message_id)
            status, _ = await control.request(
                "DELETE", f"/v1/queues/{queue}/messages/{message['receipt_handle']}")
            assert status == 204
    finally:
        await conn.close()
        waiter.close()
        control.close()
    return times


def measure(service: Service, url: str, *, seconds: float, processes: int = 2,
            clients: int = 16, rounds: int = 200) -> dict[str, Any]:
    asyncio.run(execute(url, ORDERS))
    rows = [row(service, url, kind, clients=clients, seconds=seconds, processes=processes)
            for kind in KINDS]
    times = asyncio.run(commit_to_wake(service.port, url, rounds))
    return {
        "rows": rows,
        "commit_to_wake": {"p50_ms": percentile(times, 50) * 1000,
                           "p99_ms": percentile(times, 99) * 1000, "n": len(times)},
    }


def print_rows(report: dict[str, Any]) -> None:
    rows = {r["kind"]: r for r in report["rows"]}
    rest, raw = rows["rest"], rows["raw"]
    print("\nsending in the caller's transaction (16 clients, one message a send; "
          "µs of CPU per message)")
    print(f"{'':10} {'msg/s':>8} {'/ rest':>7} {'postgres':>9} {'/ rest':>7} {'/ raw':>6} "
          f"{'service':>8} {'WAL B':>7} {'lost':>5}")
    for kind in KINDS:
        r = rows[kind]
        database = r["database_us_per_message"]
        print(f"{kind:10} {r['messages_per_second']:8.0f} "
              f"{r['messages_per_second'] / rest['messages_per_second']:7.2f} "
              f"{database:9.0f} {database / rest['database_us_per_message']:7.2f} "
              f"{database / raw['database_us_per_message']:6.2f} "
              f"{r['service_us_per_message']:8.0f} {r['wal_bytes_per_message']:7.0f} "
              f"{r['lost']:5d}")
    wake = report["commit_to_wake"]
    print(f"commit -> waiting REST receive: p50 {wake['p50_ms']:.1f} ms, "
          f"p99 {wake['p99_ms']:.1f} ms ({wake['n']} sends)")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 s a row, 50 wake-ups")
    args = parser.parse_args()
    with running_service() as service:
        wait_settled(service)
        report = measure(service, database_url(service), seconds=2.0 if args.quick else 8.0,
                         rounds=50 if args.quick else 200)
    print_rows(report)
    path = RESULTS / f"transactional-{datetime.now():%Y%m%d-%H%M%S}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    cli()
