"""Trust at the edges, measured: `python -m bench.edges [--quick]`.

1. The authorization check's own CPU for one request that touches three queues:
   a redrive of `team-a-dlq` back to two source queues, by a key scoped as an
   operator scopes one (`admin:team-a-*`, `send:team-b-*`, `read:*`): the Guard's
   rule for the path, then the queues the redrive reaches (app/auth/access.py).
   In this process, on CPU time, so the machine's noise hardly moves it.
   Target: <= 5 us a request.
2. The service under unauthenticated load: GET /healthz latency, idle and while
   200 connections send their headers a byte a second (reconnecting when cut)
   and 20 clients send unauthenticated 10 MiB bodies to both doors, against a
   `leaseq serve` whose database holds a key (so no request is let in without
   one). Targets: /healthz p99 within 10 ms of its idle p99, the service's RSS
   rise under 20 MB.

Results also go to bench/results/edges-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from bench._harness import Service, running_service
from bench.security import MIB, _rss, _sample

RESULTS = Path(__file__).parent / "results"
ADMIN_ID = "LQBENCHEDGES00000001"


# -- 1. the check's CPU ----------------------------------------------------------


def authorization_cost(n: int = 100_000, rounds: int = 5) -> dict[str, float]:
    from app.api.routes import redrive
    from app.auth.guard import Rules, _authorize
    from app.auth.scopes import Principal, parse_scopes

    rules = Rules(redrive.router.routes)
    principal = Principal("LQBENCH", "bench",
                          parse_scopes(["admin:team-a-*", "send:team-b-*", "read:*"]))
    path = "/v1/queues/team-a-dlq/redrive"
    sources = ["team-a-src", "team-b-src"]

    def once() -> None:
        _authorize(rules, principal, "POST", path)  # what the Guard checks
        found = rules.find("POST", path)  # and the route, with the queues it reaches
        assert found is not None
        found[0].require(principal, "redrive_targets", sources)

    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(n):
            once()
        best = min(best, (time.process_time() - start) / n * 1e6)
    return {"us_per_request": best, "queues": 3, "target_us": 5.0}


# -- 2. unauthenticated load -------------------------------------------------------


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A fresh connection, or None (after a pause) when the server refuses one."""
    try:
        return await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        await asyncio.sleep(0.1)
        return None


async def _slow_headers(port: int, connections: int, until: float) -> int:
    """`connections` sockets each sending a request's headers a byte a second;
    one the server cuts is opened again. Returns how many were cut."""
    cut = 0
    request = b"GET /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 1000

    async def one() -> None:
        nonlocal cut
        while time.monotonic() < until:
            if (connected := await _connect(port)) is None:
                continue
            reader, writer = connected
            try:
                for byte in request:
                    if time.monotonic() >= until or reader.at_eof():
                        break
                    writer.write(bytes([byte]))
                    await writer.drain()
                    try:
                        async with asyncio.timeout(1.0):
                            if await reader.read(1024) == b"":
                                break
                    except TimeoutError:
                        pass
            except OSError:
                pass
            finally:
                cut += 1
                writer.close()

    await asyncio.gather(*(one() for _ in range(connections)))
    return cut


async def _large_bodies(port: int, clients: int, until: float) -> dict[str, int]:
    """`clients` loops, each posting an unauthenticated 10 MiB body (REST and SQS
    in turn) and writing it until the server stops it. Counts the answers."""
    answers: dict[str, int] = {}
    chunk = b"a" * 65536
    length = 10 * MIB
    heads = [
        (f"POST /v1/queues/q/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
         f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode(),
        (f"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
         f"Content-Type: application/x-www-form-urlencoded\r\n"
         f"Content-Length: {length}\r\n\r\n").encode(),
    ]

    async def one(i: int) -> None:
        n = i
        while time.monotonic() < until:
            n += 1
            if (connected := await _connect(port)) is None:
                continue
            reader, writer = connected
            try:
                # The headers and the first 64 KiB; the rest follows until the
                # server answers or hangs up (an answer first: it did not wait).
                writer.write(heads[n % 2] + chunk)
                answer = asyncio.ensure_future(reader.readline())
                sent = len(chunk)
                with contextlib.suppress(OSError):  # hung up on: the answer is read below
                    while sent < length and not answer.done():
                        await asyncio.sleep(0)  # let an answer that came be seen first
                        writer.write(chunk)
                        await writer.drain()
                        sent += len(chunk)
                line = await asyncio.wait_for(answer, 5)
                status = line.split(b" ")[1].decode() if line else "closed"
                status += " after 64 KiB" if sent <= 2 * len(chunk) else ""
            except (OSError, TimeoutError, IndexError):
                status = "cut"
            finally:
                writer.close()
            answers[status] = answers.get(status, 0) + 1

    await asyncio.gather(*(one(i) for i in range(clients)))
    return answers


def _attack(port: int, start: float, until: float) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        cut, answers = await asyncio.gather(
            _slow_headers(port, 200, until), _large_bodies(port, 20, until))
        return {"slow_connections_cut": cut, "large_body_answers": answers}

    return asyncio.run(go())


def unauthenticated_load(service: Service, *, seconds: float) -> dict[str, Any]:
    port, pid = service.port, service.proc.pid
    interval = 0.005
    start = time.monotonic() + 0.2
    idle = asyncio.run(_sample(port, pid, start, start + seconds, interval))
    rss_idle = _rss(pid)
    with ProcessPoolExecutor(max_workers=1) as pool:
        lead = 1.0
        attack_start = time.monotonic() + lead
        attack = pool.submit(_attack, port, attack_start, attack_start + seconds + 1.0)
        loaded = asyncio.run(_sample(port, pid, attack_start + 0.5,
                                     attack_start + 0.5 + seconds, interval))
        attacked = attack.result()
    return {
        "idle": idle, "loaded": loaded, "attack": attacked,
        "p99_rise_ms": loaded["p99_ms"] - idle["p99_ms"],
        "rss_rise_mb": ((loaded["rss_peak_mb"] or 0) - rss_idle / MIB),
        "targets": {"p99_rise_ms": 10.0, "rss_rise_mb": 20.0},
    }


def main(quick: bool) -> dict[str, Any]:
    report: dict[str, Any] = {"when": datetime.now().isoformat(timespec="seconds"),
                              "quick": quick}
    report["authorization"] = authorization_cost(n=20_000 if quick else 100_000)
    token = f"{ADMIN_ID}.{secrets.token_urlsafe(30)}"
    with running_service(env={"LEASEQ_ADMIN_KEY": token}) as service:
        report["unauthenticated"] = unauthenticated_load(
            service, seconds=2.0 if quick else 8.0)
    return report


def print_table(report: dict[str, Any]) -> None:
    auth = report["authorization"]
    print(f"\n1. authorization, one request touching {auth['queues']} queues: "
          f"{auth['us_per_request']:.2f} us (target <= {auth['target_us']:.0f} us)")
    load = report["unauthenticated"]
    idle, loaded = load["idle"], load["loaded"]
    print("2. /healthz under 200 slow-header connections and 20 unauthenticated 10 MiB "
          "bodies at a time")
    print(f"   idle p50 {idle['p50_ms']:.2f} ms, p99 {idle['p99_ms']:.2f} ms; "
          f"loaded p50 {loaded['p50_ms']:.2f} ms, p99 {loaded['p99_ms']:.2f} ms, "
          f"max {loaded['max_ms']:.1f} ms ({loaded['n']} probes, statuses "
          f"{loaded['statuses']})")
    print(f"   p99 rise {load['p99_rise_ms']:.2f} ms (target < 10), RSS rise "
          f"{load['rss_rise_mb']:.1f} MB (target < 20); the service's loop waited for a "
          f"CPU {loaded['service_cpu_wait_percent']:.0f}% of the window")
    print(f"   attack: {load['attack']}")


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.edges", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short rows (a smoke run)")
    args = parser.parse_args()
    report = main(args.quick)
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    (RESULTS / f"edges-{stamp}.json").write_text(json.dumps(report, indent=2))
    print_table(report)


if __name__ == "__main__":
    cli()
