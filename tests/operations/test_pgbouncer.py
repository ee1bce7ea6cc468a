"""The service through PgBouncer (docs/deploy.md): the test starts its own
pgbouncer in front of the test's PostgreSQL and real `leaseq serve` processes
through it, with LEASEQ_PGBOUNCER=transaction and the LISTEN connection on the
direct URL (LEASEQ_LISTEN_URL). Skipped where no pgbouncer is installed
(Debian: `apt-get install pgbouncer`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import asyncpg
import httpx
import pytest
from processes import LEASEQ, ServiceProcesses, free_port
from sqlalchemy.engine import make_url
from support import TEST_SECRET

from app.db.engine import create_engine
from app.db.hosts import Dialer

pytestmark = pytest.mark.e2e

PGBOUNCER = shutil.which("pgbouncer") or next(
    (path for path in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(path)),
    None,
)
SERVER_POOL = 3
"""Server connections PgBouncer opens to the database: fewer than one service's
pool (10), so that transaction pooling, not a connection each, is what serves."""

_DIAL = Dialer(connect_timeout=5.0, dead_peer_seconds=10.0)


@dataclass
class PgBouncer:
    proc: subprocess.Popen[bytes]
    port: int
    url: str  # the test's database, through PgBouncer
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class StartPgBouncer(Protocol):
    def __call__(self, mode: str, *, pool_size: int = SERVER_POOL) -> PgBouncer: ...


def _run_as(server_host: str | None) -> list[str]:
    """PgBouncer refuses to run as root: `-u` a user who may reach the server.
    The embedded PostgreSQL's socket directory is private to its own user
    (leaseq-pg, when the tests run as root), so that user, when the server is
    reached by a socket; `nobody` for a TCP server."""
    if os.geteuid() != 0:
        return []
    if server_host and server_host.startswith("/"):
        return ["-u", pwd.getpwuid(os.stat(server_host).st_uid).pw_name]
    return ["-u", "nobody"]


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@pytest.fixture
def pgbouncers(database_url: str) -> Iterator[StartPgBouncer]:
    """Starts pgbouncer processes in front of the test's database; kills them after."""
    if PGBOUNCER is None:
        pytest.skip("pgbouncer is not installed (Debian: apt-get install -y pgbouncer)")
    started: list[PgBouncer] = []
    # Outside pytest's temporary root (mode 0700): the user pgbouncer runs as
    # must read its configuration.
    folder = Path(tempfile.mkdtemp(prefix="leaseq-test-pgbouncer-"))
    folder.chmod(0o755)
    target = make_url(database_url)
    host = str(target.query.get("host") or target.host or "127.0.0.1")
    port = int(str(target.query.get("port") or target.port or 5432))
    user = target.username or "postgres"
    database = str(target.database)

    def start(mode: str, *, pool_size: int = SERVER_POOL) -> PgBouncer:
        listen = free_port()
        server = f"host={_quote(host)} port={port} dbname={_quote(database)}"
        if target.password:
            server += f" password={_quote(str(target.password))}"
        config = folder / f"pgbouncer-{listen}.ini"
        users = folder / "userlist.txt"
        users.write_text(f'"{user}" ""\n')
        config.write_text(
            f"[databases]\n{database} = {server}\n\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {users}\n"
            f"pool_mode = {mode}\ndefault_pool_size = {pool_size}\n"
            "max_client_conn = 200\n"
            # A client queued longer than this waits for a server connection
            # that transaction pooling should have freed long ago.
            "query_wait_timeout = 30\n"
        )
        for path in (config, users):
            path.chmod(0o644)
        log_path = folder / f"pgbouncer-{listen}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [PGBOUNCER, *_run_as(host), str(config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        bouncer = PgBouncer(
            proc=proc, port=listen, log_path=log_path,
            url=f"postgresql://{user}@127.0.0.1:{listen}/{database}",
        )
        started.append(bouncer)
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"pgbouncer exited with {proc.returncode}:\n{bouncer.log()}")
            with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", listen), timeout=0.5
            ):
                return bouncer
            if time.monotonic() > deadline:
                raise AssertionError(f"pgbouncer not listening after 20 s:\n{bouncer.log()}")
            time.sleep(0.05)

    try:
        yield start
    finally:
        for bouncer in started:
            if bouncer.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(bouncer.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                bouncer.proc.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def _parked(metrics: str) -> int:
    for line in metrics.splitlines():
        if line.startswith("leaseq_waiting_receivers "):
            return int(float(line.split()[1]))
    raise AssertionError("no leaseq_waiting_receivers in /metrics")


async def _server_backends(database_url: str, database: str) -> dict[str, int]:
    """The database's client backends by application_name."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT application_name, count(*) AS n FROM pg_stat_activity"
            " WHERE datname = $1 AND backend_type = 'client backend'"
            " AND pid <> pg_backend_pid() GROUP BY 1",
            database,
        )
    finally:
        await conn.close()
    return {row["application_name"]: row["n"] for row in rows}


async def test_the_message_cycle_through_transaction_pooling(
    pgbouncers: StartPgBouncer, services: ServiceProcesses, database_url: str, tmp_path: Path
) -> None:
    bouncer = pgbouncers("transaction")
    command = (
        "env", "LEASEQ_PGBOUNCER=transaction", f"LEASEQ_LISTEN_URL={database_url}",
        f"LEASEQ_SECRET={TEST_SECRET}", LEASEQ,
    )
    # One after the other: each start migrates under a session-level advisory
    # lock (alembic/env.py), which transaction pooling does not keep (docs/deploy.md).
    one = services.start(tmp_path / "one", database_url=bouncer.url, command=command)
    one.wait_healthy()
    two = services.start(tmp_path / "two", database_url=bouncer.url, command=command)
    two.wait_healthy()
    timeout = httpx.Timeout(30.0)
    async with (
        httpx.AsyncClient(base_url=one.url, timeout=timeout) as first,
        httpx.AsyncClient(base_url=two.url, timeout=timeout) as second,
    ):
        for client in (first, second):
            assert (await client.get("/readyz")).status_code == 200, one.log() + two.log()
        created = await first.post("/v1/queues", json={"name": "jobs", "visibility_timeout": 30})
        assert created.status_code == 201, created.text

        # A long poll parked in one process, woken by a send through the other:
        # the wake-up crosses only by NOTIFY, heard on the direct LISTEN connection.
        waiting = asyncio.create_task(first.get("/v1/queues/jobs/receive", params={"wait": 20}))
        deadline = time.monotonic() + 10
        while _parked((await first.get("/metrics")).text) < 1:
            assert time.monotonic() < deadline, "the receive never started waiting"
            await asyncio.sleep(0.02)
        started = time.monotonic()
        sent = await second.post("/v1/queues/jobs/messages", json={"body": "across"})
        assert sent.status_code == 201, sent.text
        answer = await waiting
        woken_after = time.monotonic() - started
        assert answer.status_code == 200, answer.text
        messages = answer.json()["messages"]
        assert [m["body"] for m in messages] == ["across"], (
            f"the long poll was not woken by the NOTIFY (answered after {woken_after:.1f} s)"
        )
        assert woken_after < 5, f"woken after {woken_after:.1f} s: not by the NOTIFY"
        (message,) = messages
        handle = message["receipt_handle"]

        # Heartbeat through one process, acknowledge through the other.
        beat = await second.patch(
            f"/v1/queues/jobs/messages/{handle}/visibility", json={"timeout": 60}
        )
        assert beat.status_code == 200, beat.text
        assert (await first.delete(f"/v1/queues/jobs/messages/{handle}")).status_code == 204
        lost = await second.delete(f"/v1/queues/jobs/messages/{handle}")
        assert (lost.status_code, lost.json()["code"]) == (409, "lease_lost")

        # Batches: send ten, receive them, acknowledge them in one request.
        batch = await first.post(
            "/v1/queues/jobs/messages",
            json={"messages": [{"body": f"b{i}"} for i in range(10)]},
        )
        assert batch.status_code == 200 and batch.json()["succeeded"] == 10, batch.text
        got: list[dict[str, Any]] = []
        while len(got) < 10:
            page = await second.get("/v1/queues/jobs/receive", params={"max": 10, "wait": 2})
            assert page.status_code == 200, page.text
            assert page.json()["messages"], "batch messages missing"
            got += page.json()["messages"]
        assert sorted(m["body"] for m in got) == sorted(f"b{i}" for i in range(10))
        deleted = await first.post(
            "/v1/queues/jobs/messages/delete",
            json={"receipt_handles": [m["receipt_handle"] for m in got]},
        )
        assert deleted.status_code == 200 and deleted.json()["succeeded"] == 10, deleted.text

        # Concurrent clients on both processes: 8 senders, 8 receivers, 400 messages.
        senders, per_sender = 8, 50
        total = senders * per_sender
        delivered: Counter[str] = Counter()
        acknowledged: set[str] = set()

        async def produce(index: int) -> None:
            client = (first, second)[index % 2]
            for n in range(per_sender):
                response = await client.post(
                    "/v1/queues/jobs/messages", json={"body": f"m{index}-{n}"}
                )
                assert response.status_code == 201, response.text

        async def consume(index: int) -> None:
            client = (second, first)[index % 2]
            deadline = time.monotonic() + 60
            while len(acknowledged) < total and time.monotonic() < deadline:
                page = await client.get("/v1/queues/jobs/receive", params={"max": 10, "wait": 1})
                assert page.status_code == 200, page.text
                messages = page.json()["messages"]
                if not messages:
                    continue
                delivered.update(m["body"] for m in messages)
                response = await client.post(
                    "/v1/queues/jobs/messages/delete",
                    json={"receipt_handles": [m["receipt_handle"] for m in messages]},
                )
                assert response.status_code == 200, response.text
                for entry, m in zip(response.json()["results"], messages, strict=True):
                    if entry["ok"]:
                        acknowledged.add(m["body"])

        await asyncio.gather(
            *(produce(i) for i in range(senders)), *(consume(i) for i in range(senders))
        )
    expected = {f"m{i}-{n}" for i in range(senders) for n in range(per_sender)}
    lost_bodies = expected - acknowledged
    duplicated = sum(count - 1 for count in delivered.values())
    print(
        f"through pgbouncer (transaction pooling): sent={total} "
        f"acknowledged={len(acknowledged)} delivered={sum(delivered.values())} "
        f"lost={len(lost_bodies)} duplicated={duplicated}"
    )
    assert not lost_bodies, f"lost {len(lost_bodies)}: {sorted(lost_bodies)[:10]}"
    # Leases of 30 s never lapse here: a duplicate would be a claim given twice.
    assert duplicated == 0
    assert set(delivered) == expected

    # It went through PgBouncer: the pools' connections are its few server
    # connections, and the LISTEN, maintenance lock and epoch connections (direct,
    # on LEASEQ_LISTEN_URL) are the services' own.
    database = str(make_url(database_url).database)
    backends = await _server_backends(database_url, database)
    direct = ("leaseq-listener", "leaseq-maintenance", "leaseq-epochs")
    assert all(backends.get(name) == 2 for name in direct), backends
    pooled = sum(n for name, n in backends.items() if name not in direct)
    assert 0 < pooled <= SERVER_POOL, backends
    for service in (one, two):
        log = service.full_log()
        assert "prepared statement" not in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]


async def test_transaction_pooling_needs_the_statement_cache_off(
    pgbouncers: StartPgBouncer,
) -> None:
    """asyncpg's cached statement, prepared on one server connection, is gone
    when the client's next transaction runs on another; with
    LEASEQ_PGBOUNCER=transaction, more clients than server connections share
    them, in and out of transactions."""
    bouncer = pgbouncers("transaction", pool_size=2)
    cached, other = [await asyncpg.connect(bouncer.url) for _ in range(2)]
    try:
        assert await cached.fetchval("SELECT $1::int", 1) == 1  # prepared on server 1
        await other.execute("BEGIN")  # holds server 1
        with pytest.raises(asyncpg.InvalidSQLStatementNameError, match="does not exist"):
            await cached.fetchval("SELECT $1::int", 2)  # on server 2
        await other.execute("ROLLBACK")
    finally:
        for conn in (cached, other):
            await conn.close()

    engine = create_engine(bouncer.url, pool_size=6, dial=_DIAL, pgbouncer="transaction")
    try:
        async def statements(n: int) -> list[int]:
            async with engine.connect() as conn:
                raw = await conn.get_raw_connection()
                driver = raw.driver_connection
                assert driver is not None
                values = []
                for i in range(20):
                    values.append(await driver.fetchval("SELECT $1::int * 2", n * 100 + i))
                async with driver.transaction():
                    await driver.execute("SELECT pg_advisory_xact_lock(42)")
                    values.append(await driver.fetchval("SELECT $1::int", -n))
                return values

        results = await asyncio.gather(*(statements(n) for n in range(6)))
    finally:
        await engine.dispose()
    for n, values in enumerate(results):
        assert values == [(n * 100 + i) * 2 for i in range(20)] + [-n]


async def test_pgbouncer_refuses_plan_cache_mode_as_a_startup_parameter(
    pgbouncers: StartPgBouncer,
) -> None:
    """Without LEASEQ_PGBOUNCER the engine cannot connect through PgBouncer at
    all; in session mode it SETs plan_cache_mode instead, per pool."""
    bouncer = pgbouncers("session")
    plain = create_engine(bouncer.url, pool_size=1, dial=_DIAL, pgbouncer="off")
    try:
        with pytest.raises(Exception, match="unsupported startup parameter: plan_cache_mode"):
            async with plain.connect():
                pass
    finally:
        await plain.dispose()
    for cached_plans, expected in ((False, "force_custom_plan"), (True, "auto")):
        engine = create_engine(
            bouncer.url, pool_size=1, dial=_DIAL, pgbouncer="session",
            cached_plans=cached_plans,
        )
        try:
            async with engine.connect() as conn:
                raw = await conn.get_raw_connection()
                assert raw.driver_connection is not None
                assert await raw.driver_connection.fetchval("SHOW plan_cache_mode") == expected
                name = await raw.driver_connection.fetchval("SHOW application_name")
                assert name == "leaseq"
        finally:
            await engine.dispose()
