"""PostgreSQL failover benchmark: how long sends are refused when the primary dies.

    python -m bench.failover [--rounds N] [--delay S] [--senders N] [--asynchronous]

Each round starts a primary and a synchronous streaming standby of its own
(bench/_replication.py; `--asynchronous`: an asynchronous one) and `leaseq
serve` with DATABASE_URL naming both hosts (target_session_attrs=read-write).
Under a steady send load (`--senders` keep-alive connections, each sending one
message with a unique body at a time), it SIGKILLs the primary's postmaster,
promotes the standby `--delay` seconds later (what a failover manager's
detection would take; 0: at once), and measures:
- the unavailability window: from the kill to the first 201 of a send asked
  after the promotion began (and, within it, from the promotion on: the
  service's own share);
- when the LISTEN connection is back (/readyz says `listening`), from the
  promotion;
- the counts: sends made, acknowledged (201), found on the new primary, lost
  (acknowledged, not found: 0 with a synchronous standby), answered 503, and
  of those the ones committed all the same (a client's retry would duplicate
  them), and any answer that was neither 201 nor 503 database_unavailable.
Results are printed and written to bench/results/failover-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench._harness import Http, running_service
from bench._replication import ReplicatedPostgres

RESULTS = Path(__file__).parent / "results"


@dataclass
class Round:
    acknowledged: dict[str, str] = field(default_factory=dict)  # body -> message_id
    unavailable: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    successes: list[tuple[float, float]] = field(default_factory=list)  # 201s: (asked, answered)
    stop: asyncio.Event = field(default_factory=asyncio.Event)


async def _sender(port: int, state: Round) -> None:
    http = await Http.open(port)
    try:
        while not state.stop.is_set():
            body = uuid.uuid4().hex
            asked = time.monotonic()
            status, answer = await http.request(
                "POST", "/v1/queues/load/messages", {"body": body}
            )
            if status == 201:
                state.acknowledged[body] = answer["message_id"]
                state.successes.append((asked, time.monotonic()))
            elif status == 503 and answer.get("code") == "database_unavailable":
                state.unavailable.append(body)
                await asyncio.sleep(0.01)
            else:
                state.wrong.append(f"{status} {answer}")
    finally:
        http.close()


async def _listening_again(port: int, after: float) -> float:
    """Seconds from `after` until /readyz says the LISTEN connection is up."""
    http = await Http.open(port)
    try:
        while True:
            status, answer = await http.request("GET", "/readyz")
            if status == 200 and answer.get("listening"):
                return time.monotonic() - after
            await asyncio.sleep(0.01)
    finally:
        http.close()


async def one_round(*, delay: float, senders: int, synchronous: bool) -> dict[str, Any]:
    with ReplicatedPostgres(synchronous=synchronous) as pg, running_service(
        env={"DATABASE_URL": pg.url, "LEASEQ_ACCESS_LOG": "false"}
    ) as service:
        control = await Http.open(service.port)
        await control.request("POST", "/v1/queues", {"name": "load"})
        control.close()
        state = Round()
        tasks = [asyncio.create_task(_sender(service.port, state)) for _ in range(senders)]
        await asyncio.sleep(2.0)
        killed = time.monotonic()
        pg.kill_primary()
        await asyncio.sleep(delay)
        promoting = time.monotonic()
        await asyncio.to_thread(pg.promote)
        promoted = time.monotonic()
        listen = asyncio.create_task(_listening_again(service.port, promoting))
        deadline = promoting + 60
        # A send asked after the promotion began: not one that was on its way
        # to the old primary's last backends when it died.
        while not any(asked > promoting for asked, _ in state.successes[-senders * 2:]):
            if time.monotonic() > deadline:
                raise RuntimeError("no send succeeded within 60 s of the promotion")
            await asyncio.sleep(0.001)
        first = min(answered for asked, answered in state.successes if asked > promoting)
        listened = await asyncio.wait_for(listen, 60)
        await asyncio.sleep(1.0)
        state.stop.set()
        await asyncio.gather(*tasks)

        conn = await asyncpg.connect(pg.node_url(pg.standby))
        try:
            stored = {row["body"]: str(row["message_id"]) for row in await conn.fetch(
                "SELECT body, message_id FROM leaseq.messages m JOIN leaseq.queues q ON q.id = "
                "m.queue_id "
                "WHERE q.name = 'load'"
            )}
        finally:
            await conn.close()
    lost = sum(1 for body, mid in state.acknowledged.items() if stored.get(body) != mid)
    return {
        "kill_to_first_send_s": first - killed,
        "promotion_s": promoted - promoting,
        "promotion_to_first_send_s": first - promoting,
        "promotion_to_listening_s": listened,
        "sent": len(state.acknowledged) + len(state.unavailable) + len(state.wrong),
        "acknowledged": len(state.acknowledged),
        "found": len(state.acknowledged) - lost,
        "lost": lost,
        "answered_503": len(state.unavailable),
        "committed_but_503": sum(1 for body in state.unavailable if body in stored),
        "other_answers": state.wrong[:5],
        "other_count": len(state.wrong),
    }


async def main(rounds: int, delay: float, senders: int, synchronous: bool) -> dict[str, Any]:
    results = []
    mode = "synchronous" if synchronous else "asynchronous"
    print(f"\nleaseq failover benchmark ({platform.node()}, {os.cpu_count()} cores): "
          f"{mode} standby, promoted {delay:.1f} s after SIGKILL of the primary, "
          f"{senders} senders")
    print("  round  kill->1st send  promote->1st send  (pg_ctl promote)  promote->LISTEN"
          "   sent  acked  found  lost   503  503-but-committed  other")
    for number in range(1, rounds + 1):
        r = await one_round(delay=delay, senders=senders, synchronous=synchronous)
        results.append(r)
        print(f"  {number:5d}  {r['kill_to_first_send_s']:12.2f} s  "
              f"{r['promotion_to_first_send_s']:15.2f} s  {r['promotion_s']:14.2f} s  "
              f"{r['promotion_to_listening_s']:13.2f} s  {r['sent']:5d}  "
              f"{r['acknowledged']:5d}  {r['found']:5d}  {r['lost']:4d}  "
              f"{r['answered_503']:4d}  {r['committed_but_503']:17d}  {r['other_count']:5d}")
        for other in r["other_answers"]:
            print(f"         other answer: {other}")
    windows = [r["kill_to_first_send_s"] for r in results]
    own = [r["promotion_to_first_send_s"] for r in results]
    print(f"  unavailability window (kill -> first send on the new primary): median "
          f"{statistics.median(windows):.2f} s, max {max(windows):.2f} s; of which after "
          f"the promotion began: median {statistics.median(own):.2f} s, max {max(own):.2f} s")
    return {
        "when": datetime.now().isoformat(timespec="seconds"),
        "standby": mode,
        "delay_s": delay,
        "senders": senders,
        "rounds": results,
    }


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="failovers, each on a fresh pair")
    parser.add_argument("--delay", type=float, default=1.0,
                        help="seconds from the kill to the promotion")
    parser.add_argument("--senders", type=int, default=8, help="concurrent send connections")
    parser.add_argument("--asynchronous", action="store_true",
                        help="an asynchronous standby instead of a synchronous one")
    args = parser.parse_args()
    result = asyncio.run(main(args.rounds, args.delay, args.senders, not args.asynchronous))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"failover-{datetime.now():%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"  written to {path}")


if __name__ == "__main__":
    cli()
