"""A real queue's shape: producers and consumers apart, a standing backlog.

The lockstep cycle (bench/cycle.py) keeps its queue nearly empty: each client
sends, receives and deletes in turn. Here producers only send and consumers
only receive (a long poll, `wait=1`) and delete, while the queue holds about
`backlog` visible messages the whole time: filled before the clock starts,
then kept there because each generator process lets its producers run only
while its own sent-minus-deleted count is under its share of the backlog.

Two kinds: `rest` (leaseq's REST API, one message a request or batches) and
`minimal` (the minimal queue table in raw SQL, bench/minimal.py, whose
consumers poll again at once, or after 5 ms when they found nothing). Each
row reports messages per second (deleted), the CPU per message of the
service and PostgreSQL, and the WAL written per message.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import resource
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench import minimal
from bench._harness import Http, percentile
from bench.cycle import Share, acknowledge

_WAIT = 1  # seconds a consumer's long poll waits (REST)


class _Level:
    """The sent-minus-deleted count of one generator process, and its cap."""

    def __init__(self, cap: int) -> None:
        self.count = cap  # its share of the backlog, sent before the clock started
        self.cap = cap
        self.changed = asyncio.Condition()

    async def room_for(self, batch: int, until: float) -> bool:
        async with self.changed:
            while self.count + batch > self.cap:
                left = until - time.monotonic()
                if left <= 0:
                    return False
                try:
                    await asyncio.wait_for(self.changed.wait(), left)
                except TimeoutError:
                    return False
            self.count += batch
            return True

    async def consumed(self, n: int) -> None:
        async with self.changed:
            self.count -= n
            self.changed.notify_all()


# -- leaseq's REST API ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spread:
    """How the REST producers' messages name groups: message n names group
    n % `groups`, the tenants of a fair queue, or the message groups of a FIFO
    queue (`fifo`: each message with a deduplication id of its own)."""

    groups: int
    fifo: bool = False

    def label(self) -> str:
        return f"fifo {self.groups}" if self.fifo else f"fair {self.groups}"

    def group(self, n: int) -> str:
        return f"{'g' if self.fifo else 't'}{n % self.groups}"


def add_spread_options(parser: argparse.ArgumentParser, what: str) -> None:
    """--fair TENANTS and --fifo GROUPS, one or the other: `what` says which
    rows they shape."""
    spread = parser.add_mutually_exclusive_group()
    spread.add_argument("--fair", type=int, metavar="TENANTS",
                        help=f"{what} on a fair queue, its messages naming this many "
                        "tenants in turn")
    spread.add_argument("--fifo", type=int, metavar="GROUPS",
                        help=f"{what} on a FIFO queue, its messages naming this many "
                        "message groups in turn")


def spread_of(args: argparse.Namespace) -> Spread | None:
    """The Spread add_spread_options' options chose, if any."""
    if args.fair:
        return Spread(args.fair)
    return Spread(args.fifo, fifo=True) if args.fifo else None


def _messages(count: int, spread: Spread | None, first: int = 0) -> list[dict[str, str]]:
    """Bodies to send, numbered from `first`."""
    if spread is None:
        return [{"body": "x"}] * count
    if spread.fifo:
        return [{"body": "x", "group": spread.group(first + i),
                 "deduplication_id": uuid.uuid4().hex} for i in range(count)]
    return [{"body": "x", "group": spread.group(first + i)} for i in range(count)]


async def _rest_producer(port: int, queue: str, batch: int, until: float, level: _Level,
                         share: Share, spread: Spread | None = None) -> None:
    http = await Http.open(port)
    path = f"/v1/queues/{queue}/messages"
    sent_so_far = 0
    try:
        while await level.room_for(batch, until):
            messages = _messages(batch, spread, sent_so_far)
            sent_so_far += batch
            if batch == 1:
                _, sent = await http.request("POST", path, messages[0])
                share.sent.append(sent["message_id"])
            else:
                _, sent = await http.request("POST", path, {"messages": messages})
                share.sent.extend(r["message_id"] for r in sent["results"])
    finally:
        http.close()


async def _rest_consumer(port: int, queue: str, batch: int, until: float, level: _Level,
                         share: Share) -> None:
    http = await Http.open(port)
    base = f"/v1/queues/{queue}"
    try:
        while time.monotonic() < until:
            start = time.perf_counter()
            _, got = await http.request(
                "GET", f"{base}/receive?max={batch}&wait={_WAIT}&visibility_timeout=600")
            share.claim_seconds.append(time.perf_counter() - start)
            messages = got["messages"]
            share.claimed.extend(m["message_id"] for m in messages)
            if not messages:
                share.empty_receives += 1
                continue
            done = await acknowledge(http, base, messages, batch)
            share.deleted.extend(done)
            await level.consumed(len(done))
    finally:
        http.close()


# -- the minimal table in SQL ----------------------------------------------------


async def _sql_producer(dsn: str, queue: int, batch: int, until: float, level: _Level,
                        share: Share) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        while await level.room_for(batch, until):
            ids = await conn.fetch(minimal.SEND, queue, ["x"] * batch)
            share.sent.extend(str(r["id"]) for r in ids)
    finally:
        await conn.close()


async def _sql_consumer(dsn: str, queue: int, batch: int, until: float, level: _Level,
                        share: Share) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        while time.monotonic() < until:
            start = time.perf_counter()
            claimed = await conn.fetch(minimal.CLAIM, queue, batch)
            share.claim_seconds.append(time.perf_counter() - start)
            share.claimed.extend(str(r["id"]) for r in claimed)
            if not claimed:
                share.empty_receives += 1
                await asyncio.sleep(0.005)
                continue
            deleted = await conn.fetch(
                minimal.DELETE, [r["id"] for r in claimed], [r["claim_token"] for r in claimed])
            share.deleted.extend(str(r["id"]) for r in deleted)
            await level.consumed(len(deleted))
    finally:
        await conn.close()


def _generator(kind: str, target: Any, queue: Any, producers: int, consumers: int,
               batch: int, seconds: float, cap: int, spread: Spread | None = None) -> Share:
    share = Share()
    before = resource.getrusage(resource.RUSAGE_SELF)

    async def main() -> None:
        until = time.monotonic() + seconds
        level = _Level(cap)
        produce, consume = ((functools.partial(_rest_producer, spread=spread),
                             _rest_consumer) if kind == "rest"
                            else (_sql_producer, _sql_consumer))
        await asyncio.gather(
            *(produce(target, queue, batch, until, level, share) for _ in range(producers)),
            *(consume(target, queue, batch, until, level, share) for _ in range(consumers)),
        )

    asyncio.run(main())
    after = resource.getrusage(resource.RUSAGE_SELF)
    share.cpu_seconds = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return share


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run(kind: str, target: Any, queue: Any, *, producers: int, consumers: int, batch: int,
        backlog: int, seconds: float, processes: int, prefilled: set[str], remaining: Any,
        service_cpu: Any = None, database_cpu: Any = None, wal_bytes: Any = None,
        spread: Spread | None = None) -> dict[str, Any]:
    """One row: `prefilled` holds the ids of the `backlog` messages sent before
    it; `remaining()` the ids still queued after it; the three counters are as
    in bench/cycle.py's run. `spread`: the groups the REST producers' messages
    name (a fair or FIFO queue)."""
    processes = max(1, min(processes, producers, consumers))
    shares_of = list(zip(_split(producers, processes), _split(consumers, processes),
                         _split(backlog, processes), strict=True))
    service_before = service_cpu() if service_cpu else None
    database_before = database_cpu() if database_cpu else None
    wal_before = wal_bytes() if wal_bytes else None
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=processes) as pool:
        futures = [pool.submit(_generator, kind, target, queue, p, c, batch, seconds, cap,
                               spread)
                   for p, c, cap in shares_of]
        shares = [f.result() for f in futures]
    wall = time.monotonic() - start
    service_seconds = service_cpu() - service_before if service_before is not None else None
    database_seconds = (database_cpu() - database_before
                        if database_before is not None else None)
    wal = wal_bytes() - wal_before if wal_before is not None else None
    sent = {m for s in shares for m in s.sent} | prefilled
    deleted = [m for s in shares for m in s.deleted]
    claimed = [m for s in shares for m in s.claimed]
    left = set(remaining())
    count = max(len(set(deleted)), 1)
    return {
        "kind": kind, "batch": batch, "backlog": backlog, "producers": producers,
        "consumers": consumers, "seconds": seconds,
        "messages_per_second": len(set(deleted)) / seconds,
        "lost": len(sent - set(deleted) - left),
        "duplicated": len(claimed) - len(set(claimed)),
        "standing_after": len(left),
        "receive_p99_ms": percentile([t for s in shares for t in s.claim_seconds], 99) * 1000,
        "empty_receives": sum(s.empty_receives for s in shares),
        "receives": sum(len(s.claim_seconds) for s in shares),
        "service_us_per_message": None if service_seconds is None
        else 1e6 * service_seconds / count,
        "database_us_per_message": None if database_seconds is None
        else 1e6 * database_seconds / count,
        "generator_cpu_percent": 100 * sum(s.cpu_seconds for s in shares) / wall,
        "database_cpu_percent": None if database_seconds is None
        else 100 * database_seconds / wall,
        "wal_bytes_per_message": None if wal is None else wal / count,
    }


def prefill_rest(port: int, queue: str, count: int, spread: Spread | None = None) -> set[str]:
    """Sends `count` messages in batches of 100 (the bench runs the service
    with LEASEQ_MAX_BATCH=100) before the clock starts, naming the groups of
    `spread` in turn if given; their ids."""
    async def go() -> set[str]:
        http = await Http.open(port)
        ids: set[str] = set()
        try:
            while len(ids) < count:
                n = min(100, count - len(ids))
                _, sent = await http.request("POST", f"/v1/queues/{queue}/messages",
                                             {"messages": _messages(n, spread, len(ids))})
                ids.update(r["message_id"] for r in sent["results"])
        finally:
            http.close()
        return ids

    return asyncio.run(go())


def prefill_minimal(url: str, queue: int, count: int) -> set[str]:
    async def go() -> set[str]:
        conn = await asyncpg.connect(url)
        try:
            return {str(r["id"]) for r in await conn.fetch(minimal.PREFILL, queue, count)}
        finally:
            await conn.close()

    return asyncio.run(go())
