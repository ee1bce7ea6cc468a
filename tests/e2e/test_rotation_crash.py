"""A crash in the middle of a rotation of the messages' generations
(app/queue/rotation.py): `kill -9` of the service, with its embedded PostgreSQL
left running or killed too, while a generation is being drained. The next
`leaseq serve` on the same data directory finishes the rotation; every lease
held across it is still good by its receipt, every message is delivered once,
and nothing is left behind in the old generation."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import pytest
from processes import Service, ServiceProcesses, is_running, pgdata_of, postmaster_pid, wait_until

pytestmark = pytest.mark.e2e

LEASE = 3600


def embedded_dsn(data_dir: Path) -> str:
    """The embedded server's socket, from its postmaster.pid (port: line 4,
    socket directory: line 5)."""
    lines = (pgdata_of(data_dir) / "postmaster.pid").read_text().splitlines()
    return f"postgresql://postgres@/leaseq?host={lines[4]}&port={lines[3]}"


def fetchrow(dsn: str, sql: str) -> Any:
    async def go() -> Any:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchrow(sql)
        finally:
            await conn.close()

    return asyncio.run(go())


def rotation(dsn: str) -> Any:
    return fetchrow(dsn, "SELECT r.epoch, r.live, r.draining, "
                         "(SELECT g.state FROM leaseq.generations AS g WHERE g.generation = 0) "
                         "AS first_state FROM leaseq.rotation AS r")


def ok(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json() if response.content else None


@pytest.mark.parametrize("also_kill", [
    pytest.param("nothing", id="postgres-left-running"),
    pytest.param("postmaster", id="postmaster-killed"),
])
def test_kill_9_in_a_rotation_loses_nothing_and_the_next_service_finishes_it(
    services: ServiceProcesses, tmp_path: Path, also_kill: str
) -> None:
    data_dir = tmp_path / "data"
    env = {"LEASEQ_ROTATE_AFTER": "200"}
    first = services.start(data_dir, env=env)
    first.wait_healthy()
    with first.client() as client:
        ok(client.post("/v1/queues", json={"name": "load"}), 201)
        for tens in range(3):
            standing = ok(client.post("/v1/queues/load/messages", json={
                "messages": [{"body": f"standing-{tens * 10 + n}"} for n in range(10)]}))
            assert all(r["ok"] for r in standing["results"])
        leased = ok(client.get("/v1/queues/load/receive",
                               params={"max": 10, "visibility_timeout": LEASE}))["messages"]
        assert len(leased) == 10
    dsn = embedded_dsn(data_dir)
    with asyncio.Runner() as runner:
        # An application's transaction that sent through the SQL API into
        # generation 0 and is still open: the drain waits for it.
        caller = runner.run(asyncpg.connect(dsn))
        runner.run(caller.execute("BEGIN"))
        runner.run(caller.fetchrow("SELECT * FROM leaseq.send(queue => 'load', body => 'outbox')"))
        cycling = _cycle_until_a_rotation_drains(first, dsn)
        first.kill()
        pid = postmaster_pid(data_dir)
        if also_kill == "postmaster":
            assert pid is not None
            psutil.Process(pid).kill()
            wait_until(lambda: not is_running(pid), timeout=10, what="the postmaster to die")
            outbox = False  # its transaction died with the server: never acknowledged
        else:
            runner.run(caller.execute("COMMIT"))
            outbox = True
        runner.run(_close(caller))

    second = services.start(data_dir, env=env)
    second.wait_healthy()
    dsn = embedded_dsn(data_dir)
    wait_until(lambda: _finished(dsn), timeout=30, what="the rotation to finish")
    assert fetchrow(dsn, "SELECT count(*) AS n FROM leaseq.messages_g0")["n"] == 0

    with second.client() as client:
        for message in leased:  # each lease held across the crash and the move
            ok(client.delete(f"/v1/queues/load/messages/{message['receipt_handle']}"), 204)
        received: list[str] = []
        while batch := ok(client.get("/v1/queues/load/receive", params={
                "max": 10, "visibility_timeout": LEASE}))["messages"]:
            received.extend(m["body"] for m in batch)
    expected = [f"standing-{n}" for n in range(30)
                if f"standing-{n}" not in {m["body"] for m in leased}]
    expected += ["outbox"] * outbox + ["cycle"] * cycling
    assert sorted(received) == sorted(expected)


async def _close(conn: asyncpg.Connection) -> None:
    if not conn.is_closed():
        conn.terminate()


def _cycle_until_a_rotation_drains(service: Service, dsn: str) -> int:
    """Sends, receives and acknowledges until the service has begun a rotation
    (its settled history past LEASEQ_ROTATE_AFTER) and is draining generation 0;
    how many of the messages sent meanwhile are left."""
    deadline = time.monotonic() + 60
    left = 0
    with service.client() as client:
        while rotation(dsn)["draining"] is None:
            assert time.monotonic() < deadline, "no rotation began"
            ok(client.post("/v1/queues/load/messages", json={
                "messages": [{"body": "cycle"} for _ in range(10)]}))
            left += 10
            batch = ok(client.get("/v1/queues/load/receive", params={"max": 10}))["messages"]
            for message in batch:
                if message["body"] == "cycle":
                    ok(client.delete(
                        f"/v1/queues/load/messages/{message['receipt_handle']}"), 204)
                    left -= 1
                else:  # a standing one: given back at once
                    ok(client.patch(
                        f"/v1/queues/load/messages/{message['receipt_handle']}/visibility",
                        json={"timeout": 0}))
    assert rotation(dsn)["draining"] == 0
    return left


def _finished(dsn: str) -> bool:
    state = rotation(dsn)
    return bool(state["draining"] is None and state["first_state"] == "spare")
