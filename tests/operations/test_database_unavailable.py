"""A database that cannot be reached is 503 database_unavailable, never a 500."""

from __future__ import annotations

import socket
from pathlib import Path

import asyncpg
import httpx
from support import TEST_SECRET, make_queue, receive, send

from app.config import Settings
from app.main import create_app


async def test_unreachable_database_is_503(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = Settings(
        database_url=f"postgresql://postgres@127.0.0.1:{port}/nothing",
        data_dir=tmp_path,
        secret=TEST_SECRET,
        retention_sweep_seconds=3600,
        pool_wait_seconds=0.5,  # the start waits this long for the keys, then serves
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            for method, path, body in (
                ("GET", "/readyz", None),
                ("POST", "/v1/queues", {"name": "q"}),
                ("GET", "/v1/queues/q/receive", None),
                ("POST", "/v1/queues/q/messages", {"body": "x"}),
            ):
                response = await client.request(method, path, json=body)
                assert response.status_code == 503, (path, response.text)
                assert response.headers["content-type"] == "application/problem+json"
                assert response.json()["code"] == "database_unavailable"
            assert (await client.get("/healthz")).status_code == 200


async def test_killed_pool_connections_cost_at_most_a_503_each(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """Connections killed under the service fail the request using them with 503
    (never 500) and leave the pool; the service then works again."""
    queue = await make_queue(client)
    for _ in range(3):  # warm the pool: several connections in it
        await send(client, queue)
        assert await receive(client, queue, max=10)
    await db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = 'leaseq'"
    )
    statuses = []
    for _ in range(15):
        response = await client.post(f"/v1/queues/{queue}/messages", json={"body": "again"})
        statuses.append(response.status_code)
        got = await client.get(f"/v1/queues/{queue}/receive", params={"max": 10})
        statuses.append(got.status_code)
    assert set(statuses) <= {201, 200, 503}, statuses
    assert statuses[-4:] == [201, 200, 201, 200], statuses


async def test_a_connection_on_a_standby_is_503_and_replaced(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """A pool connection that reached a read-only server (a standby, during a
    failover: docs/deploy.md) answers 503 database_unavailable with Retry-After,
    never 500, and leaves the pool: once the server takes writes, the next
    connection does."""
    queue = await make_queue(client)
    database = await db.fetchval("SELECT current_database()")
    kill = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = 'leaseq'")
    await db.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    await db.execute(kill)  # the pool's next connections start read-only
    try:
        for _ in range(12):  # more than the pool holds
            response = await client.post(f"/v1/queues/{queue}/messages", json={"body": "ro"})
            assert response.status_code == 503, response.text
            assert response.json()["code"] == "database_unavailable"
            assert response.headers["retry-after"] == "1"
    finally:
        await db.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
    await send(client, queue)
    assert await receive(client, queue)
