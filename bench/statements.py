"""Where PostgreSQL's time goes under a real queue's load: `python -m bench.statements`.

Starts an embedded PostgreSQL of its own with `pg_stat_statements` loaded,
`leaseq serve` on it (DATABASE_URL), and the apart load of bench/apart.py
(producers and consumers apart, 1,000 messages standing), single messages and
batches of 10, and the same load on the minimal table (bench/minimal.py); with
`--kinds lockstep fifo`, the lockstep REST cycle of `python -m bench` on a standard
queue and on a FIFO queue of 100 groups; with `--held MINUTES`, the apart load on
one queue (`--fifo GROUPS` or `--fair TENANTS` for a FIFO or fair queue) in windows,
a clean one and then one after another while a REPEATABLE READ transaction holds
the cleanup horizon (bench/_horizon.py; with `--dump`, a pg_dump of the database
paced to last that long), to see which statement's cost grows with the history a
held horizon keeps. For each it prints, per message deleted:
every statement's calls, execution time, rows, WAL bytes and buffers; the rows
inserted, updated (and how many of those were HOT), deleted and left dead in each
table; and the PostgreSQL CPU and WAL in all.
docs/performance.md reads its output.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from app.db.embedded import EmbeddedPostgres, remove
from bench import apart, cycle, minimal
from bench._harness import (
    call,
    cpu_by_role,
    execute,
    fetch_ids,
    find_queue_id,
    postmaster_cpu_seconds,
    running_service,
    settle,
    wal_counter,
)
from bench._horizon import (
    PADDING_ROWS,
    Holder,
    SlowDump,
    full_dump,
    pad,
    pg_dump_binary,
    unpad,
)

_STATEMENTS = """
SELECT queryid, calls, total_exec_time, total_plan_time, rows, wal_bytes,
       shared_blks_hit + shared_blks_read AS blocks, query
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
_REMAINING = "SELECT message_id::text FROM leaseq.messages WHERE queue_id = $1"
_EMPTY = "DELETE FROM leaseq.messages WHERE queue_id = $1 RETURNING id"
_TABLES = """
SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_dead_tup
FROM pg_stat_user_tables
"""


def _postgres_cpu(server: EmbeddedPostgres) -> float:
    pid = server.postmaster_pid()
    return 0.0 if pid is None else postmaster_cpu_seconds(psutil.Process(pid))


def _cpu_by_role(server: EmbeddedPostgres, url: str) -> dict[str, float]:
    pid = server.postmaster_pid()
    assert pid is not None
    return cpu_by_role(psutil.Process(pid), url)


async def _rows(url: str, sql: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


_CTE = re.compile(r"\b(\w+) AS (?:NOT )?(?:MATERIALIZED )?\(", re.IGNORECASE)


def _one_line(query: str, width: int = 90) -> str:
    """The statement on one line; one made of CTEs told by their names (most of
    leaseq's begin alike, `WITH written AS MATERIALIZED`)."""
    text = " ".join(query.split())
    if text.upper().startswith("WITH "):
        text = "WITH " + ", ".join(dict.fromkeys(_CTE.findall(text)))
    return text if len(text) <= width else text[: width - 1] + "…"


def measure(kind: str, url: str, server: EmbeddedPostgres, port: int, batch: int,
            seconds: float, backlog: int, groups: int = 100) -> dict[str, Any]:
    """One row: the apart load on leaseq's REST API (`rest`) or the minimal
    table in SQL (`minimal`); or the lockstep REST cycle on a standard queue
    (`lockstep`) or a FIFO queue of `groups` groups (`fifo`), as `python -m
    bench` runs them."""
    if kind in ("lockstep", "fifo"):
        return _measure_cycle(kind, url, server, port, batch, seconds, groups)
    if kind == "rest":
        name: Any = f"where-{batch}"
        call(port, "POST", "/v1/queues", {"name": name})
        queue_id = find_queue_id(url, name)
        prefilled = apart.prefill_rest(port, name, backlog)
        target: Any = port
        table, remaining = "leaseq.messages", _REMAINING
    else:
        asyncio.run(minimal.create(url))
        name = queue_id = 1
        prefilled = apart.prefill_minimal(url, queue_id, backlog)
        target, table, remaining = url, minimal.TABLE, minimal.REMAINING
    settle(url, table, "SELECT pg_stat_statements_reset()")
    tables_before = {r["relname"]: r for r in asyncio.run(_rows(url, _TABLES))}
    roles_before = _cpu_by_role(server, url)
    row = apart.run(kind, target, name, producers=8, consumers=8, batch=batch,
                    backlog=backlog, seconds=seconds, processes=2, prefilled=prefilled,
                    remaining=lambda: fetch_ids(url, remaining, queue_id),
                    database_cpu=lambda: _postgres_cpu(server), wal_bytes=wal_counter(url))
    roles_after = _cpu_by_role(server, url)
    statements = asyncio.run(_rows(url, _STATEMENTS))
    tables_after = asyncio.run(_rows(url, _TABLES))
    if kind == "rest":
        fetch_ids(url, _EMPTY, queue_id)
    else:
        asyncio.run(minimal.drop(url))
    return _result(kind, batch, seconds, row, statements, tables_before, tables_after,
                   roles_before, roles_after)


def _measure_cycle(kind: str, url: str, server: EmbeddedPostgres, port: int, batch: int,
                   seconds: float, groups: int) -> dict[str, Any]:
    fifo = kind == "fifo"
    name = f"where-{kind}-{batch}" + (".fifo" if fifo else "")
    call(port, "POST", "/v1/queues", {"name": name, **({"fifo": True} if fifo else {})})
    queue_id = find_queue_id(url, name)
    settle(url, "leaseq.messages", "SELECT pg_stat_statements_reset()")
    tables_before = {r["relname"]: r for r in asyncio.run(_rows(url, _TABLES))}
    roles_before = _cpu_by_role(server, url)
    result = cycle.run("fifo" if fifo else "rest", port, name, clients=16, batch=batch,
                       seconds=seconds, processes=2, groups=groups if fifo else None,
                       remaining=lambda: fetch_ids(url, _REMAINING, queue_id),
                       database_cpu=lambda: _postgres_cpu(server),
                       wal_bytes=wal_counter(url))
    roles_after = _cpu_by_role(server, url)
    statements = asyncio.run(_rows(url, _STATEMENTS))
    tables_after = asyncio.run(_rows(url, _TABLES))
    fetch_ids(url, _EMPTY, queue_id)
    rate = max(result.messages_per_second, 1e-9)
    row = {"messages_per_second": rate, "lost": result.lost,
           "database_us_per_message": 1e4 * (result.database_cpu_percent or 0.0) / rate,
           "wal_bytes_per_message": result.wal_bytes_per_message or 0.0,
           "groups": groups if fifo else None}
    return _result(kind, batch, seconds, row, statements, tables_before, tables_after,
                   roles_before, roles_after)


def _holder(url: str, minutes: float, window: float, dump: bool) -> Holder | SlowDump:
    """What holds the horizon: an idle REPEATABLE READ transaction, or a pg_dump
    of the database read at the pace that makes it last the held minutes (as
    bench.history's dump rows), whose locks also keep the generations it found."""
    if not dump:
        holder = Holder(url)
        holder.start()
        return holder
    binary, version = pg_dump_binary(url)
    if binary is None:
        raise SystemExit(version)
    pad(url, PADDING_ROWS)
    return SlowDump.outlasting(binary, url, size=full_dump(binary, url)["bytes"],
                               held=minutes * 60, window=window)


def measure_held(url: str, server: EmbeddedPostgres, port: int, batch: int, window: float,
                 minutes: float, backlog: int, spread: apart.Spread | None,
                 dump: bool = False) -> None:
    """The apart load on one queue, window after window: the first clean, the
    rest while a Holder (or a paced pg_dump) holds the horizon; each window's
    statements printed."""
    fifo = spread is not None and spread.fifo
    name = f"held-{batch}" + (".fifo" if fifo else "")
    call(port, "POST", "/v1/queues", {"name": name, **({"fifo": True} if fifo else {})})
    queue_id = find_queue_id(url, name)
    standing = apart.prefill_rest(port, name, backlog, spread)
    settle(url, "leaseq.messages")
    holder: Holder | SlowDump | None = None
    began = 0.0
    try:
        while holder is None or time.monotonic() - began < minutes * 60:
            if len(standing) < backlog:
                standing |= apart.prefill_rest(port, name, backlog - len(standing), spread)
            asyncio.run(execute(url, "SELECT pg_stat_statements_reset()"))
            tables_before = {r["relname"]: r for r in asyncio.run(_rows(url, _TABLES))}
            roles_before = _cpu_by_role(server, url)
            row = apart.run("rest", port, name, producers=8, consumers=8, batch=batch,
                            backlog=backlog, seconds=window, processes=2, prefilled=standing,
                            remaining=lambda: fetch_ids(url, _REMAINING, queue_id),
                            database_cpu=lambda: _postgres_cpu(server),
                            wal_bytes=wal_counter(url), spread=spread)
            standing = fetch_ids(url, _REMAINING, queue_id)
            result = _result("rest", batch, window, row, asyncio.run(_rows(url, _STATEMENTS)),
                             tables_before, asyncio.run(_rows(url, _TABLES)), roles_before,
                             _cpu_by_role(server, url))
            print("\nclean" if holder is None
                  else f"\nheld {(time.monotonic() - began) / 60:.1f} min", end="")
            report(result, top=12)
            if holder is None:
                holder = _holder(url, minutes, window, dump)
                began = time.monotonic()
    finally:
        if holder is not None:
            holder.stop()
        if dump:
            unpad(url)
        fetch_ids(url, _EMPTY, queue_id)


def _result(kind: str, batch: int, seconds: float, row: dict[str, Any],
            statements: list[asyncpg.Record], tables_before: dict[str, Any],
            tables_after: list[asyncpg.Record], roles_before: dict[str, float],
            roles_after: dict[str, float]) -> dict[str, Any]:
    count = max(row["messages_per_second"] * seconds, 1)
    tables = []
    for after in tables_after:
        before = tables_before.get(after["relname"])
        changes = {key: after[key] - (before[key] if before else 0)
                   for key in ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del")}
        if any(changes.values()):
            tables.append({"table": after["relname"], "dead_now": after["n_dead_tup"],
                           **{key: value / count for key, value in changes.items()}})
    return {
        "kind": kind, "batch": batch, "messages": count, "row": row,
        "statements": sorted(
            ({"calls": r["calls"] / count, "ms": r["total_exec_time"] / count,
              "plan_ms": r["total_plan_time"] / count,
              "rows": r["rows"] / count, "wal": float(r["wal_bytes"]) / count,
              "blocks": r["blocks"] / count, "query": r["query"]} for r in statements),
            key=lambda s: -s["ms"]),
        "tables": tables,
        "roles": sorted(((role, 1e6 * (spent - roles_before.get(role, 0.0)) / count)
                         for role, spent in roles_after.items()), key=lambda r: -r[1]),
    }


def report(result: dict[str, Any], top: int | None = None) -> None:
    row = result["row"]
    label = {"rest": "leaseq", "minimal": "minimal table", "lockstep": "leaseq lockstep",
             "fifo": f"leaseq lockstep, FIFO {row.get('groups')} groups"}[result["kind"]]
    print(f"\n{label}, "
          f"{'single' if result['batch'] == 1 else 'batch 10'}: "
          f"{row['messages_per_second']:.0f} msg/s, PostgreSQL "
          f"{row['database_us_per_message']:.0f} us CPU and "
          f"{row['wal_bytes_per_message']:.0f} B of WAL per message, lost {row['lost']}")
    print(f"  {'calls':>6}{'plan us':>9}{'exec us':>9}{'rows':>7}{'WAL B':>8}{'blocks':>8}"
          "  statement (per message deleted)")
    for s in result["statements"][:top]:
        if s["calls"] < 0.001:
            continue
        print(f"  {s['calls']:>6.2f}{s['plan_ms'] * 1000:>9.1f}{s['ms'] * 1000:>9.1f}"
              f"{s['rows']:>7.2f}{s['wal']:>8.0f}{s['blocks']:>8.1f}  {_one_line(s['query'])}")
    print("  PostgreSQL CPU per message by process: " + ", ".join(
        f"{role} {us:.0f} us" for role, us in result["roles"] if us >= 1))
    print(f"  {'table':<28}{'ins':>6}{'upd':>6}{'hot':>6}{'del':>6}{'dead now':>10}")
    for t in result["tables"]:
        print(f"  {t['table']:<28}{t['n_tup_ins']:>6.2f}{t['n_tup_upd']:>6.2f}"
              f"{t['n_tup_hot_upd']:>6.2f}{t['n_tup_del']:>6.2f}{t['dead_now']:>10}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--backlog", type=int, default=1000)
    parser.add_argument("--kinds", nargs="+", default=["minimal", "rest"],
                        choices=["minimal", "rest", "lockstep", "fifo"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 10], choices=[1, 10])
    parser.add_argument("--explain-ms", type=float, metavar="MS",
                        help="log the plan (auto_explain, with buffers) of every statement "
                        "slower than this in the server's log, which is then kept")
    parser.add_argument("--held", type=float, metavar="MINUTES",
                        help="the apart load on one queue in windows of --seconds, first "
                        "clean, then while the horizon is held this long")
    parser.add_argument("--dump", action="store_true",
                        help="--held: held by a pg_dump of the database paced to last "
                        "that long, not by an idle transaction")
    # --fifo also sets the groups of `--kinds fifo`'s lockstep cycle (default 100).
    apart.add_spread_options(parser, "--held: the load")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="leaseq-statements-"))
    server = EmbeddedPostgres(folder, database="leaseq")
    url = server.start()
    try:
        explain = ([] if args.explain_ms is None else [
            f"ALTER SYSTEM SET auto_explain.log_min_duration = {args.explain_ms}",
            "ALTER SYSTEM SET auto_explain.log_analyze = on",
            "ALTER SYSTEM SET auto_explain.log_buffers = on"])
        asyncio.run(execute(
            url, "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
            f"{'' if args.explain_ms is None else ', auto_explain'}",
            "ALTER SYSTEM SET pg_stat_statements.track_utility = on",
            "ALTER SYSTEM SET pg_stat_statements.track_planning = on", *explain))
        if explain:
            print(f"plans of statements over {args.explain_ms} ms: "
                  f"{server.pgdata / 'server.log'} (kept)")
        server.stop()
        url = server.start()
        asyncio.run(execute(url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
        with running_service(env={"DATABASE_URL": url}) as service:
            if args.held is not None:
                for batch in args.batches:
                    measure_held(url, server, service.port, batch, args.seconds, args.held,
                                 args.backlog, apart.spread_of(args), args.dump)
                return
            for batch in args.batches:
                for kind in args.kinds:
                    report(measure(kind, url, server, service.port, batch, args.seconds,
                                   args.backlog, args.fifo or 100))
    finally:
        server.stop()
        if args.explain_ms is None:
            remove(folder)


if __name__ == "__main__":
    main()
