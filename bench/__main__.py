"""leaseq benchmark suite: `python -m bench [--quick]`.

Starts `leaseq serve` as users run it (embedded PostgreSQL unless DATABASE_URL
is set) and prints one table, measured in one run on one PostgreSQL:

- raw: the cycle send -> claim -> conditional delete written directly in SQL
  with asyncpg on leaseq's own table, one message per statement and batches
  of 10, at 1, 4 and 16 concurrent clients;
- minimal: the same SQL cycle on the minimal queue table (bench/minimal.py),
  the database's floor;
- rest: the same cycle through leaseq's REST API, and the ratio rest / raw;
- apart: a real queue's shape, producers and consumers apart with a standing
  backlog (bench/apart.py), leaseq against the minimal table;
- lost and duplicated messages of every row (lost must be 0);
- fifo: the REST cycle (batches of 10, 16 clients) on a FIFO queue, its
  messages spread over 100 message groups and all in one hot group (the worst
  case: one batch in flight at a time), as a ratio of the standard queue's
  REST cycle measured just before them;
- the cycle (REST, batches of 10, 16 clients) with and without N in-flight
  leases heartbeating every lease/3 through the batch heartbeat endpoint;
- heartbeat capacity: N in-flight leases extended back to back by 16 clients,
  100 a request, through REST and as the engine's statement in raw SQL
  (bench/heartbeat_capacity.py);
- sending in the caller's own transaction (leaseq.send with a row of the
  caller's) against the REST send, and commit -> wake latency
  (bench/transactional.py);
- send -> receive latency through a waiting long poll.
Each row shows the load generators' CPU (several processes; when they near
100% of a core each, the row measures them, not leaseq) and the service's.
Results are also written to bench/results/bench-<time>.json.

`--history` adds, after that table, the rows of bench/history.py (on a
service of their own): the message cycle while a transaction holds
PostgreSQL's cleanup horizon and while pg_dump runs, fair queues with many
tenants, a backlog of 1,000,000. Off by default, because the held-horizon
rows last minutes each: about 2 h 20 min in all (with --quick, about 9 min).
Their results go into the same JSON, under "history".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from bench import apart, cycle, heartbeat_capacity, history, minimal, transactional
from bench._harness import (
    Http,
    Service,
    call,
    fetch_ids,
    find_queue_id,
    free_port,
    percentile,
    running_service,
    settle,
    wait_settled,
    wal_counter,
)
from bench.heartbeats import Heartbeats
from bench.longpoll import database_url, send_to_receive

RESULTS = Path(__file__).parent / "results"


def cycle_rows(service: Service, url: str, *, seconds: float, clients: list[int],
               processes: int) -> list[dict[str, Any]]:
    rows = []
    service_cpu = _service_cpu(service)
    database_cpu = service.database_cpu_seconds
    wal = wal_counter(url)
    asyncio.run(minimal.create(url))
    for batch in (1, 10):
        for n in clients:
            name = f"cycle-{batch}-{n}"
            call(service.port, "POST", "/v1/queues", {"name": name})
            queue_id = find_queue_id(url, name)
            remaining_rest = lambda q=queue_id: fetch_ids(  # noqa: E731
                url, "SELECT message_id::text FROM leaseq.messages WHERE queue_id = $1", q)
            remaining_raw = lambda q=queue_id: fetch_ids(  # noqa: E731
                url, "SELECT id::text FROM leaseq.messages WHERE queue_id = $1", q)
            least = None
            if n == max(clients):  # where the database's costs are compared
                least = cycle.run(
                    "minimal", url, queue_id, clients=n, batch=batch, seconds=seconds,
                    processes=processes,
                    remaining=lambda q=queue_id: fetch_ids(url, minimal.REMAINING, q),
                    service_cpu=service_cpu, database_cpu=database_cpu, wal_bytes=wal)
                asyncio.run(minimal.reset(url))
            raw = cycle.run("raw", url, queue_id, clients=n, batch=batch, seconds=seconds,
                            processes=processes, remaining=remaining_raw,
                            service_cpu=service_cpu, database_cpu=database_cpu,
                            wal_bytes=wal)
            fetch_ids(url, "DELETE FROM leaseq.messages WHERE queue_id = $1 RETURNING id", queue_id)
            grouped = _grouping(service.port)
            rest = cycle.run("rest", service.port, name, clients=n, batch=batch,
                             seconds=seconds, processes=processes, remaining=remaining_rest,
                             service_cpu=service_cpu, database_cpu=database_cpu,
                             wal_bytes=wal)
            after = _grouping(service.port)
            rest_row = rest.as_dict()
            # Requests per statement (group commit); /metrics is one worker's only.
            rest_row["requests_per_statement"] = None if service.workers > 1 else {
                op: (after[op][0] - grouped[op][0]) / max(after[op][1] - grouped[op][1], 1)
                for op in ("send", "claim", "delete")
            }
            row = {"raw": raw.as_dict(), "rest": rest_row,
                   "ratio": rest.messages_per_second / max(raw.messages_per_second, 1e-9)}
            if least is not None:
                row["minimal"] = least.as_dict()
            if n == max(clients):
                # The workers' cycle: each acknowledgement rides on the next receive.
                fetch_ids(url, "DELETE FROM leaseq.messages WHERE queue_id = $1 RETURNING id",
                          queue_id)
                worker = cycle.run("worker", service.port, name, clients=n, batch=batch,
                                   seconds=seconds, processes=processes,
                                   remaining=remaining_rest, service_cpu=service_cpu,
                                   database_cpu=database_cpu, wal_bytes=wal)
                row["worker"] = worker.as_dict()
                row["worker_ratio"] = (
                    worker.messages_per_second / max(raw.messages_per_second, 1e-9))
                if batch > 1:
                    # The SQS door's JSON protocol, as boto3 sends the same cycle.
                    fetch_ids(url, "DELETE FROM leaseq.messages WHERE queue_id = $1 RETURNING id",
                              queue_id)
                    sqs = cycle.run("sqs", service.port, cycle.sqs_queue_url(service.port, name),
                                    clients=n, batch=batch, seconds=seconds,
                                    processes=processes, remaining=remaining_rest,
                                    service_cpu=service_cpu, database_cpu=database_cpu,
                                    wal_bytes=wal)
                    row["sqs"] = sqs.as_dict()
                    row["sqs_ratio"] = sqs.messages_per_second / max(raw.messages_per_second,
                                                                     1e-9)
            rows.append(row)
    asyncio.run(minimal.drop(url))
    return rows


_MINIMAL_QUEUE = 1  # the minimal table's queue column in the apart rows


def apart_rows(service: Service, url: str, *, seconds: float, backlogs: list[int],
               processes: int, producers: int = 8, consumers: int = 8) -> list[dict[str, Any]]:
    """A real queue's shape (bench/apart.py): the minimal table, then leaseq's
    REST API, at each backlog, single messages and batches of 10."""
    service_cpu = _service_cpu(service)
    database_cpu = service.database_cpu_seconds
    wal = wal_counter(url)
    asyncio.run(minimal.create(url))
    rows = []
    for backlog in backlogs:
        for batch in (1, 10):
            pair: dict[str, Any] = {"backlog": backlog, "batch": batch}
            asyncio.run(minimal.reset(url))
            prefilled = apart.prefill_minimal(url, _MINIMAL_QUEUE, backlog)
            settle(url, minimal.TABLE)
            pair["minimal"] = apart.run(
                "minimal", url, _MINIMAL_QUEUE, producers=producers, consumers=consumers,
                batch=batch, backlog=backlog, seconds=seconds, processes=processes,
                prefilled=prefilled,
                remaining=lambda: fetch_ids(url, minimal.REMAINING, _MINIMAL_QUEUE),
                service_cpu=service_cpu, database_cpu=database_cpu, wal_bytes=wal)
            asyncio.run(minimal.reset(url))
            name = f"apart-{backlog}-{batch}"
            call(service.port, "POST", "/v1/queues", {"name": name})
            rest_id = find_queue_id(url, name)
            prefilled = apart.prefill_rest(service.port, name, backlog)
            settle(url, "leaseq.messages")
            pair["rest"] = apart.run(
                "rest", service.port, name, producers=producers, consumers=consumers,
                batch=batch, backlog=backlog, seconds=seconds, processes=processes,
                prefilled=prefilled,
                remaining=lambda q=rest_id: fetch_ids(
                    url, "SELECT message_id::text FROM leaseq.messages WHERE queue_id = $1", q),
                service_cpu=service_cpu, database_cpu=database_cpu, wal_bytes=wal)
            fetch_ids(url, "DELETE FROM leaseq.messages WHERE queue_id = $1 RETURNING id", rest_id)
            rows.append(pair)
    asyncio.run(minimal.drop(url))
    return rows


def print_apart(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    first = rows[0]["rest"]
    print(f"a real queue's shape: {first['producers']} producers and {first['consumers']} "
          f"consumers apart (REST consumers long-poll, wait=1), a standing backlog; "
          f"leaseq (REST) against the minimal table (SQL)")
    print(f"{'apart':<24}{'msg/s':>8}{'db us/msg':>11}{'svc us/msg':>12}{'WAL B/msg':>11}"
          f"{'msg/s/db core':>15}{'svc/db cores':>14}{'x min db':>10}{'x min WAL':>11}"
          f"{'lost':>6}{'dup':>5}")
    for pair in rows:
        least = pair["minimal"]
        for kind in ("minimal", "rest"):
            row = pair[kind]
            label = (f"{'leaseq' if kind == 'rest' else 'minimal'} "
                     f"{'single' if row['batch'] == 1 else 'batch 10'}, {row['backlog']:,}")
            db = row["database_us_per_message"] or 0.0
            svc = row["service_us_per_message"] if kind == "rest" else None
            wal = row["wal_bytes_per_message"] or 0.0
            per_core = row["messages_per_second"] / max((row["database_cpu_percent"] or 0) / 100,
                                                        1e-9)
            print(f"{label:<24}{row['messages_per_second']:>8.0f}{db:>11.0f}"
                  f"{'-' if svc is None else f'{svc:.0f}':>12}{wal:>11.0f}{per_core:>15.0f}"
                  f"{'-' if svc is None else f'{svc / max(db, 1e-9):.2f}':>14}"
                  f"{db / max(least['database_us_per_message'] or 0, 1e-9):>10.2f}"
                  f"{wal / max(least['wal_bytes_per_message'] or 0, 1e-9):>11.2f}"
                  f"{row['lost']:>6}{row['duplicated']:>5}")
    print("  (db/svc us/msg: CPU microseconds per message deleted; msg/s/db core: messages a "
          "second per core of PostgreSQL; svc/db cores: service cores per database core; "
          "x min: against the minimal table's row of the same shape; targets 1.25 (db), 1.5 (WAL))")


def fifo_rows(service: Service, url: str, *, seconds: float, processes: int,
              clients: int = 16, batch: int = 10) -> dict[str, Any]:
    """The REST cycle on FIFO queues, 100 groups and one hot group, each as a
    ratio of the standard queue's measured just before them (same clients,
    same batches, fresh queues)."""
    service_cpu = _service_cpu(service)
    database_cpu = service.database_cpu_seconds

    def measure(name: str, groups: int | None) -> dict[str, Any]:
        call(service.port, "POST", "/v1/queues",
             {"name": name, **({} if groups is None else {"fifo": True})})
        queue_id = find_queue_id(url, name)
        result = cycle.run(
            "rest" if groups is None else "fifo", service.port, name, clients=clients,
            batch=batch, seconds=seconds, processes=processes, groups=groups,
            service_cpu=service_cpu, database_cpu=database_cpu,
            remaining=lambda: fetch_ids(
                url, "SELECT message_id::text FROM leaseq.messages WHERE queue_id = $1", queue_id),
        )
        return result.as_dict()

    standard = measure("fifo-bench-standard", None)
    rows = []
    for groups in (100, 1):
        row = measure(f"fifo-bench-{groups}.fifo", groups)
        row["ratio"] = row["messages_per_second"] / max(standard["messages_per_second"], 1e-9)
        rows.append(row)
    return {"clients": clients, "batch": batch, "standard": standard, "rows": rows}


def _grouping(port: int) -> dict[str, tuple[int, int]]:
    """(requests, statements) of each grouped operation, from /metrics."""
    async def go() -> bytes:
        http = await Http.open(port)
        try:
            return (await http.raw("GET", "/metrics"))[1]
        finally:
            http.close()

    found: dict[str, list[int]] = {}
    for line in asyncio.run(go()).decode().splitlines():
        for kind, index in (("leaseq_grouped_requests_total", 0),
                            ("leaseq_grouped_statements_total", 1)):
            if line.startswith(kind + "{"):
                op = line.split('"')[1]
                found.setdefault(op, [0, 0])[index] = int(float(line.split()[-1]))
    return {op: (values[0], values[1]) for op, values in found.items()}


def _service_cpu(service: Service) -> Any:
    return service.cpu_seconds


def heartbeat_rows(service: Service, url: str, *, seconds: float, counts: list[int],
                   processes: int) -> list[dict[str, Any]]:
    rows = []
    service_cpu = _service_cpu(service)
    for count in counts:
        results = {}
        for label in ("without", "with"):
            name = f"hb-cycle-{count}-{label}"
            call(service.port, "POST", "/v1/queues", {"name": name})
            queue_id = find_queue_id(url, name)
            beats = None
            if label == "with":
                beats = Heartbeats(service.port, count)
                beats.prepare()
                beats.start()
            result = cycle.run(
                "rest", service.port, name, clients=16, batch=10, seconds=seconds,
                processes=processes, service_cpu=service_cpu,
                remaining=lambda q=queue_id: fetch_ids(
                    url, "SELECT message_id::text FROM leaseq.messages WHERE queue_id = $1", q),
            )
            entry = result.as_dict()
            if beats is not None:
                beats.stop()
                entry["heartbeats_per_second"] = beats.beats / seconds
                entry["heartbeats_failed"] = beats.failed
                call(service.port, "POST", "/v1/queues/heartbeats/purge")
            results[label] = entry
        rows.append({"leases": count, **results,
                     "cost": 1 - results["with"]["messages_per_second"]
                     / max(results["without"]["messages_per_second"], 1e-9)})
    return rows


def print_table(report: dict[str, Any]) -> None:
    print(f"\nleaseq benchmark ({os.cpu_count()} cores, {report['database']}, "
          f"{report['workers']} service worker(s), "
          f"{report['seconds']:.0f} s a row, generators in {report['processes']} processes)")
    print(f"{'cycle':<22}{'raw msg/s':>11}{'rest msg/s':>12}{'rest/raw':>10}"
          f"{'lost':>6}{'dup':>5}{'claim p99':>11}{'delete p99':>12}"
          f"{'gen CPU':>9}{'svc CPU':>9}")
    for row in report["cycle"]:
        raw, rest = row["raw"], row["rest"]
        label = f"{'single' if raw['batch'] == 1 else 'batch 10'}, {raw['clients']:>2} clients"
        print(f"{label:<22}{raw['messages_per_second']:>11.0f}{rest['messages_per_second']:>12.0f}"
              f"{row['ratio']:>10.2f}{raw['lost'] + rest['lost']:>6}"
              f"{raw['duplicated'] + rest['duplicated']:>5}"
              f"{rest['claim_p99_ms']:>9.1f}ms{rest['delete_p99_ms']:>10.1f}ms"
              f"{rest['generator_cpu_percent']:>8.0f}%{rest['service_cpu_percent'] or 0:>8.0f}%")
    for row in report["cycle"]:
        worker = row.get("worker")
        if worker is None:
            continue
        label = (f"{'single' if worker['batch'] == 1 else 'batch 10'}, "
                 f"{worker['clients']:>2}, acks ride")
        print(f"{label:<22}{row['raw']['messages_per_second']:>11.0f}"
              f"{worker['messages_per_second']:>12.0f}{row['worker_ratio']:>10.2f}"
              f"{worker['lost']:>6}{worker['duplicated']:>5}"
              f"{worker['claim_p99_ms']:>9.1f}ms{'-':>12}"
              f"{worker['generator_cpu_percent']:>8.0f}%"
              f"{worker['service_cpu_percent'] or 0:>8.0f}%")
    for row in report["cycle"]:
        sqs = row.get("sqs")
        if sqs is None:
            continue
        label = f"batch 10, {sqs['clients']:>2}, SQS JSON"
        print(f"{label:<22}{row['raw']['messages_per_second']:>11.0f}"
              f"{sqs['messages_per_second']:>12.0f}{row['sqs_ratio']:>10.2f}"
              f"{sqs['lost']:>6}{sqs['duplicated']:>5}"
              f"{sqs['claim_p99_ms']:>9.1f}ms{sqs['delete_p99_ms']:>10.1f}ms"
              f"{sqs['generator_cpu_percent']:>8.0f}%{sqs['service_cpu_percent'] or 0:>8.0f}%")
    print("  (lost/dup: raw + rest; latencies and CPU: the rest row; raw gen CPU per row in JSON;"
          " 'acks ride': send, then receive carrying the last round's acknowledgements;"
          " its claim p99 is that receive's)")
    print("  service CPU per message: " + ", ".join(
        f"{'single' if row['rest']['batch'] == 1 else 'batch 10'} x{row['rest']['clients']} "
        f"{_cpu_per_message(row['rest']):.0f} us"
        + (f" ({_cpu_per_message(row['worker']):.0f} us acks ride)" if "worker" in row else "")
        + (f" ({_cpu_per_message(row['sqs']):.0f} us SQS JSON)" if "sqs" in row else "")
        for row in report["cycle"]))
    print("  CPU per message at 16 clients, service + database + generators (us): " + "; ".join(
        f"{'single' if row['rest']['batch'] == 1 else 'batch 10'} "
        + ", ".join(f"{kind} {_split(row[kind])}" for kind in ("raw", "rest", "worker", "sqs")
                    if kind in row)
        for row in report["cycle"] if row["rest"]["clients"] == 16))
    for row in report["cycle"]:
        grouping = row["rest"].get("requests_per_statement")
        if grouping and row["rest"]["clients"] == 16:
            print(f"  group commit, {'single' if row['rest']['batch'] == 1 else 'batch 10'}, "
                  f"16 clients: requests per statement: "
                  + ", ".join(f"{op} {value:.1f}" for op, value in grouping.items()))
    print_database(report["cycle"])
    print_apart(report["apart"])
    print_fifo(report["fifo"])
    bare = report.get("bare_floor")
    if bare is not None:
        print(f"uvicorn floor: a bare ASGI app, {bare['clients']} clients: "
              f"{bare['requests_per_second']:.0f} requests/s at {bare['service_cpu_percent']:.0f}% "
              f"of a core: {_us_per_request(bare):.0f} us of the server's CPU a request")
    floor = report["floor"]
    print(f"HTTP floor: GET /healthz (no database), {floor['clients']} clients: "
          f"{floor['requests_per_second']:.0f} requests/s, service CPU "
          f"{floor['service_cpu_percent']:.0f}%, generators {floor['generator_cpu_percent']:.0f}% "
          f"-> a single-message cycle (3 requests) cannot pass "
          f"{floor['requests_per_second'] / 3:.0f} msg/s here")
    for row in report["heartbeats"]:
        with_, without = row["with"], row["without"]
        print(f"heartbeats: {row['leases']} leases, {with_.get('heartbeats_per_second', 0):.0f} "
              f"beats/s: cycle {without['messages_per_second']:.0f} -> "
              f"{with_['messages_per_second']:.0f} msg/s (cost {row['cost'] * 100:.0f}%), "
              f"claim p99 {without['claim_p99_ms']:.1f} -> {with_['claim_p99_ms']:.1f} ms, "
              f"delete p99 {without['delete_p99_ms']:.1f} -> {with_['delete_p99_ms']:.1f} ms, "
              f"lost {with_['lost']}, beats failed {with_.get('heartbeats_failed', 0)}")
    print(heartbeat_capacity.summary(report["heartbeat_capacity"]))
    latency = report["long_poll"]
    if latency is None:
        print("send -> receive through a long poll: not measured with several workers (it "
              "reads the waiting receivers of one process from /metrics)")
    else:
        print(f"send -> receive through a long poll: p50 {latency['p50_ms']:.2f} ms, "
              f"p99 {latency['p99_ms']:.2f} ms (n={latency['n']})")
    transactional.print_rows(report["transactional"])
    print(f"service RSS ({report['workers']} worker(s); with several, summed with uvicorn's "
          f"supervisor and multiprocessing's helper): idle "
          f"{report['rss_idle_mb']:.0f} MB, peak over the run {report['rss_peak_mb']:.0f} MB")


def print_database(cycle_rows: list[dict[str, Any]]) -> None:
    """The lockstep rows at 16 clients as the database sees them."""
    print("  PostgreSQL per message at 16 clients, lockstep (CPU us, WAL bytes; "
          "x minimal, x raw on leaseq's table: target 0.8): " + "; ".join(
              f"{'single' if row['rest']['batch'] == 1 else 'batch 10'} " + ", ".join(
                  f"{kind} {_database_us(row[kind]):.0f} us "
                  f"{row[kind].get('wal_bytes_per_message') or 0:.0f} B"
                  + ("" if kind in ("minimal", "raw") else
                     f" ({_database_us(row[kind]) / max(_database_us(row['minimal']), 1e-9):.2f}"
                     f" x min, "
                     f"{_database_us(row[kind]) / max(_database_us(row['raw']), 1e-9):.2f} x raw)")
                  for kind in ("minimal", "raw", "rest", "worker", "sqs") if kind in row)
              for row in cycle_rows if row["rest"]["clients"] == 16))
    print("  per database core at 16 clients, lockstep (msg/s per core of PostgreSQL, service "
          "cores per database core): " + "; ".join(
              f"{'single' if row['rest']['batch'] == 1 else 'batch 10'} " + ", ".join(
                  f"{kind} {_per_core(row[kind])}"
                  for kind in ("minimal", "raw", "rest", "worker", "sqs") if kind in row)
              for row in cycle_rows if row["rest"]["clients"] == 16))


def _per_core(result: dict[str, Any]) -> str:
    database = float(result.get("database_cpu_percent") or 0.0) / 100
    service = float(result.get("service_cpu_percent") or 0.0) / 100
    rate = float(result["messages_per_second"]) / max(database, 1e-9)
    return f"{rate:.0f}" + (f" ({service / max(database, 1e-9):.2f})" if service > 0.01 else "")


def _database_us(result: dict[str, Any]) -> float:
    rate = max(float(result["messages_per_second"]), 1e-9)
    return 1e4 * float(result.get("database_cpu_percent") or 0.0) / rate


def print_fifo(fifo: dict[str, Any]) -> None:
    print(f"FIFO queues, batch {fifo['batch']}, {fifo['clients']} clients, against the standard "
          "queue's REST cycle measured just before them (target for 100 groups: >= 0.50)")
    print(f"{'fifo cycle':<22}{'msg/s':>8}{'/standard':>11}{'lost':>6}{'dup':>5}"
          f"{'empty rcv':>11}{'msg/rcv':>9}{'claim p99':>11}{'delete p99':>12}{'gen CPU':>9}"
          f"{'svc CPU':>9}{'db CPU':>8}")
    standard = fifo["standard"]
    for label, row, ratio in [
        ("standard queue", standard, 1.0),
        *((f"FIFO, {row['groups']} groups" if row["groups"] > 1 else "FIFO, 1 hot group",
           row, row["ratio"]) for row in fifo["rows"]),
    ]:
        print(f"{label:<22}{row['messages_per_second']:>8.0f}{ratio:>11.2f}{row['lost']:>6}"
              f"{row['duplicated']:>5}"
              f"{100 * row['empty_receives'] / max(row['receives'], 1):>10.0f}%"
              f"{row['claimed'] / max(row['receives'], 1):>9.1f}"
              f"{row['claim_p99_ms']:>9.1f}ms{row['delete_p99_ms']:>10.1f}ms"
              f"{row['generator_cpu_percent']:>8.0f}%{row['service_cpu_percent'] or 0:>8.0f}%"
              f"{row['database_cpu_percent'] or 0:>7.0f}%")
    print("  (empty rcv: the receives that found nothing to claim; on a FIFO queue nothing "
          "more of a group is handed out while a batch of it is in flight; msg/rcv: messages "
          "a receive took, on average)")


def _us_per_request(floor: dict[str, Any]) -> float:
    rate: float = floor["requests_per_second"]
    percent: float = floor["service_cpu_percent"]
    return 1e4 * percent / max(rate, 1e-9)


def _split(result: dict[str, Any]) -> str:
    """A row's CPU per message: the service's, PostgreSQL's, the generators'."""
    rate = max(result["messages_per_second"], 1e-9)
    parts = [result.get(f"{who}_cpu_percent") or 0.0
             for who in ("service", "database", "generator")]
    return " + ".join(f"{1e4 * percent / rate:.0f}" for percent in parts)


def _cpu_per_message(result: dict[str, Any]) -> float:
    """The service's CPU microseconds per message of a row."""
    percent: float = result["service_cpu_percent"] or 0.0
    rate: float = result["messages_per_second"]
    return 1e6 * percent / 100 / max(rate, 1e-9)


def fifo_only(quick: bool, workers: int | None) -> dict[str, Any]:
    """Only the FIFO rows (and the standard row they are compared with)."""
    seconds = 1.5 if quick else 8.0
    with running_service(workers=workers) as service:
        wait_settled(service)
        report: dict[str, Any] = {
            "when": datetime.now().isoformat(timespec="seconds"),
            "quick": quick,
            "database": "DATABASE_URL" if os.environ.get("DATABASE_URL") else "embedded",
            "seconds": seconds,
            "processes": 2,
            "workers": service.workers,
        }
        report["fifo"] = fifo_rows(service, database_url(service), seconds=seconds,
                                   processes=2)
    return report


def main(quick: bool, workers: int | None) -> dict[str, Any]:
    seconds = 1.5 if quick else 8.0
    # Quick: the rows the comparisons are made at (16 clients), within a minute.
    clients = [16] if quick else [1, 4, 16]
    counts = [1000] if quick else [1000, 10000]
    processes = 2
    with running_service(workers=workers) as service:
        url = database_url(service)
        report: dict[str, Any] = {
            "when": datetime.now().isoformat(timespec="seconds"),
            "quick": quick,
            "database": "DATABASE_URL" if os.environ.get("DATABASE_URL") else "embedded",
            "seconds": seconds,
            "processes": processes,
            "workers": service.workers,
        }
        wait_settled(service)
        report["rss_idle_mb"] = service.rss_bytes() / 2**20
        report["floor"] = cycle.floor(service.port, clients=16, seconds=seconds,
                                      processes=processes, service_cpu=service.cpu_seconds)
        report["bare_floor"] = bare_floor(seconds=seconds, processes=processes)
        report["cycle"] = cycle_rows(service, url, seconds=seconds, clients=clients,
                                     processes=processes)
        report["apart"] = apart_rows(service, url, seconds=seconds,
                                     backlogs=[1000] if quick else [1000, 100_000],
                                     processes=processes)
        report["fifo"] = fifo_rows(service, url, seconds=seconds, processes=processes)
        report["heartbeats"] = heartbeat_rows(service, url, seconds=seconds, counts=counts,
                                              processes=processes)
        report["heartbeat_capacity"] = heartbeat_capacity.measure(
            service, url, leases=2000 if quick else 10000, seconds=seconds,
            processes=processes)
        report["transactional"] = transactional.measure(
            service, url, seconds=seconds, processes=processes, rounds=50 if quick else 200)
        report["long_poll"] = None
        if report["workers"] == 1:
            times = asyncio.run(
                send_to_receive(service.port, "latency", 1, 100 if quick else 500))
            report["long_poll"] = {"p50_ms": percentile(times, 50) * 1000,
                                   "p99_ms": percentile(times, 99) * 1000, "n": len(times)}
        report["rss_peak_mb"] = service.rss_bytes(peak=True) / 2**20
    return report


def bare_floor(*, seconds: float, processes: int) -> dict[str, float]:
    """GET /healthz's floor measured on bench/bare_asgi.py under uvicorn (httptools,
    uvloop, as `leaseq serve` runs): the HTTP server's own cost per request."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.bare_asgi", str(port)],
        cwd=Path(__file__).parent.parent, stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the bare ASGI server did not start") from None
                time.sleep(0.1)
        measured = psutil.Process(proc.pid)

        def cpu() -> float:
            times = measured.cpu_times()
            return float(times.user + times.system)

        return cycle.floor(port, clients=16, seconds=seconds, processes=processes,
                           service_cpu=cpu)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def cli() -> None:
    parser = argparse.ArgumentParser(description="leaseq benchmark suite")
    parser.add_argument("--quick", action="store_true", help="a smoke run (under a minute)")
    parser.add_argument("--output", type=Path, help="where to write the JSON results")
    parser.add_argument("--workers", type=int, default=None,
                        help="uvicorn workers of the service (default: leaseq serve's own)")
    parser.add_argument("--fifo-only", action="store_true",
                        help="only the FIFO rows and the standard row they are compared with")
    parser.add_argument("--history", action="store_true",
                        help="also the rows of bench/history.py (held horizon, tenants, "
                        "backlog): over two hours, about 9 minutes with --quick")
    args = parser.parse_args()
    if args.fifo_only:
        report = fifo_only(args.quick, args.workers)
        print(f"\nleaseq benchmark, FIFO rows ({os.cpu_count()} cores, {report['database']}, "
              f"{report['workers']} service worker(s), {report['seconds']:.0f} s a row)")
        print_fifo(report["fifo"])
    else:
        report = main(args.quick, args.workers)
        print_table(report)
    if args.history:
        report["history"] = history.measure(quick=args.quick)
        history.print_report(report["history"])
    path = args.output or RESULTS / f"bench-{datetime.now():%Y%m%d-%H%M%S}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    cli()
