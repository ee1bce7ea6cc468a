"""Real PostgreSQL for every test: the embedded server by default, DATABASE_URL when set.

The schema is built once by the Alembic migrations into a template database;
each test that writes gets its own `CREATE DATABASE ... TEMPLATE` copy, so tests
with real commits, several connections, SKIP LOCKED and LISTEN/NOTIFY stay
isolated from each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import sandbox_home
import uvicorn
from processes import ServiceProcesses
from sqlalchemy.engine import make_url
from sqs_clients import PROTOCOLS
from sqs_clients import client as sqs_client
from support import TEST_SECRET, wait_until

from app.config import Settings
from app.db.embedded import EmbeddedPostgres, remove
from app.db.engine import plain_url
from app.db.migrate import upgrade
from app.main import create_app
from leaseq import AsyncClient

# The helpers that split test files share, imported by the test modules after
# this file: their asserts report what they compared, as a test's own do.
pytest.register_assert_rewrite("validation_support", "worker_support", "sqs_fifo_support",
                               "dashboard_support")

# Before any test reads a setting: the session's own home (tests/sandbox_home.py).
SANDBOX = sandbox_home.enter()

EXTERNAL_URL = os.environ.get("DATABASE_URL") or None

_DATABASE_FIXTURES = frozenset({"server_url", "template_db", "database_url"})


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite never writes into the user's real leaseq data directory: a run
    that did fails, naming what it touched."""
    touched = SANDBOX.real_changes()
    if touched:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nthe test suite changed the user's data directory "
              f"{SANDBOX.real_data_dir}: {sorted(touched)}")
    shutil.rmtree(SANDBOX.home, ignore_errors=True)
    shutil.rmtree(SANDBOX.embedded_root, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Puts every test in its tier: e2e where the test says so (it runs real
    processes), integration where it uses PostgreSQL, unit otherwise."""
    for item in items:
        if item.get_closest_marker("e2e") is not None:
            continue
        fixtures = set(getattr(item, "fixturenames", ()))
        tier = pytest.mark.integration if fixtures & _DATABASE_FIXTURES else pytest.mark.unit
        item.add_marker(tier)


def with_database(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A URL of the PostgreSQL server the tests use (its maintenance database).

    The embedded server's data directory lives outside pytest's temporary root,
    which a later pytest session on the machine may clear while this one runs."""
    if EXTERNAL_URL is not None:
        yield plain_url(EXTERNAL_URL)
        return
    folder = Path(tempfile.mkdtemp(prefix="leaseq-test-pg-"))
    server = EmbeddedPostgres(folder, database="postgres")
    server.start()
    try:
        yield server.dsn()
    finally:
        server.stop()
        remove(folder)


async def _admin(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def template_db(server_url: str) -> Iterator[str]:
    """A database migrated to head by Alembic, used as the template of test databases."""
    name = f"leaseq_tpl_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(server_url, f'CREATE DATABASE "{name}"'))
    upgrade(with_database(server_url, name))
    try:
        yield name
    finally:
        asyncio.run(_admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
                           drop_sql_api_role(name)))


def drop_sql_api_role(database: str) -> str:
    """A statement dropping the SQL API's role of `database` (migration 0018), once
    the database is gone: roles belong to the server, and would pile up there."""
    role = "leaseq_sql_api_" + hashlib.md5(database.encode()).hexdigest()[:12]
    return (f'DO $$ BEGIN DROP ROLE IF EXISTS "{role}"; '
            "EXCEPTION WHEN dependent_objects_still_exist THEN NULL; END $$")


@pytest.fixture
async def empty_database(server_url: str) -> AsyncIterator[str]:
    """A database of its own for one test, with nothing in it: migrations start here."""
    name = f"leaseq_m_{uuid.uuid4().hex[:10]}"
    await _admin(server_url, f'CREATE DATABASE "{name}"')
    try:
        yield with_database(server_url, name)
    finally:
        await _admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
                     drop_sql_api_role(name))


@pytest.fixture
async def database_url(server_url: str, template_db: str) -> AsyncIterator[str]:
    """A fresh, migrated database of its own for one test."""
    name = f"leaseq_t_{uuid.uuid4().hex[:12]}"
    await _admin(server_url, f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    try:
        yield with_database(server_url, name)
    finally:
        await _admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def settings_factory(database_url: str, tmp_path: Path) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "database_url": database_url,
            "data_dir": tmp_path / "data",
            "secret": TEST_SECRET,
            # The in-process clients call the app as http://leaseq.test.
            "allowed_hosts": "leaseq.test,localhost,127.0.0.1",
            # Tests send many messages in one request; the default (10) is
            # tested in rest/test_validation_batches_and_request_size.py.
            "max_batch": 100,
            # Tests that want the retention sweeper set their own interval.
            "retention_sweep_seconds": 3600,
        }
        values.update(overrides)
        return Settings(**values)

    return make


AppClient = Callable[..., Awaitable[httpx.AsyncClient]]


@pytest.fixture
async def app_factory(settings_factory: Callable[..., Settings]) -> AsyncIterator[AppClient]:
    """Builds apps (lifespan entered) with httpx clients through the ASGI transport."""
    stack: list[tuple[Any, httpx.AsyncClient]] = []

    async def make(**overrides: Any) -> httpx.AsyncClient:
        app = create_app(settings_factory(**overrides))
        lifespan = app.router.lifespan_context(app)
        await lifespan.__aenter__()
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://leaseq.test", timeout=60
        )
        client.app = app  # type: ignore[attr-defined]
        stack.append((lifespan, client))
        await app.state.listener.connected.wait()
        return client

    yield make
    for lifespan, client in reversed(stack):
        await client.aclose()
        await lifespan.__aexit__(None, None, None)


@pytest.fixture
async def client(app_factory: AppClient) -> httpx.AsyncClient:
    return await app_factory()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A direct connection to the test's database, for looking behind the API."""
    conn = await asyncpg.connect(plain_url(database_url))
    try:
        yield conn
    finally:
        await conn.close()


ServeApp = Callable[..., Awaitable[tuple[str, Any]]]


@pytest.fixture
async def serve_factory(settings_factory: Any) -> AsyncIterator[ServeApp]:
    """Serves apps (settings overrides as keywords) behind real uvicorn servers on
    free ports, in this event loop: (base URL, app)."""
    servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []

    async def serve(**overrides: Any) -> tuple[str, Any]:
        app = create_app(settings_factory(**overrides))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        )
        task = asyncio.create_task(server.serve())
        servers.append((server, task))
        await wait_until(lambda: server.started, seconds=20)
        return f"http://127.0.0.1:{port}", app

    yield serve
    for server, task in reversed(servers):
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def served(serve_factory: ServeApp) -> tuple[str, Any]:
    """The app behind a real uvicorn server on a free port, in this event loop."""
    return await serve_factory()


@pytest.fixture
async def api(served: tuple[str, Any]) -> AsyncIterator[AsyncClient]:
    """The Python client on `served`."""
    async with AsyncClient(served[0]) as client:
        yield client


@pytest.fixture
def url(served: tuple[str, Any]) -> str:
    """`served`'s base URL."""
    return served[0]


@pytest.fixture
def services(tmp_path: Path) -> Iterator[ServiceProcesses]:
    """Service processes of their own (tests/processes.py), stopped after the test."""
    with ServiceProcesses(tmp_path) as started:
        yield started


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    """Each of the SQS door's protocols in turn."""
    return str(request.param)


@pytest.fixture
def sqs(protocol: str, served: tuple[str, Any]) -> Any:
    """A boto3 SQS client on `served`, in `protocol`."""
    return sqs_client(served[0], protocol)
