"""What every benchmark needs: a running service and a client that costs little.

The service is started as users run it (`leaseq serve`, embedded PostgreSQL
unless DATABASE_URL is set) in a temporary data directory. The client speaks
HTTP/1.1 keep-alive directly over asyncio streams: an httpx client spends about
2 ms of CPU per request here, which would be most of what we measure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from app.db.embedded import remove


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    workers: int = 1

    @property
    def process(self) -> psutil.Process:
        return psutil.Process(self.proc.pid)

    def processes(self) -> list[psutil.Process]:
        """The service's Python processes: the one serving, or uvicorn's supervisor
        and its workers (not the embedded PostgreSQL it started)."""
        main = self.process
        found = [main]
        for child in main.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "python" in child.name().lower() or "python" in " ".join(child.cmdline()[:1]):
                    found.append(child)
        return found

    def cpu_seconds(self) -> float:
        total = 0.0
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def postmasters(self) -> list[psutil.Process]:
        """The PostgreSQL serving the bench: the embedded server, else every
        server running here (the one DATABASE_URL names among them)."""
        postmasters = [
            proc for proc in psutil.process_iter(["name", "ppid", "cmdline"])
            if proc.info["name"] in ("postgres", "postmaster")
            and "-D" in (proc.info["cmdline"] or [])
        ]
        # Run as root, the server's directory is where data_dir/pgdata links to.
        pgdata = str((self.data_dir / "pgdata").resolve())
        embedded = [p for p in postmasters
                    if any(pgdata in part for part in p.info["cmdline"] or [])]
        return embedded or postmasters

    def database_cpu_seconds(self) -> float:
        """CPU seconds of the PostgreSQL serving the bench: its postmaster's own,
        its live processes', and those of the processes it has reaped (a client
        connection's backend ends with it), with whatever else that server serves."""
        return sum(postmaster_cpu_seconds(postmaster) for postmaster in self.postmasters())

    def rss_bytes(self, *, peak: bool = False) -> int:
        """Resident memory of the service's processes, summed: now, or the most
        each has held since it started (VmHWM)."""
        total = 0
        for proc in self.processes():
            with contextlib.suppress(psutil.Error, OSError):
                if not peak:
                    total += proc.memory_info().rss
                    continue
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1]) * 1024
        return total


def postmaster_cpu_seconds(postmaster: psutil.Process) -> float:
    """CPU seconds of a PostgreSQL server so far: its postmaster's own, its live
    processes', and those of the processes it has reaped (a client connection's
    backend ends with it, an autovacuum worker with its round)."""
    total = 0.0
    with contextlib.suppress(psutil.Error):
        times = postmaster.cpu_times()
        total += times.user + times.system + times.children_user + times.children_system
        for child in postmaster.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                times = child.cpu_times()
                total += times.user + times.system
    return total


_ROLES = """
SELECT pid, CASE WHEN backend_type <> 'client backend' THEN backend_type
                 WHEN query ILIKE 'LISTEN%' THEN 'listener (LISTEN)'
                 WHEN application_name <> '' THEN application_name
                 ELSE 'client backend' END AS role
FROM pg_stat_activity
"""

ENDED = "ended (autovacuum workers, closed connections)"


def cpu_by_role(postmaster: psutil.Process, url: str) -> dict[str, float]:
    """CPU seconds so far of a server's processes by what they do (backend type,
    else application name); the processes that ended (autovacuum workers, closed
    connections) together."""
    roles = {int(pid): role for pid, role in fetch_rows(url, _ROLES)}
    times = postmaster.cpu_times()
    found = {"postmaster": times.user + times.system,
             ENDED: times.children_user + times.children_system}
    for child in postmaster.children():
        with contextlib.suppress(psutil.Error):
            child_times = child.cpu_times()
            role = roles.get(child.pid, "other")
            found[role] = found.get(role, 0.0) + child_times.user + child_times.system
    return found


@contextlib.contextmanager
def running_service(*, pool_size: int = 10, workers: int | None = None,
                    env: dict[str, str] | None = None) -> Iterator[Service]:
    """`leaseq serve` in a fresh data directory; `workers` None: its default;
    `env`: variables set for the service on top of the bench's own (e.g.
    LEASEQ_ADMIN_KEY, or DATABASE_URL)."""
    data_dir = Path(tempfile.mkdtemp(prefix="leaseq-bench-"))
    port = free_port()
    service_env = {k: v for k, v in os.environ.items()
                   if not k.startswith("LEASEQ_") or k == "LEASEQ_EMBEDDED_ROOT"}
    # The heartbeat load extends its leases 100 to a request (the default cap is 10).
    service_env.update(LEASEQ_LOG_LEVEL="warning", LEASEQ_POOL_SIZE=str(pool_size),
                       LEASEQ_MAX_BATCH="100")
    service_env.update(env or {})
    log = (data_dir / "service.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port), "--data-dir", str(data_dir),
         *([] if workers is None else ["--workers", str(workers)])],
        env=service_env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    service = Service(proc, port, data_dir, workers or 1)
    if threading.current_thread() is threading.main_thread():
        # A benchmark stopped with SIGTERM still stops the service it started.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError((data_dir / "service.log").read_text())
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("service did not start") from None
                time.sleep(0.1)
        yield service
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        remove(data_dir)


class Http:
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    def __init__(
        self, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._port = port
        self._reader = reader
        self._writer = writer
        # Sent with every request (e.g. {"Authorization": "Bearer <id>.<secret>"}).
        self._extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())

    @classmethod
    async def open(cls, port: int, headers: dict[str, str] | None = None) -> Http:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(port, reader, writer, headers)

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Sends JSON, returns (status, decoded JSON body or None)."""
        status, data = await self.raw(method, path, body)
        return status, json.loads(data) if data else None

    async def raw(self, method: str, path: str, body: Any = None, *,
                  content_type: str = "application/json",
                  headers: str = "") -> tuple[int, bytes]:
        """`headers`: more header lines, each ending in CRLF."""
        payload = b"" if body is None else json.dumps(body).encode()
        # Host: a loopback name. The service answers only to those by default when
        # bound to loopback (LEASEQ_ALLOWED_HOSTS, against DNS rebinding): `bench`
        # is refused with 400 host_not_allowed.
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self._port}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n"
            f"{self._extra}{headers}\r\n"
        ).encode()
        self._writer.write(head + payload)
        await self._writer.drain()
        status_line = await self._reader.readline()
        if not status_line:
            # uvicorn closes idle keep-alive connections after 5 s: reopen once.
            self._writer.close()
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self._port)
            self._writer.write(head + payload)
            await self._writer.drain()
            status_line = await self._reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while (line := await self._reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return status, await self._reader.readexactly(length) if length else b""

    def close(self) -> None:
        self._writer.close()


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary_ms(values: list[float]) -> str:
    return (
        f"p50 {percentile(values, 50) * 1000:7.2f} ms   p99 {percentile(values, 99) * 1000:7.2f} ms"
        f"   max {max(values) * 1000:7.2f} ms   (n={len(values)})"
    )


def fetch_ids(url: str, sql: str, *args: Any) -> set[str]:
    """The first column of a statement's rows, as text, over a connection of its own."""
    return {str(row[0]) for row in fetch_rows(url, sql, *args)}


def fetch_rows(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """A statement's rows, over a connection of its own."""
    async def fetch() -> list[tuple[Any, ...]]:
        conn = await asyncpg.connect(url)
        try:
            return [tuple(r) for r in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    return asyncio.run(fetch())


async def execute(url: str, *statements: str) -> None:
    """Statements in turn, each its own transaction (VACUUM may run in none),
    over a connection of its own."""
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def settle(url: str, table: str, *more: str) -> None:
    """Before a row: the table vacuumed and analysed, and a checkpoint, so that
    every row starts at the same point of the checkpoint cycle (the first change
    of a page after one writes the whole page to the WAL); then `more`."""
    asyncio.run(execute(url, f"VACUUM (ANALYZE) {table}", "CHECKPOINT", *more))


def wal_counter(url: str) -> Any:
    """A function returning the bytes of WAL the server has written so far
    (pg_stat_wal: the whole server's, the bench's load and its own checks)."""
    def read() -> float:
        return float(next(iter(fetch_ids(url, "SELECT wal_bytes FROM pg_stat_wal"))))

    return read


def call(port: int, method: str, path: str, body: Any = None) -> Any:
    """One request on a connection of its own; its decoded JSON answer."""
    async def go() -> Any:
        http = await Http.open(port)
        try:
            return (await http.request(method, path, body))[1]
        finally:
            http.close()

    return asyncio.run(go())


def find_queue_id(url: str, name: str) -> int:
    """A queue's row id, by its name."""
    return int(next(iter(fetch_ids(url, "SELECT id FROM leaseq.queues WHERE name = $1", name))))


def wait_settled(service: Service) -> None:
    """Until every worker has started (their count stops changing) and served a request."""
    seen = -1
    while (count := len(service.processes())) != seen:
        seen = count
        time.sleep(1.0)
    for _ in range(4 * max(count, 1)):
        call(service.port, "GET", "/healthz")
