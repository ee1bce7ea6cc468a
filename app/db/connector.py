"""The one way leaseq runs SQL: named queries on the driver, errors translated here.

Every statement of the engine and of the key store goes through a Session of
this module. SQLAlchemy lends the pool (and Alembic the migrations); the
statements themselves run on asyncpg directly, with their parameters passed
positionally and their rows read by column name (`row["id"]`). Whatever the
driver or the pool raises leaves this module as one of the engine's errors:
a connection that cannot be had or was lost is DatabaseUnavailable (503 at the
doors), a broken constraint is ConstraintViolation (which the engine turns into
the domain error it means: a queue deleted meanwhile, a queue still in use).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import asyncpg
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

from app.db.engine import connect
from app.db.hosts import Dialer
from app.db.queries import Query
from app.errors import DatabaseUnavailable, LeaseqError

Row = Mapping[str, Any]
"""A result row of no declared type (asyncpg's Record). A statement's own row
is the TypedDict its Query names (app/db/queries.py)."""

R = TypeVar("R")

_NO_PARAMS: Mapping[str, Any] = {}

CONNECTION_ERRORS = (
    OSError,
    asyncio.TimeoutError,
    # Starting up, shutting down, in recovery: "the database system is ...".
    asyncpg.exceptions.CannotConnectNowError,
    # SQLSTATE class 08, ConnectionDoesNotExistError among them.
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.AdminShutdownError,
    # Another server process crashed: the server restarts, every session ends.
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.IdleSessionTimeoutError,
    # A connection on a standby (a failover under way, or a DATABASE_URL whose
    # hosts are not narrowed by target_session_attrs=read-write): dropped, its
    # replacement connects to whichever host is the primary now.
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    asyncpg.exceptions.InterfaceError,
    # The protocol state of a connection whose server process went away under
    # an operation ("another operation is in progress"): the connection is dead.
    asyncpg.exceptions.InternalClientError,
    # Connection set-up refused: a wrong database name or credentials.
    asyncpg.exceptions.InvalidCatalogNameError,
    asyncpg.exceptions.InvalidAuthorizationSpecificationError,
)


STATEMENT_ERRORS = (asyncpg.PostgresError, *CONNECTION_ERRORS)
"""What a statement on a connection of its own (the LISTEN connection's) may
raise: the server's refusal or the connection's loss."""


async def pass_lock(conn: asyncpg.Connection, key: tuple[int, int], timeout_ms: int) -> bool:
    """Takes the transaction-level advisory lock `key` exclusively and lets it go
    at once: every transaction that held it shared before has ended. False when
    that took more than `timeout_ms`."""
    try:
        async with conn.transaction():
            await conn.execute(f"SET LOCAL lock_timeout = {int(timeout_ms)}")
            await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", *key)
    except asyncpg.LockNotAvailableError:
        return False
    return True


class DatabaseError(Exception):
    """PostgreSQL refused a statement (not a lost connection: DatabaseUnavailable);
    `sqlstate` is its error code."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class ConstraintViolation(DatabaseError):
    """A statement broke an integrity constraint; `constraint` names it."""

    def __init__(self, constraint: str | None) -> None:
        super().__init__(f"constraint {constraint} violated")
        self.constraint = constraint


SERIALIZATION_RETRY_SECONDS = 5.0


class Router(Protocol):
    """What a statement is run as (app/queue/generations.py: the tables of the
    generations this process acts by), and the ticket its end is reported with."""

    def enter(self, query: Query[R]) -> tuple[Query[R], int]: ...

    def leave(self, ticket: int) -> None: ...


class Session:
    """One connection: each statement its own transaction, unless the session
    came from Connector.transaction()."""

    __slots__ = ("_driver", "_router")

    def __init__(self, driver: asyncpg.Connection, router: Router | None = None) -> None:
        self._driver = driver
        self._router = router

    async def fetch(self, query: Query[R], params: Mapping[str, Any] = _NO_PARAMS) -> list[R]:
        rows: list[R] = await self._run(self._driver.fetch, query, params)
        return rows

    async def fetchrow(
        self, query: Query[R], params: Mapping[str, Any] = _NO_PARAMS
    ) -> R | None:
        rows = await self.fetch(query, params)
        return rows[0] if rows else None

    async def fetchval(self, query: Query[Any], params: Mapping[str, Any] = _NO_PARAMS) -> Any:
        """The first column of the first row (None: no row)."""
        rows: list[Any] = await self.fetch(query, params)
        return rows[0][0] if rows else None

    async def execute(self, query: Query[Any], params: Mapping[str, Any] = _NO_PARAMS) -> int:
        """Runs a statement for its effect; the number of rows it touched."""
        status: str = await self._run(self._driver.execute, query, params)
        count = status.rpartition(" ")[2]
        return int(count) if count.isdigit() else 0

    async def _run(
        self, method: Callable[..., Awaitable[Any]], query: Query[Any], params: Mapping[str, Any]
    ) -> Any:
        router = self._router
        ticket = 0
        if router is not None:
            query, ticket = router.enter(query)
        try:
            args = [params[name] for name in query.params]
            deadline = None
            while True:
                try:
                    return await method(query.sql, *args)
                except asyncpg.SerializationError as exc:
                    # A row it waited for was moved to another partition (the
                    # rotation of generations, a batch of rows at a time): a
                    # statement that is its own transaction did nothing, and
                    # run again it finds the row where it went. One of many
                    # rows (a heartbeat of a hundred leases) may meet several
                    # batches of one drain, which lasts a fraction of a second.
                    now = time.monotonic()
                    deadline = deadline or now + SERIALIZATION_RETRY_SECONDS
                    if now < deadline and not self._driver.is_in_transaction():
                        continue
                    raise DatabaseUnavailable(
                        "A row this request waited for was moved meanwhile; try again."
                    ) from exc
        except asyncpg.PostgresError as exc:
            raise _refused(query, exc) from exc
        finally:
            if router is not None:
                router.leave(ticket)


def _refused(query: Query[Any], exc: asyncpg.PostgresError) -> Exception:
    if isinstance(exc, asyncpg.IntegrityConstraintViolationError):
        return ConstraintViolation(getattr(exc, "constraint_name", None))
    if isinstance(exc, CONNECTION_ERRORS):
        return exc  # the checkout turns it into DatabaseUnavailable
    return DatabaseError(f"{query.name}: {exc}", getattr(exc, "sqlstate", None))


class Connector:
    """Sessions on the pools of SQLAlchemy engines: `engine`'s connections plan
    every statement for its parameters (app/db/engine.py); `cached`'s, when
    given, keep PostgreSQL's cached plans, for the statements marked so."""

    def __init__(self, engine: AsyncEngine, cached: AsyncEngine | None = None) -> None:
        self.engine = engine
        self.cached_engine = cached
        self.router: Router | None = None
        """Set by the engine once it knows its generations' tables."""

    @property
    def pool_size(self) -> int:
        return _size(self.engine)

    @property
    def cached_pool_size(self) -> int:
        """Connections for statements with cached plans (those of the pool when
        there is no second one)."""
        return _size(self.engine if self.cached_engine is None else self.cached_engine)

    @contextlib.asynccontextmanager
    async def session(self, *, cached_plans: bool = False) -> AsyncIterator[Session]:
        """A connection whose every statement is its own transaction. For work
        whose every write is one statement: a notification issued by a later
        statement is then delivered after the write it announces is committed.
        `cached_plans`: one of the connections for statements marked `-- plan:
        cached`, and only those."""
        pool = self.cached_engine if cached_plans and self.cached_engine else self.engine
        async with self._checkout(pool) as driver:
            yield Session(driver, self.router)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Session]:
        """A connection in one transaction, committed when the block ends."""
        async with self._checkout(self.engine) as driver, driver.transaction():
            yield Session(driver, self.router)

    async def fetch(self, query: Query[R], params: Mapping[str, Any] = _NO_PARAMS) -> list[R]:
        """One statement on a connection of its own."""
        async with self.session(cached_plans=query.cached_plan) as session:
            return await session.fetch(query, params)

    async def ping(self) -> None:
        """A statement on each pool."""
        for engine in (self.engine, self.cached_engine):
            if engine is not None:
                async with self._checkout(engine) as driver:
                    await driver.fetchval("SELECT 1")

    @contextlib.asynccontextmanager
    async def _checkout(self, pool: AsyncEngine) -> AsyncIterator[asyncpg.Connection]:
        # The driver's connection straight from the pool, without SQLAlchemy's
        # Connection around it: statements run on asyncpg, which commits each
        # on its own unless a transaction is begun on it, so the wrapper's
        # isolation level and transaction bookkeeping had nothing to do, and
        # cost 180 us a checkout against 45-80 (docs/performance.md).
        try:
            lent = await pool.raw_connection()
        except sa_exc.TimeoutError as exc:
            raise DatabaseUnavailable("No database connection became free in time.") from exc
        except sa_exc.DBAPIError as exc:
            # Raised by the pool while connecting.
            if exc.connection_invalidated or isinstance(exc.orig, CONNECTION_ERRORS) or (
                isinstance(getattr(exc.orig, "__cause__", None), CONNECTION_ERRORS)
            ):
                raise DatabaseUnavailable() from exc
            raise
        except CONNECTION_ERRORS as exc:
            raise DatabaseUnavailable() from exc
        except Exception as exc:
            # The dialect's translation of a driver error met while connecting
            # (no host is the primary: TargetServerAttributeNotMatched).
            if isinstance(exc.__cause__, CONNECTION_ERRORS):
                raise DatabaseUnavailable() from exc
            raise
        driver: asyncpg.Connection = lent.driver_connection
        keep = True
        try:
            yield driver
        except Exception as exc:
            # A connection that died under a statement (whatever the error
            # said) must not be lent again.
            if not isinstance(exc, CONNECTION_ERRORS) and not driver.is_closed():
                raise
            keep = False
            if isinstance(exc, LeaseqError):
                raise
            raise DatabaseUnavailable() from exc
        finally:
            # Nor must a closed one, or one with a transaction left open (its
            # COMMIT or ROLLBACK cancelled midway), reach the next borrower.
            if keep and not driver.is_closed() and not driver.is_in_transaction():
                await greenlet_spawn(lent.close)  # back to the pool
            else:
                with contextlib.suppress(Exception):
                    await greenlet_spawn(lent.invalidate)


def _size(engine: AsyncEngine) -> int:
    size = getattr(engine.pool, "size", None)
    return int(size()) if callable(size) else 4


@contextlib.asynccontextmanager
async def listening(
    url: str, channel: str, on_notify: Callable[[str], None], *, name: str, dial: Dialer
) -> AsyncIterator[tuple[asyncio.Event, asyncpg.Connection]]:
    """A connection of its own LISTENing on `channel`, and an event set when it
    is lost. A LISTEN cannot share the pool: it must outlive every request."""
    lost = asyncio.Event()
    conn = await connect(url, dial, server_settings={"application_name": name})
    try:
        conn.add_termination_listener(lambda _conn: lost.set())
        await conn.add_listener(
            channel, lambda _conn, _pid, _channel, text: on_notify(text)
        )
        yield lost, conn
    finally:
        if not conn.is_closed():
            conn.terminate()
