"""Three `leaseq serve` replicas over one database, with clients spread across them.

A long poll parked on one replica wakes for a send through another; the
maintenance rounds run in exactly one replica and move to another when it is
killed; and a steady send/receive/delete load across the three, while one is
killed with SIGKILL and restarted on its port, or through a rolling restart (each
stopped with SIGTERM and started again in turn), loses nothing and delivers twice
only what an expired lease (or a send retried after its answer was lost) explains.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from processes import LEASEQ, Service, ServiceProcesses
from support import TEST_SECRET, eventually

pytestmark = pytest.mark.e2e

ENV = {
    "LEASEQ_SECRET": TEST_SECRET,
    "LEASEQ_RETENTION_SWEEP_SECONDS": "0.2",
    "LEASEQ_ACCESS_LOG": "false",
    "LEASEQ_LOG_FORMAT": "text",
}
COMMAND = ("env", *(f"{key}={value}" for key, value in ENV.items()), LEASEQ)
# The maintenance lock's key (app/queue/queries.sql) as pg_locks shows a bigint key.
LOCK = "locktype = 'advisory' AND classid = 1818583411 AND objid = 1701904386 AND objsubid = 1"


@dataclass
class Fleet:
    processes: ServiceProcesses
    database_url: str
    workdir: Path
    replicas: list[Service] = field(default_factory=list)

    def start(self, index: int, port: int | None = None) -> Service:
        service = self.processes.start(
            self.workdir / f"replica-{index}", port=port,
            database_url=self.database_url, command=COMMAND,
        )
        if index < len(self.replicas):
            self.replicas[index] = service
        else:
            self.replicas.append(service)
        return service


@pytest.fixture
async def fleet(database_url: str, tmp_path: Path) -> AsyncIterator[Fleet]:
    with ServiceProcesses(tmp_path) as processes:
        fleet = Fleet(processes, database_url, tmp_path)
        for index in range(3):
            fleet.start(index)
        for service in fleet.replicas:
            await asyncio.to_thread(service.wait_healthy)
        yield fleet


async def readyz(service: Service) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=service.url, timeout=5) as client:
        response = await client.get("/readyz")
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer


async def holders(services: list[Service]) -> list[Service]:
    """The replicas that say they run the maintenance rounds."""
    answers = await asyncio.gather(*(readyz(s) for s in services))
    return [s for s, answer in zip(services, answers, strict=True) if answer["singletons"]]


async def the_one_holder(services: list[Service], seconds: float = 15.0) -> Service:
    found: list[Service] = []

    async def one() -> bool:
        found[:] = await holders(services)
        return len(found) == 1

    await eventually(one, seconds)
    return found[0]


async def parked(service: Service) -> int:
    async with httpx.AsyncClient(base_url=service.url, timeout=5) as client:
        for line in (await client.get("/metrics")).text.splitlines():
            if line.startswith("leaseq_waiting_receivers "):
                return int(float(line.split()[1]))
    raise AssertionError("no leaseq_waiting_receivers in /metrics")


# -- a. a long poll wakes for a send to another replica ------------------------------


async def test_a_long_poll_on_one_replica_wakes_for_a_send_to_another(fleet: Fleet) -> None:
    replicas = fleet.replicas
    async with httpx.AsyncClient(base_url=replicas[0].url, timeout=30) as admin:
        created = await admin.post("/v1/queues", json={"name": "wake"})
        assert created.status_code == 201, created.text
    for waiter, sender in [(0, 1), (1, 2), (2, 0)]:
        async with (
            httpx.AsyncClient(base_url=replicas[waiter].url, timeout=30) as parked_on,
            httpx.AsyncClient(base_url=replicas[sender].url, timeout=30) as sent_to,
        ):
            poll = asyncio.create_task(
                parked_on.get("/v1/queues/wake/receive", params={"wait": 20})
            )

            async def is_parked(on: Service = replicas[waiter]) -> bool:
                return await parked(on) >= 1

            await eventually(is_parked, 10)
            started = time.monotonic()
            body = f"from {sender} to {waiter}"
            sent = await sent_to.post("/v1/queues/wake/messages", json={"body": body})
            assert sent.status_code == 201, sent.text
            answer = await asyncio.wait_for(poll, 25)
            elapsed = time.monotonic() - started
        assert [m["body"] for m in answer.json()["messages"]] == [body]
        print(f"replica {waiter} woken by a send to replica {sender} in {elapsed * 1000:.0f} ms")
        assert elapsed < 5, "woken late: the wait is 20 s"


# -- b. the maintenance rounds: one replica at a time, taken over on SIGKILL ---------


async def swept_by(fleet: Fleet, db: asyncpg.Connection, holder: Service, queue: str) -> None:
    """Messages past retention are deleted, by the holder's sweep alone."""
    async with httpx.AsyncClient(base_url=holder.url, timeout=30) as client:
        created = await client.post("/v1/queues", json={"name": queue, "message_retention": 60})
        assert created.status_code == 201, created.text
        for n in range(3):
            sent = await client.post(f"/v1/queues/{queue}/messages", json={"body": str(n)})
            assert sent.status_code == 201, sent.text
    queue_id = await db.fetchval("SELECT id FROM leaseq.queues WHERE name = $1", queue)
    before = {s.port: s.full_log().count("past retention") for s in fleet.replicas}
    await db.execute(
        "UPDATE leaseq.messages SET sent_at = sent_at - interval '1 hour' WHERE queue_id = "
        "$1", queue_id
    )

    async def gone() -> bool:
        left = await db.fetchval("SELECT count(*) FROM leaseq.messages WHERE queue_id = $1",
                                 queue_id)
        return bool(left == 0)

    await eventually(gone, 15)

    # The sweeper logs once its DELETE has committed: the rows can be gone a moment
    # before the line is in the log.
    async def logged() -> bool:
        return any(s.full_log().count("past retention") > before[s.port] for s in fleet.replicas)

    await eventually(logged, 15)
    after = {s.port: s.full_log().count("past retention") for s in fleet.replicas}
    swept = {port for port in after if after[port] > before[port]}
    assert swept == {holder.port}, {s.port: s.log(20) for s in fleet.replicas}


async def test_the_maintenance_rounds_run_in_one_replica_and_move_when_it_is_killed(
    fleet: Fleet, db: asyncpg.Connection
) -> None:
    holder = await the_one_holder(fleet.replicas)
    assert (await readyz(holder))["singletons"] == [
        "retention sweep", "vacuum check", "fairness round", "horizon check",
        "generation rotation"]
    # Each replica keeps its lock connection; PostgreSQL shows one holder.
    lockers = await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE application_name = 'leaseq-maintenance' AND datname = current_database()"
    )
    assert lockers == 3
    held = "SELECT count(*) FROM pg_locks WHERE " + LOCK + " AND granted AND database = " \
        "(SELECT oid FROM pg_database WHERE datname = current_database())"
    assert await db.fetchval(held) == 1
    for _ in range(5):  # and it stays so
        assert await holders(fleet.replicas) == [holder]
    await swept_by(fleet, db, holder, "old-1")

    killed_at = time.monotonic()
    await asyncio.to_thread(holder.kill)
    survivors = [s for s in fleet.replicas if s is not holder]
    successor = await the_one_holder(survivors)
    takeover = time.monotonic() - killed_at
    print(f"maintenance rounds moved from :{holder.port} to :{successor.port} "
          f"{takeover:.2f} s after its SIGKILL")
    assert takeover < 10
    fleet.replicas = survivors
    await swept_by(fleet, db, successor, "old-2")

    # The lock connections lost, as in a database restart: reconnected, re-taken.
    await db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = 'leaseq-maintenance' AND datname = current_database()"
    )
    retaken = await the_one_holder(survivors)

    async def reconnected() -> bool:
        count = await db.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = 'leaseq-maintenance' AND datname = current_database()"
        )
        return bool(count == 2)

    await eventually(reconnected, 15)
    assert await db.fetchval(held) == 1
    await swept_by(fleet, db, retaken, "old-3")


# -- c. steady load across the three while one is killed and restarted ---------------

MESSAGES = 2000
SENDERS = 4
RECEIVERS = 6
LEASE = 2  # seconds: messages held by the killed replica's claims come back soon
STALL_EVERY = 100  # one delivery in so many is held past its lease, then deleted


@dataclass
class Delivery:
    body: str
    message_id: str
    receive_count: int
    deleted: bool = False  # its DELETE answered 204
    maybe_deleted: bool = False  # 409 after a DELETE whose answer was lost


@dataclass
class Load:
    clients: list[httpx.AsyncClient]
    to_send: itertools.count[int] = field(default_factory=itertools.count)
    acknowledged: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    retried: Counter[str] = field(default_factory=Counter)  # sends whose answer was lost
    send_attempts: int = 0
    deliveries: list[Delivery] = field(default_factory=list)
    lease_lost: int = 0
    refused: Counter[int] = field(default_factory=Counter)  # 503s, retried elsewhere
    served_by: Counter[int] = field(default_factory=Counter)
    served_before_restart: int | None = None  # by replica 1
    senders_done: bool = False
    stalled: list[asyncio.Task[None]] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def deleted_bodies(self) -> set[str]:
        return {d.body for d in self.deliveries if d.deleted or d.maybe_deleted}

    async def request(self, start: int, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """On the replica `start` (modulo three); a 503 is retried on the next
        ones, a connection error raised for the caller to retry."""
        for attempt in itertools.count():
            index = (start + attempt) % len(self.clients)
            response = await self.clients[index].request(method, url, **kwargs)
            if response.status_code != 503:
                self.served_by[index] += 1
                return response
            self.refused[index] += 1
            await asyncio.sleep(0.05)
        raise AssertionError("unreachable")

    async def send(self, worker: int) -> None:
        for n in self.to_send:
            if n >= MESSAGES:
                return
            body = f"m-{n:05d}"
            for attempt in itertools.count():
                self.send_attempts += 1
                try:
                    response = await self.request(
                        worker + attempt, "POST", "/v1/queues/load/messages", json={"body": body}
                    )
                except httpx.ConnectError:
                    continue  # never reached a replica: nothing was sent
                except httpx.TransportError:
                    self.retried[body] += 1  # sent, unanswered: it may exist
                    continue
                assert response.status_code == 201, response.text
                self.acknowledged[body].add(response.json()["message_id"])
                break

    async def receive(self, worker: int) -> None:
        turn = worker
        while not self.done.is_set():
            turn += 1
            try:
                response = await self.request(
                    turn, "GET", "/v1/queues/load/receive", params={"max": 10, "wait": 1}
                )
            except httpx.TransportError:
                continue  # a claim whose answer was lost comes back after its lease
            assert response.status_code == 200, response.text
            for message in response.json()["messages"]:
                delivery = Delivery(
                    message["body"], message["message_id"], message["receive_count"]
                )
                self.deliveries.append(delivery)
                if len(self.deliveries) % STALL_EVERY == 0:
                    # A handler slower than the lease: the message goes to another
                    # receiver meanwhile, and this DELETE finds the lease lost.
                    self.stalled.append(asyncio.create_task(
                        self.delete(turn, delivery, message["receipt_handle"], LEASE + 1.5)
                    ))
                    continue
                await self.delete(turn, delivery, message["receipt_handle"])

    async def delete(
        self, turn: int, delivery: Delivery, handle: str, after: float = 0.0
    ) -> None:
        await asyncio.sleep(after)
        unanswered = False
        for attempt in range(3 * len(self.clients)):
            try:
                response = await self.request(
                    turn + attempt, "DELETE", f"/v1/queues/load/messages/{handle}"
                )
            except httpx.ConnectError:
                continue
            except httpx.TransportError:
                unanswered = True  # it may have been deleted
                continue
            if response.status_code == 204:
                delivery.deleted = True
            else:  # its lease ran out first (or the unanswered DELETE did it)
                assert response.status_code == 409, response.text
                assert response.json()["code"] == "lease_lost", response.text
                delivery.maybe_deleted = unanswered
                self.lease_lost += 1
            return

    async def watch(self, admin: httpx.AsyncClient) -> None:
        """Done once every send is acknowledged, every acknowledged message deleted,
        and the queue holds nothing more (no claim left to expire)."""
        while True:
            if (
                self.senders_done
                and all(task.done() for task in self.stalled)
                and set(self.acknowledged) <= self.deleted_bodies()
            ):
                try:
                    stats = (await admin.get("/v1/queues/load")).json()["stats"]
                except httpx.TransportError:
                    stats = None
                if stats and stats["visible"] + stats["in_flight"] + stats["delayed"] == 0:
                    self.done.set()
                    return
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("chaos_kind", ["kill", "rolling"])
async def test_steady_load_across_three_replicas_while_one_is_killed_and_restarted(
    fleet: Fleet, chaos_kind: str
) -> None:
    """`kill`: replica 1 SIGKILLed and restarted. `rolling`: a rolling restart, each
    replica in turn stopped with SIGTERM (its long polls answered, requests in
    progress finished) and started again before the next."""
    replicas = fleet.replicas
    limits = httpx.Limits(max_connections=50, max_keepalive_connections=20)
    timeout = httpx.Timeout(10.0, connect=2.0)
    clients = [httpx.AsyncClient(base_url=s.url, timeout=timeout, limits=limits)
               for s in replicas]
    load = Load(clients)
    receivers: list[asyncio.Task[None]] = []
    started = time.monotonic()
    try:
        created = await clients[0].post(
            "/v1/queues", json={"name": "load", "visibility_timeout": LEASE}
        )
        assert created.status_code == 201, created.text

        async def senders() -> None:
            await asyncio.gather(*(load.send(n) for n in range(SENDERS)))
            load.senders_done = True

        async def rolling() -> None:
            """From a tenth of the way through: each replica stopped by SIGTERM and
            started again on its port, one after another."""
            for index in range(len(replicas)):
                async def further(share: int = index + 1) -> bool:
                    return len(load.deliveries) >= MESSAGES * share // 10

                await eventually(further, 60)
                victim = fleet.replicas[index]
                code = await asyncio.to_thread(victim.stop, signal.SIGTERM, 20)
                assert code == 0, victim.log()
                restarted = fleet.start(index, port=victim.port)
                await asyncio.to_thread(restarted.wait_healthy)
                print(f"replica {index} stopped and back on :{restarted.port} after "
                      f"{time.monotonic() - started:.1f} s")
            load.served_before_restart = load.served_by[1]

        async def chaos() -> None:
            """SIGKILL replica 1 a quarter of the way through, restart it on its port."""
            if chaos_kind == "rolling":
                await rolling()
                return

            async def quarter() -> bool:
                return len(load.deliveries) >= MESSAGES // 4

            await eventually(quarter, 60)
            victim = replicas[1]
            await asyncio.to_thread(victim.kill)
            print(f"SIGKILLed replica 1 (:{victim.port}) after {len(load.deliveries)} "
                  f"deliveries")
            restarted = fleet.start(1, port=victim.port)
            await asyncio.to_thread(restarted.wait_healthy)
            load.served_before_restart = load.served_by[1]
            print(f"replica 1 back on :{restarted.port} after "
                  f"{time.monotonic() - started:.1f} s")

        receivers[:] = [asyncio.create_task(load.receive(n)) for n in range(RECEIVERS)]
        async with asyncio.timeout(90):
            await asyncio.gather(senders(), chaos(), load.watch(clients[0]), *receivers)
    finally:
        for task in [*receivers, *load.stalled]:
            task.cancel()
        for client in clients:
            await client.aclose()
    elapsed = time.monotonic() - started

    acknowledged = {m for ids in load.acknowledged.values() for m in ids}
    delivered_bodies = {d.body for d in load.deliveries}
    # Delivered, and none left in the queue (watch): received and deleted.
    lost = acknowledged - {d.message_id for d in load.deliveries}
    by_message: dict[str, list[Delivery]] = defaultdict(list)
    for delivery in load.deliveries:
        by_message[delivery.message_id].append(delivery)
    # The same message again: explained by an expired lease only if no earlier
    # claim's DELETE answered 204 and its receive count is higher.
    redelivered = unexplained = 0
    for deliveries in by_message.values():
        deliveries.sort(key=lambda d: d.receive_count)
        for earlier, later in itertools.pairwise(deliveries):
            redelivered += 1
            if earlier.deleted or later.receive_count <= earlier.receive_count:
                unexplained += 1
    # Another message with the same body: explained only by a send retried after
    # its answer was lost (the first attempt was stored after all).
    messages_of: dict[str, set[str]] = defaultdict(set)
    for delivery in load.deliveries:
        messages_of[delivery.body].add(delivery.message_id)
    resent = 0
    for body, ids in messages_of.items():
        resent += len(ids) - 1
        unexplained += max(0, len(ids) - 1 - load.retried[body])
    duplicated = len(load.deliveries) - len(delivered_bodies)
    print(
        f"sent {MESSAGES} ({load.send_attempts} attempts, {sum(load.retried.values())} "
        f"retried after a lost answer), acknowledged {len(acknowledged)}, delivered "
        f"{len(load.deliveries)}, lost {len(lost)}, duplicated {duplicated} "
        f"({redelivered} after an expired lease, {resent} from retried sends, "
        f"{unexplained} unexplained); {load.lease_lost} deletes found the lease lost; "
        f"503s {dict(load.refused)}; replica 1 answered "
        f"{load.served_by[1] - (load.served_before_restart or 0)} requests after its restart; "
        f"{elapsed:.1f} s"
    )
    assert len(acknowledged) == MESSAGES
    assert not lost, sorted(lost)[:10]
    assert unexplained == 0
