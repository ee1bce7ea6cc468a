"""Table bloat under a steady load: `python -m bench.soak [--minutes 10]`.

Starts `leaseq serve` as `python -m bench` does and runs the message cycle
through the REST API at a steady rate (batches of 10: send, claim, delete),
over a standing backlog of visible messages and a set of in-flight leases
heartbeating every lease/3 -- the three kinds of churn a queue table sees.
Every 10 s it records the messages table's size, its indexes' and its dead
tuples; at the end it prints the sizes after the first minute and at the end,
and their ratio (the target: at most 2x). JSON in bench/results/soak-*.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench._harness import Http, running_service
from bench.heartbeats import Heartbeats
from bench.longpoll import database_url

RESULTS = Path(__file__).parent / "results"

SIZES = """
WITH t AS (
    SELECT s.*
    FROM pg_partition_tree('leaseq.messages') AS p
    JOIN pg_stat_user_tables AS s ON s.relid = p.relid
    WHERE p.isleaf
)
SELECT (SELECT CAST(sum(pg_relation_size(relid)) AS bigint) FROM t) AS heap,
       (SELECT CAST(sum(pg_indexes_size(relid)) AS bigint) FROM t) AS indexes,
       (SELECT CAST(sum(n_live_tup) AS bigint) FROM t) AS live,
       (SELECT CAST(sum(n_dead_tup) AS bigint) FROM t) AS dead,
       (SELECT CAST(sum(autovacuum_count) AS bigint) FROM t) AS autovacuums,
       (SELECT CAST(sum(vacuum_count) AS bigint) FROM t) AS vacuums,
       current_setting('autovacuum') AS autovacuum
"""


async def _cycle(port: int, rate: float, until: float, counts: dict[str, int]) -> None:
    """Batches of 10 at `rate` messages/s, open loop: a slow answer does not
    lower the rate (the next batch starts on schedule, on another connection)."""
    interval = 10 / rate
    pool: list[Http] = []

    async def one() -> None:
        http = pool.pop() if pool else await Http.open(port)
        try:
            _, sent = await http.request(
                "POST", "/v1/queues/soak/messages", {"messages": [{"body": "x" * 200}] * 10}
            )
            counts["sent"] += sum(1 for r in sent["results"] if r["ok"])
            _, got = await http.request("GET", "/v1/queues/soak/receive?max=10")
            handles = [m["receipt_handle"] for m in got["messages"]]
            if handles:
                _, done = await http.request(
                    "POST", "/v1/queues/soak/messages/delete", {"receipt_handles": handles}
                )
                counts["deleted"] += done["succeeded"]
        finally:
            pool.append(http)

    tasks: set[asyncio.Task[None]] = set()
    next_at = time.monotonic()
    while next_at < until:
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        next_at += interval
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    await asyncio.gather(*tasks)
    for http in pool:
        http.close()


async def _prepare(port: int, backlog: int) -> None:
    http = await Http.open(port)
    await http.request("POST", "/v1/queues", {"name": "soak"})
    for start in range(0, backlog, 100):
        batch = [{"body": "standing"}] * min(100, backlog - start)
        await http.request("POST", "/v1/queues/soak/messages", {"messages": batch})
    http.close()


def main(minutes: float, rate: float, backlog: int, leases: int) -> dict[str, Any]:
    with running_service() as service:
        url = database_url(service)
        asyncio.run(_prepare(service.port, backlog))
        beats = Heartbeats(service.port, leases, queue="soak-held")
        beats.prepare()
        counts = {"sent": 0, "deleted": 0}
        samples: list[dict[str, Any]] = []
        start = time.monotonic()
        until = start + minutes * 60

        beats.start()
        thread = threading.Thread(
            target=lambda: asyncio.run(_cycle(service.port, rate, until, counts)), daemon=True
        )
        thread.start()

        async def watch() -> None:
            conn = await asyncpg.connect(url)
            try:
                while thread.is_alive():
                    row = await conn.fetchrow(SIZES)
                    samples.append({"second": round(time.monotonic() - start), **dict(row)})
                    print(f"{samples[-1]['second']:>5} s  heap {row['heap'] / 1e6:7.2f} MB  "
                          f"indexes {row['indexes'] / 1e6:7.2f} MB  live {row['live']:>7}  "
                          f"dead {row['dead']:>7}  autovacuums {row['autovacuums']}  "
                          f"vacuums by leaseq {row['vacuums']}", flush=True)
                    await asyncio.to_thread(thread.join, 10)
                row = await conn.fetchrow(SIZES)
                samples.append({"second": round(time.monotonic() - start), **dict(row)})
            finally:
                await conn.close()

        asyncio.run(watch())
        beats.stop()
        counts.update(beats=beats.beats, beats_failed=beats.failed)
    first_minute = next((s for s in samples if s["second"] >= 60), samples[0])
    end = samples[-1]
    return {
        "when": datetime.now().isoformat(timespec="seconds"),
        "minutes": minutes, "rate": rate, "backlog": backlog, "leases": leases,
        "counts": counts, "samples": samples,
        "after_first_minute": first_minute, "end": end,
        "heap_ratio": end["heap"] / max(first_minute["heap"], 1),
        "index_ratio": end["indexes"] / max(first_minute["indexes"], 1),
    }


def cli() -> None:
    parser = argparse.ArgumentParser(description="leaseq table bloat soak")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate", type=float, default=500, help="cycle messages per second")
    parser.add_argument("--backlog", type=int, default=5000, help="visible messages standing")
    parser.add_argument("--leases", type=int, default=1000, help="in-flight leases heartbeating")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    report = main(args.minutes, args.rate, args.backlog, args.leases)
    first, end = report["after_first_minute"], report["end"]
    print(f"\nsoak ({'DATABASE_URL' if os.environ.get('DATABASE_URL') else 'embedded'}, "
          f"autovacuum {report['end']['autovacuum']}): "
          f"{args.minutes:g} min at {args.rate:g} msg/s, backlog {args.backlog}, "
          f"{args.leases} heartbeating leases; sent {report['counts']['sent']}, "
          f"deleted {report['counts']['deleted']}, beats {report['counts']['beats']} "
          f"(failed {report['counts']['beats_failed']})")
    print(f"messages heap:    {first['heap'] / 1e6:.2f} MB after the first minute -> "
          f"{end['heap'] / 1e6:.2f} MB at the end ({report['heap_ratio']:.2f}x)")
    print(f"messages indexes: {first['indexes'] / 1e6:.2f} MB after the first minute -> "
          f"{end['indexes'] / 1e6:.2f} MB at the end ({report['index_ratio']:.2f}x)")
    path = args.output or RESULTS / f"soak-{datetime.now():%Y%m%d-%H%M%S}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str))
    print(f"written to {path}")


if __name__ == "__main__":
    cli()
