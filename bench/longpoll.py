"""Long-polling benchmark: wake-up latency, redelivery latency, the cost of idle waiters.

    python -m bench.longpoll [--quick]

Starts `leaseq serve` (embedded PostgreSQL unless DATABASE_URL is set) and
measures, in one run, next to two floors measured the same way:
- floor: an HTTP round trip to /healthz, and a NOTIFY from one asyncpg
  connection to a LISTENing one;
- send -> receive through a waiting long poll, one waiter and 100 waiters;
- redelivery: from a lease's deadline (database clock) to the message in a
  waiting worker's hands (same host, so the same system clock);
- many idle long-polling clients: database connections in use, service RSS
  and CPU while they wait.
Results are printed and written to bench/results/longpoll-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from app.db.embedded import EmbeddedPostgres
from bench._harness import Http, Service, percentile, running_service, summary_ms

RESULTS = Path(__file__).parent / "results"


def database_url(service: Service) -> str:
    return os.environ.get("DATABASE_URL") or EmbeddedPostgres(service.data_dir).dsn()


async def parked(control: Http) -> int:
    """Receivers waiting now, as the service's /metrics says."""
    _, text = await control.raw("GET", "/metrics")
    for row in text.decode().splitlines():
        if row.startswith("leaseq_waiting_receivers "):
            return int(float(row.split()[1]))
    raise RuntimeError("no waiter gauge in /metrics")


async def until_parked(control: Http, count: int, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while await parked(control) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {count} receivers ever waited")
        await asyncio.sleep(0.002)


async def http_floor(port: int, rounds: int) -> list[float]:
    conn = await Http.open(port)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        await conn.request("GET", "/healthz")
        times.append(time.perf_counter() - start)
    conn.close()
    return times


async def notify_floor(url: str, rounds: int) -> list[float]:
    listener = await asyncpg.connect(url)
    sender = await asyncpg.connect(url)
    arrived: asyncio.Queue[float] = asyncio.Queue()
    await listener.add_listener("bench", lambda *_: arrived.put_nowait(time.perf_counter()))
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        await sender.execute("SELECT pg_notify('bench', 'x')")
        times.append(await arrived.get() - start)
    await listener.close()
    await sender.close()
    return times


async def send_to_receive(port: int, queue: str, waiters: int, rounds: int) -> list[float]:
    control = await Http.open(port)
    sender = await Http.open(port)
    await control.request("POST", "/v1/queues", {"name": queue})
    arrivals: dict[str, asyncio.Future[float]] = {}
    loop = asyncio.get_running_loop()
    stop = False

    async def waiter() -> None:
        conn = await Http.open(port)
        while not stop:
            _, body = await conn.request(
                "GET", f"/v1/queues/{queue}/receive?wait=20&visibility_timeout=600"
            )
            now = time.perf_counter()
            for message in (body or {}).get("messages", []):
                arrivals.setdefault(message["body"], loop.create_future()).set_result(now)
        conn.close()

    tasks = [asyncio.create_task(waiter()) for _ in range(waiters)]
    times = []
    for i in range(rounds):
        await until_parked(control, waiters)
        arrival = arrivals.setdefault(str(i), loop.create_future())
        start = time.perf_counter()
        await sender.request("POST", f"/v1/queues/{queue}/messages", {"body": str(i)})
        times.append(await arrival - start)
    stop = True
    await control.request("POST", f"/v1/queues/{queue}/messages",
                          {"messages": [{"body": "stop"}] * min(waiters, 100)})
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    control.close()
    sender.close()
    return times


async def redelivery(port: int, messages: int, waiters: int) -> list[float]:
    queue = "redelivery"
    control = await Http.open(port)
    await control.request("POST", "/v1/queues", {"name": queue})
    for start in range(0, messages, 10):
        batch = [{"body": str(i)} for i in range(start, min(messages, start + 10))]
        await control.request("POST", f"/v1/queues/{queue}/messages", {"messages": batch})
    # A worker that takes every message on a 3 s lease, a few ms apart, and dies.
    deadlines: dict[str, float] = {}
    for _ in range(messages):
        _, body = await control.request(
            "GET", f"/v1/queues/{queue}/receive?max=1&visibility_timeout=3"
        )
        (message,) = body["messages"]
        deadlines[message["body"]] = datetime.fromisoformat(
            message["lease_expires_at"]
        ).timestamp()
        await asyncio.sleep(0.005)
    latencies: list[float] = []
    done = asyncio.Event()

    async def waiter() -> None:
        conn = await Http.open(port)
        while not done.is_set():
            _, body = await conn.request(
                "GET", f"/v1/queues/{queue}/receive?wait=20&visibility_timeout=600"
            )
            now = time.time()
            for message in (body or {}).get("messages", []):
                latencies.append(now - deadlines[message["body"]])
            if len(latencies) >= messages:
                done.set()
        conn.close()

    tasks = [asyncio.create_task(waiter()) for _ in range(waiters)]
    await asyncio.wait_for(done.wait(), timeout=60)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    control.close()
    return latencies


async def idle_waiters(service: Service, url: str, count: int, window: float) -> dict[str, Any]:
    port = service.port
    control = await Http.open(port)
    await control.request("POST", "/v1/queues", {"name": "idle"})
    proc = service.process
    db = await asyncpg.connect(url)
    connections_sql = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE application_name IN ('leaseq', 'leaseq-listener')"
    )

    async def sample(seconds: float) -> dict[str, float]:
        cpu_before = proc.cpu_times()
        start = time.monotonic()
        rss, conns = 0, 0
        while time.monotonic() - start < seconds:
            rss = max(rss, proc.memory_info().rss)
            conns = max(conns, await db.fetchval(connections_sql))
            await asyncio.sleep(0.5)
        cpu_after = proc.cpu_times()
        used = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
        return {
            "rss_mb": rss / 2**20,
            "db_connections": conns,
            "cpu_percent": 100 * used / (time.monotonic() - start),
        }

    before = await sample(min(window, 5.0))
    stop = asyncio.Event()

    async def waiter() -> None:
        conn = await Http.open(port)
        while not stop.is_set():
            await conn.request("GET", "/v1/queues/idle/receive?wait=20")
        conn.close()

    tasks = []
    for _ in range(count):
        tasks.append(asyncio.create_task(waiter()))
        if len(tasks) % 200 == 0:
            await asyncio.sleep(0.05)  # let the service accept them in waves
    await until_parked(control, count, limit=60)
    # Until the first of them times out (wait=20), nothing but waiting happens;
    # the full window then also holds one wave of all of them polling again.
    quiet = await sample(min(window, 12.0))
    during = await sample(window)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await db.close()
    control.close()
    return {"waiters": count, "window_seconds": window, "before": before, "quiet": quiet,
            "during": during}


async def main(quick: bool) -> dict[str, Any]:
    rounds = 200 if quick else 1000
    idle_count, idle_window = (500, 5.0) if quick else (2000, 30.0)
    with running_service() as service:
        url = database_url(service)
        http = await http_floor(service.port, rounds)
        notify = await notify_floor(url, rounds)
        one = await send_to_receive(service.port, "one-waiter", 1, rounds)
        hundred = await send_to_receive(service.port, "hundred-waiters", 100, rounds)
        redeliver = await redelivery(service.port, 100 if quick else 300, 10)
        idle = await idle_waiters(service, url, idle_count, idle_window)

    def stats(values: list[float]) -> dict[str, float]:
        return {
            "p50_ms": percentile(values, 50) * 1000,
            "p99_ms": percentile(values, 99) * 1000,
            "max_ms": max(values) * 1000,
            "n": len(values),
        }

    print(f"\nleaseq long-poll benchmark ({platform.node()}, {os.cpu_count()} cores, "
          f"{'DATABASE_URL' if os.environ.get('DATABASE_URL') else 'embedded PostgreSQL'})")
    print(f"  floor: HTTP /healthz round trip      {summary_ms(http)}")
    print(f"  floor: NOTIFY -> LISTEN (asyncpg)    {summary_ms(notify)}")
    print(f"  send -> receive, 1 waiter            {summary_ms(one)}")
    print(f"  send -> receive, 100 waiters         {summary_ms(hundred)}")
    print(f"  redelivery after lease deadline      {summary_ms(redeliver)}")
    p50_ratio = percentile(one, 50) / percentile(http, 50)
    print(f"  ratio: send->receive p50 (1 waiter) / HTTP round trip p50 = {p50_ratio:.1f}x")
    d, b, q = idle["during"], idle["before"], idle["quiet"]
    print(f"  {idle['waiters']} idle waiters for {idle['window_seconds']:.0f} s: "
          f"{d['db_connections']:.0f} database connections (pool 10 + listener), "
          f"RSS {d['rss_mb']:.0f} MB (no waiters: {b['rss_mb']:.0f} MB)")
    print(f"    service CPU: no waiters {b['cpu_percent']:.1f}%, all parked "
          f"{q['cpu_percent']:.1f}%, over {idle['window_seconds']:.0f} s including one "
          f"wave of every client polling again {d['cpu_percent']:.1f}% (of one core)")
    return {
        "when": datetime.now().isoformat(timespec="seconds"),
        "quick": quick,
        "database": "DATABASE_URL" if os.environ.get("DATABASE_URL") else "embedded",
        "floor_http": stats(http),
        "floor_notify": stats(notify),
        "send_receive_1_waiter": stats(one),
        "send_receive_100_waiters": stats(hundred),
        "redelivery_after_deadline": stats(redeliver),
        "idle_waiters": idle,
    }


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, for a smoke run")
    args = parser.parse_args()
    result = asyncio.run(main(args.quick))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"longpoll-{datetime.now():%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"  written to {path}")


if __name__ == "__main__":
    cli()
