"""PostgreSQL failover under load (docs/deploy.md, "PostgreSQL failover").

The test starts its own primary and synchronous streaming standby
(bench/_replication.py: initdb, pg_basebackup -R, synchronous_standby_names
naming the standby, synchronous_commit = on) and a real `leaseq serve` whose
DATABASE_URL names both hosts with target_session_attrs=read-write. Under a
steady send load it SIGKILLs the primary's postmaster, waits a moment, and
promotes the standby. Every answer must be 2xx or 503 database_unavailable
(problem+json, Retry-After), never a 500 nor a dropped connection; every send
answered 2xx must be on the new primary; the service must reconnect by itself,
its pool and its LISTEN connection both; receipt handles issued before must
still work, and fencing tokens must not go backwards.

It uses its own PostgreSQL whatever DATABASE_URL says, so the run of the suite
with DATABASE_URL set would repeat the embedded run exactly: it is skipped
there. The unavailability window is measured by `python -m bench.failover`
(docs/performance.md), not asserted here.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from processes import LEASEQ, ServiceProcesses

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # bench/ is not installed; its PostgreSQL pair is shared
    sys.path.insert(0, str(ROOT))

from bench._replication import ReplicatedPostgres  # noqa: E402

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        bool(os.environ.get("DATABASE_URL")),
        reason="starts its own primary and standby: the same test as without DATABASE_URL",
    ),
]

SENDERS = 8
LOAD_BEFORE_KILL = 1.5  # seconds of load before the primary dies
OUTAGE = 1.0  # seconds between the kill and the promotion
LOAD_AFTER = 2.0  # seconds of load once a send has succeeded on the new primary


@dataclass
class Load:
    """Everything the load saw, in the order it saw it."""

    acknowledged: dict[str, str] = field(default_factory=dict)  # body -> message_id
    unavailable: list[str] = field(default_factory=list)  # bodies of sends answered 503
    wrong: list[str] = field(default_factory=list)  # anything else: must stay empty
    answers: list[tuple[float, str, int]] = field(default_factory=list)  # (time, kind, status)
    tokens: list[tuple[float, float, int]] = field(default_factory=list)  # (start, end, token)
    stop: asyncio.Event = field(default_factory=asyncio.Event)


def _check(load: Load, kind: str, response: httpx.Response, ok: int) -> bool:
    """Records an answer: True for `ok`; a 503 must be database_unavailable."""
    load.answers.append((time.monotonic(), kind, response.status_code))
    if response.status_code == ok:
        return True
    if (response.status_code == 503
            and response.headers.get("content-type") == "application/problem+json"):
        problem = response.json()
        if (problem.get("code") == "database_unavailable"
                and response.headers.get("retry-after", "").isdigit()):
            return False
    load.wrong.append(f"{kind}: {response.status_code} {response.headers} {response.text}")
    return False


async def _sender(client: httpx.AsyncClient, load: Load) -> None:
    while not load.stop.is_set():
        body = uuid.uuid4().hex
        try:
            response = await client.post("/v1/queues/load/messages", json={"body": body})
        except httpx.TransportError as exc:
            load.wrong.append(f"send: {exc!r}")
            continue
        if _check(load, "send", response, 201):
            load.acknowledged[body] = response.json()["message_id"]
        else:
            load.unavailable.append(body)
            await asyncio.sleep(0.02)


async def _receiver(client: httpx.AsyncClient, load: Load) -> None:
    """Claims (recording their fencing tokens) and heartbeats them, beside the sends."""
    while not load.stop.is_set():
        started = time.monotonic()
        try:
            response = await client.get(
                "/v1/queues/load/receive", params={"max": 5, "visibility_timeout": 300}
            )
            if not _check(load, "receive", response, 200):
                await asyncio.sleep(0.02)
                continue
            ended = time.monotonic()
            for message in response.json()["messages"]:
                load.tokens.append((started, ended, message["fencing_token"]))
                beat = await client.patch(
                    f"/v1/queues/load/messages/{message['receipt_handle']}/visibility",
                    json={"timeout": 300},
                )
                _check(load, "heartbeat", beat, 200)
        except httpx.TransportError as exc:
            load.wrong.append(f"receive: {exc!r}")
        await asyncio.sleep(0.05)


async def _rows(url: str, sql: str) -> list[Any]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


async def until_sent_after(load: Load, since: float, seconds: float, service: Any) -> float:
    """Until a send answered 201 after `since`; when that was seen."""
    deadline = since + seconds
    while not any(t > since and kind == "send" and status == 201
                  for t, kind, status in load.answers[-50:]):
        assert time.monotonic() < deadline, (
            f"no send succeeded {seconds:.0f} s after the promotion:\n{service.log()}")
        await asyncio.sleep(0.05)
    return time.monotonic()


async def stop_load(load: Load, tasks: list[asyncio.Task[None]],
                    clients: list[httpx.AsyncClient], service: Any) -> None:
    """Stops the load; every answer it saw must have been right."""
    load.stop.set()
    await asyncio.gather(*tasks)
    for c in clients:
        await c.aclose()
    assert not load.wrong, (
        f"{len(load.wrong)} wrong answers:\n" + "\n".join(load.wrong[:10])
        + "\n" + service.log(80)
    )


async def lost_sends(url: str, load: Load) -> tuple[list[str], dict[str, str]]:
    """Bodies of sends answered 201 that are not in queue `load` at `url`, and
    what is stored there (body -> message id)."""
    rows = await _rows(
        url,
        "SELECT m.body, m.message_id::text FROM leaseq.messages m JOIN leaseq.queues q "
        "ON q.id = m.queue_id WHERE q.name = 'load'",
    )
    stored = {row["body"]: row["message_id"] for row in rows}
    lost = [body for body in load.acknowledged if stored.get(body) != load.acknowledged[body]]
    return lost, stored


async def test_failover_to_a_synchronous_standby_loses_nothing(tmp_path: Path) -> None:
    with ReplicatedPostgres(synchronous=True) as pg, ServiceProcesses(tmp_path) as services:
        service = services.start(
            tmp_path / "data", database_url=pg.url,
            command=("env", "LEASEQ_ACCESS_LOG=false", LEASEQ),
        )
        await asyncio.to_thread(service.wait_healthy)
        async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
            for name in ("load", "held", "wake"):
                created = await client.post("/v1/queues", json={"name": name})
                assert created.status_code == 201, created.text
            # Two messages held across the failover: one to heartbeat, one to delete.
            sent = await client.post("/v1/queues/held/messages",
                                     json={"messages": [{"body": "a"}, {"body": "b"}]})
            assert sent.status_code == 200, sent.text
            got = await client.get("/v1/queues/held/receive",
                                   params={"max": 2, "visibility_timeout": 300})
            held = got.json()["messages"]
            assert len(held) == 2, got.text
            tokens_before = [m["fencing_token"] for m in held]

            load = Load()
            clients = [httpx.AsyncClient(base_url=service.url, timeout=30)
                       for _ in range(SENDERS + 1)]
            tasks = [asyncio.create_task(_sender(c, load)) for c in clients[:SENDERS]]
            tasks.append(asyncio.create_task(_receiver(clients[-1], load)))
            try:
                await asyncio.sleep(LOAD_BEFORE_KILL)
                killed_at = time.monotonic()
                pg.kill_primary()
                await asyncio.sleep(OUTAGE)
                await asyncio.to_thread(pg.promote)
                promoted_at = time.monotonic()
                recovered_at = await until_sent_after(load, promoted_at, 30, service)
                await asyncio.sleep(LOAD_AFTER)
            finally:
                await stop_load(load, tasks, clients, service)

            # Serving normally again: every kind of answer is 2xx now.
            tail = [status for t, _, status in load.answers if t > recovered_at + 1.0]
            assert tail and set(tail) <= {200, 201}, tail[-20:]

            # The LISTEN connection is back, on the new primary: a parked long
            # poll is woken by a send (a notification: while listening, a send
            # does not wake local waiters directly) well within its wait.
            await _until_listening(client, service)
            listeners = await _rows(
                pg.node_url(pg.standby),
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'leaseq-listener'",
            )
            assert len(listeners) == 1, listeners
            poll = asyncio.create_task(client.get(
                "/v1/queues/wake/receive", params={"wait": 20, "max": 1}
            ))
            await _until_parked(client)
            woken_from = time.monotonic()
            assert (await client.post("/v1/queues/wake/messages",
                                      json={"body": "wake"})).status_code == 201
            woke = await poll
            assert woke.status_code == 200 and len(woke.json()["messages"]) == 1, woke.text
            assert time.monotonic() - woken_from < 5

            # Receipt handles of claims made before the failover still hold.
            beat = await client.patch(
                f"/v1/queues/held/messages/{held[0]['receipt_handle']}/visibility",
                json={"timeout": 60},
            )
            assert beat.status_code == 200, beat.text
            deleted = await client.delete(f"/v1/queues/held/messages/{held[1]['receipt_handle']}")
            assert deleted.status_code == 204, deleted.text

            # Fencing tokens never go backwards: a claim on the new primary has
            # a greater token than every claim answered before the kill.
            tokens_before += [tok for _, ended, tok in load.tokens if ended < killed_at]
            tokens_after = [tok for started, _, tok in load.tokens if started > promoted_at]
            claimed = await client.get("/v1/queues/load/receive",
                                       params={"max": 1, "visibility_timeout": 300})
            tokens_after += [m["fencing_token"] for m in claimed.json()["messages"]]
            assert tokens_after and min(tokens_after) > max(tokens_before), (
                max(tokens_before), sorted(tokens_after)[:5]
            )

        # Every send answered 201 is on the new primary; a 503 may or may not be.
        lost, stored = await lost_sends(pg.node_url(pg.standby), load)
        committed_503 = sum(1 for body in load.unavailable if body in stored)
        during = [s for t, kind, s in load.answers if killed_at <= t <= recovered_at]
        print(
            f"\nfailover: sent {len(load.acknowledged) + len(load.unavailable)}, "
            f"acknowledged {len(load.acknowledged)}, found {len(load.acknowledged) - len(lost)}, "
            f"lost {len(lost)}, answered 503 {len(load.unavailable)} "
            f"(of which committed: {committed_503}); answers during the outage "
            f"{len(during)} ({during.count(503)} x 503); fencing tokens before <= "
            f"{max(tokens_before)}, after >= {min(tokens_after)}; "
            f"kill to first send on the new primary {recovered_at - killed_at:.2f} s "
            f"(promoted {OUTAGE:.1f} s after the kill)"
        )
        assert not lost, lost[:10]
        assert load.unavailable, "the outage was never seen: the kill did not take"


async def _get(client: httpx.AsyncClient, path: str) -> httpx.Response:
    """A GET on a kept-alive connection that may have sat idle about as long as the
    service keeps one (5 s: the load before it takes about that): the service may
    close it just as the request goes out, and an idempotent GET is sent again."""
    try:
        return await client.get(path)
    except httpx.RemoteProtocolError:
        return await client.get(path)


async def _until_listening(client: httpx.AsyncClient, service: Any) -> None:
    deadline = time.monotonic() + 20
    while True:
        ready = await _get(client, "/readyz")
        if ready.status_code == 200 and ready.json()["listening"]:
            return
        assert time.monotonic() < deadline, f"not listening again:\n{service.log()}"
        await asyncio.sleep(0.1)


async def _until_parked(client: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + 10
    while True:
        metrics = (await _get(client, "/metrics")).text
        for line in metrics.splitlines():
            if line.startswith("leaseq_waiting_receivers ") and float(line.split()[1]) >= 1:
                return
        assert time.monotonic() < deadline, "the long poll never parked"
        await asyncio.sleep(0.05)


def test_an_asynchronous_standby_can_hand_out_a_fencing_token_again() -> None:
    """What docs/deploy.md warns of: a sequence's WAL record covers the next 32
    values, so a promoted standby resumes after the last record it received.
    Behind, as an asynchronous standby may be, it hands out again tokens that
    the dead primary already issued; the setval the docs give jumps past them."""
    nextval = "SELECT max(nextval('leaseq.fencing_tokens')) FROM generate_series(1, {})"
    with ReplicatedPostgres(synchronous=False) as pg:
        pg.psql(pg.primary, "CREATE SCHEMA leaseq; CREATE SEQUENCE leaseq.fencing_tokens AS bigint",
                check=True)
        issued = int(pg.psql(pg.primary, nextval.format(5), check=True))
        pg.wait_replicated()
        pg.stop_standby()  # behind from here on: the primary's commits do not wait for it
        issued = int(pg.psql(pg.primary, nextval.format(40), check=True))
        pg.kill_primary()
        pg.start_standby()
        pg.promote()
        again = int(pg.psql(pg.standby, nextval.format(1), check=True))
        assert again <= issued, (again, issued)
        pg.psql(pg.standby, "SELECT setval('leaseq.fencing_tokens', last_value + 1000000) "
                "FROM leaseq.fencing_tokens", check=True)
        assert int(pg.psql(pg.standby, nextval.format(1), check=True)) > issued
        print(f"\nasynchronous standby: the primary had issued fencing tokens up to {issued}; "
              f"the promoted standby issued {again} next")
