"""History's cost to the message cycle: a held horizon, many tenants, a backlog.

Issue 44's rows:

    python -m bench.history [--quick] [--minutes 5,30] [--only horizon|dump|tenants|backlog]
                            [--batch 1|10] [--leaseq-only] [--fair TENANTS | --fifo GROUPS]
    python -m bench --history     (the same rows after the default suite)

Starts `leaseq serve` as the other benchmarks do (embedded PostgreSQL unless
DATABASE_URL is set) and measures:

- horizon: producers and consumers apart as bench/apart.py runs them (8
  producers, 8 consumers, 1,000 messages standing, single messages and
  batches of 10) through the REST API, first a clean window, then with one
  connection sitting in `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1`
  (bench/_horizon.py) for the longest of --minutes, measured in windows of a
  minute (bench/_held.py): messages per second, PostgreSQL's and the
  service's CPU per message, dead row versions in leaseq.messages (and the
  whole leaseq schema), each against the same run's clean window; then the
  minimal queue table (bench/minimal.py) held the same way, the database's
  floor. Each minute mark of --minutes is the window nearest it (one run,
  not one run a mark). Lost and duplicated must be 0. With --fair T (--fifo
  G), leaseq's rows run on a fair queue, its messages naming T tenants in
  turn (a FIFO queue, G message groups, each message with a deduplication
  id of its own), not paired with the minimal table.
- dump: the REST rows again while `pg_dump` of the database runs for the
  shortest of --minutes: a table of 200,000 rows is added so that the dump
  has something to write, and its output is read at the pace that makes it
  last that long (a dump to a slow destination; a full-speed dump of this
  database is timed first). Skipped, saying why, without a pg_dump of the
  server's version or later.
- tenants: a fair queue holding 200,000 messages of 10 / 1,000 / 20,000 /
  100,000 tenants, one client receiving and deleting one message at a time
  (bench/_standing.py): latency p50/p99, PostgreSQL's CPU per message, each
  against 10 tenants.
- backlog: a standard queue with 1,000 and 1,000,000 messages standing, the
  same client, against 1,000.

It lasts: horizon 4 runs of (a clean minute + the longest of --minutes), about
2 h 5 min with the default 5,30; dump 2 runs of (1 + the shortest), 12 min;
tenants and backlog a few minutes: about 2 h 20 min in all. --quick: --minutes
1 with windows of 15 s, 40,000 messages of 10 / 1,000 / 20,000 tenants,
backlogs of 1,000 and 100,000, 2 s a standing row: about 9 minutes. Results
are printed and written to bench/results/history-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import _held, _horizon, _standing, apart, minimal
from bench._harness import Service, running_service, wait_settled
from bench.longpoll import database_url

RESULTS = Path(__file__).parent / "results"
SECTIONS = ("horizon", "dump", "tenants", "backlog")
BATCHES = (1, 10)
KINDS = ("rest", "minimal")


def _window(held_seconds: float, quick: bool) -> float:
    return min(15.0 if quick else 60.0, max(held_seconds / 4, 1.0))


def horizon(service: Service, url: str, *, minutes: list[float], quick: bool,
            batches: tuple[int, ...] = BATCHES, kinds: tuple[str, ...] = KINDS,
            spread: apart.Spread | None = None) -> dict[str, Any]:
    held = max(minutes) * 60
    runs = [_held.run(service, url, _held.Plan(kind, batch, "transaction", held,
                                               _window(held, quick),
                                               spread=spread if kind == "rest" else None))
            for batch in batches for kind in kinds]
    if "minimal" in kinds:
        asyncio.run(minimal.drop(url))
    return {"marks_minutes": minutes, "runs": runs}


def dump(service: Service, url: str, *, minutes: list[float], quick: bool,
         batches: tuple[int, ...] = BATCHES) -> dict[str, Any]:
    binary, version = _horizon.pg_dump_binary(url)
    if binary is None:
        return {"skipped": version}
    held = min(minutes) * 60
    _horizon.pad(url, _horizon.PADDING_ROWS)
    try:
        full = _horizon.full_dump(binary, url)
        runs = [_held.run(service, url, _held.Plan("rest", batch, "pg_dump", held,
                                                   _window(held, quick)),
                          dump=(binary, full["bytes"]))
                for batch in batches]
    finally:
        _horizon.unpad(url)
    return {"marks_minutes": [min(minutes)], "pg_dump": version, "full_dump": full,
            "padding_rows": _horizon.PADDING_ROWS, "runs": runs}


def measure(*, quick: bool, minutes: list[float] | None = None, only: str | None = None,
            batches: tuple[int, ...] = BATCHES, kinds: tuple[str, ...] = KINDS,
            spread: apart.Spread | None = None) -> dict[str, Any]:
    minutes = minutes or ([1.0] if quick else [5.0, 30.0])
    sections = [only] if only else list(SECTIONS)
    seconds = 2.0 if quick else 10.0
    tenants: list[int | None] = [10, 1000, 20_000] if quick else [10, 1000, 20_000, 100_000]
    per_tenant_row = 40_000 if quick else 200_000
    backlogs = [1000, 100_000] if quick else [1000, 1_000_000]
    with running_service() as service:
        wait_settled(service)
        url = database_url(service)
        report: dict[str, Any] = {
            "when": datetime.now().isoformat(timespec="seconds"), "quick": quick,
            "database": "DATABASE_URL" if os.environ.get("DATABASE_URL") else "embedded",
            "server_version": _horizon.server_major(url), "minutes": minutes,
        }
        if "horizon" in sections:
            report["horizon"] = horizon(service, url, minutes=minutes, quick=quick,
                                        batches=batches, kinds=kinds, spread=spread)
        if "dump" in sections:
            report["dump"] = dump(service, url, minutes=minutes, quick=quick, batches=batches)
        if "tenants" in sections:
            report["tenants"] = _standing.rows(
                service, url, counts=[per_tenant_row] * len(tenants),
                tenants=tenants, seconds=seconds)
        if "backlog" in sections:
            report["backlog"] = _standing.rows(
                service, url, counts=backlogs, tenants=[None] * len(backlogs), seconds=seconds)
        report["rss_peak_mb"] = service.rss_bytes(peak=True) / 2**20
    return report


# -- printing --------------------------------------------------------------------


def _k(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k" if n >= 1e4 else str(n)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _held_for(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def print_held(section: dict[str, Any], title: str) -> None:
    runs = section["runs"]
    print(f"\n{title}")
    print(f"{'held':<30}{'msg/s':>7}{'x clean':>8}{'db us/msg':>10}{'x clean':>8}"
          f"{'svc us/msg':>11}{'x clean':>8}{'x min db':>9}{'dead rows':>10}"
          f"{'dead leaseq':>12}{'xmin age':>9}{'lost':>6}{'dup':>5}{'epoch':>6}{'machine':>8}")
    floors = {run["batch"]: run for run in runs if run["kind"] == "minimal"}
    for run in runs:
        # The minimal table has no tenants nor groups: a fair or FIFO row is
        # not paired with it.
        floor = (floors.get(run["batch"]) if run["kind"] == "rest" and not run.get("spread")
                 else None)
        what = "minimal" if run["kind"] != "rest" else run.get("spread") or "leaseq"
        name = f"{what} {'single' if run['batch'] == 1 else 'batch 10'}"
        entries = [("clean", run["clean"], None if floor is None else floor["clean"])]
        for i in _held.shown(run["windows"], section["marks_minutes"]):
            window = run["windows"][i]
            paired = (floor["windows"][i] if floor is not None and i < len(floor["windows"])
                      else None)
            entries.append((_held_for(window["held_seconds"]), window, paired))
        own = 1.0 if run["kind"] == "rest" else None  # the clean row against itself
        for label, row, least in entries:
            against = (None if least is None or not least["database_us_per_message"]
                       else row["database_us_per_message"] / least["database_us_per_message"])
            print(f"{name + ', ' + label:<30}{row['messages_per_second']:>7.0f}"
                  f"{_x(row.get('rate_x_clean', 1.0)):>8}"
                  f"{_us(row['database_us_per_message']):>10}"
                  f"{_x(row.get('database_us_x_clean', 1.0)):>8}"
                  f"{_us(row['service_us_per_message']):>11}"
                  f"{_x(row.get('service_us_x_clean', own)):>8}"
                  f"{_x(against):>9}{_k(row['dead_rows']):>10}"
                  f"{_k(row['dead_rows_leaseq']) if run['kind'] == 'rest' else '-':>12}"
                  f"{_k(row.get('holder_age_xids')):>9}{row['lost']:>6}{row['duplicated']:>5}"
                  f"{row.get('epoch', '-'):>6}{_x(row.get('canary_x_clean', 1.0)):>8}")
        for label, row, _ in (entries[0], entries[-1]):
            roles = row.get("database_us_by_role")
            if roles:
                spent = ", ".join(f"{role} {us:.0f}" for role, us in list(roles.items())[:5])
                print(f"  {name + ', ' + label}: PostgreSQL us/msg by process: {spent}")
        holder = run["holder"]
        if not holder["held_to_end"] or holder.get("error"):
            print(f"  (!) {name}: the {holder['holder']} did not hold to the end: {holder}")
    print("  (us/msg: CPU microseconds per message deleted; x clean: against the same run's "
          "clean window; x min db: against the minimal table's window of the same time; dead "
          "rows: n_dead_tup of the queue's table, and of every leaseq table; xmin age: "
          "transactions the horizon is held back by; epoch: the rotation's at the window's end, "
          "two more a rotation; machine: the time this process took to hash 64 MiB before the "
          "window, against the clean window's: above 1, the shared machine was slower)")


def print_standing(rows: list[dict[str, Any]], title: str, tenants: bool) -> None:
    print(f"\n{title}")
    print(f"{'tenants' if tenants else 'standing':>9}{'cycles/s':>9}{'receive p50':>12}"
          f"{'p99':>10}{'cycle p50':>12}{'p99':>10}{'x first':>8}{'db us/msg':>10}"
          f"{'x first':>8}{'svc us/msg':>11}{'idle db':>8}{'lost':>6}{'dup':>5}")
    for row in rows:
        print(f"{row['tenants'] if tenants else row['messages']:>9,}"
              f"{row['cycles_per_second']:>9.1f}{row['receive_p50_ms']:>10.2f}ms"
              f"{row['receive_p99_ms']:>8.1f}ms{row['cycle_p50_ms']:>10.2f}ms"
              f"{row['cycle_p99_ms']:>8.1f}ms{row['cycle_p50_ms_x_first']:>8.2f}"
              f"{row['database_us_per_message']:>10.0f}"
              f"{row['database_us_per_message_x_first']:>8.2f}"
              f"{row['service_us_per_message']:>11.0f}"
              f"{row['idle_database_cpu_percent']:>7.0f}%{row['lost']:>6}{row['duplicated']:>5}")
    print("  (one client: receive one message (wait=0), then delete it; x first: the cycle's "
          "p50 and PostgreSQL's CPU per message against the first row; idle db: PostgreSQL's "
          "CPU while the filled queue sat idle, before the row)")


def print_report(report: dict[str, Any]) -> None:
    print(f"\nleaseq history benchmark ({os.cpu_count()} cores, {report['database']}, "
          f"PostgreSQL {report['server_version']})")
    if "horizon" in report:
        run = report["horizon"]["runs"][0]
        print_held(report["horizon"], (
            f"held horizon: {run['producers']} producers and {run['consumers']} consumers "
            f"apart, {run['backlog']:,} standing; one REPEATABLE READ transaction held for "
            f"{run['held_seconds'] / 60:.1f} min, windows of {run['window_seconds']:.0f} s"))
    if "dump" in report:
        found = report["dump"]
        if "skipped" in found:
            print(f"\npg_dump rows skipped: {found['skipped']}")
        else:
            run, full = found["runs"][0], found["full_dump"]
            print_held(found, (
                f"while pg_dump runs ({found['pg_dump']}): a full dump takes "
                f"{full['seconds']:.1f} s for {full['bytes'] / 2**20:.0f} MB; here its output "
                f"is read to last {run['held_seconds'] / 60:.1f} min"))
    if "tenants" in report:
        rows = report["tenants"]
        print_standing(rows, f"fair tenants: a fair queue of {rows[0]['messages']:,} messages "
                       "standing, spread over its tenants", tenants=True)
    if "backlog" in report:
        print_standing(report["backlog"], "backlog: a standard queue, messages standing",
                       tenants=False)
    print(f"service RSS peak over the run: {report['rss_peak_mb']:.0f} MB")


def write(report: dict[str, Any], path: Path | None) -> Path:
    path = path or RESULTS / f"history-{datetime.now():%Y%m%d-%H%M%S}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    return path


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 1 minute held, small tenant and backlog rows")
    parser.add_argument("--minutes", type=lambda text: [float(m) for m in text.split(",")],
                        help="minutes the horizon is held, marks to report (default 5,30; "
                        "--quick: 1)")
    parser.add_argument("--only", choices=SECTIONS, help="one section only")
    parser.add_argument("--batch", type=int, choices=BATCHES, action="append",
                        help="the held rows of this batch size only (repeatable)")
    parser.add_argument("--leaseq-only", action="store_true",
                        help="held horizon: leaseq's rows without the minimal table's")
    apart.add_spread_options(parser, "held horizon: leaseq's rows")
    parser.add_argument("--output", type=Path, help="write the JSON report here")
    args = parser.parse_args()
    report = measure(quick=args.quick, minutes=args.minutes, only=args.only,
                     batches=tuple(args.batch or BATCHES),
                     kinds=("rest",) if args.leaseq_only else KINDS,
                     spread=apart.spread_of(args))
    print_report(report)
    print(f"written to {write(report, args.output)}")


if __name__ == "__main__":
    cli()
