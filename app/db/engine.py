"""The SQLAlchemy async engine (asyncpg) and the URL it connects to."""

from __future__ import annotations

import functools
import uuid
from typing import Any

import asyncpg
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.config import PgBouncerMode, Settings
from app.db.hosts import Dialer


def parse_url(url: str) -> URL:
    """make_url, also for libpq's multi-host form (`postgresql://user@h1:5432,h2:5432/db
    ?target_session_attrs=read-write`, docs/deploy.md), which SQLAlchemy does not
    parse: its hosts become SQLAlchemy's `?host=h1:5432&host=h2:5432`, each with its
    port (5432 when it names none)."""
    scheme, sep, rest = url.partition("://")
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    userinfo, at, hostlist = rest[:end].rpartition("@")
    if not sep or "," not in hostlist:
        return make_url(url)
    hosts = []
    for item in hostlist.split(","):
        host, colon, port = item.rpartition(":") if ":" in item else (item, "", "")
        if not host or "[" in host or (colon and not port.isdigit()):
            raise ValueError(f"DATABASE_URL: {item!r} is not host:port (IPv6 hosts: use names)")
        hosts.append(f"{host}:{port or 5432}")
    parsed = make_url(f"{scheme}://{userinfo}{at}{rest[end:]}")
    if "host" in parsed.query or "port" in parsed.query:
        raise ValueError("DATABASE_URL names hosts both before the path and in its query")
    return parsed.set(query={**parsed.query, "host": tuple(hosts)})


def asyncpg_url(url: str) -> str:
    """Any postgres URL as SQLAlchemy's asyncpg form."""
    parsed = parse_url(url)
    return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


_HOSTS = "leaseq-hosts.invalid"


def plain_url(url: str) -> str:
    """A URL asyncpg.connect() itself understands (for the LISTEN connection).
    Several hosts are written libpq's way, `h1:p1,h2:p2` before the path: asyncpg
    reads only the last of several `host=` in a query."""
    parsed = parse_url(url).set(drivername="postgresql")
    hosts = parsed.query.get("host")
    if not isinstance(hosts, tuple):
        return parsed.render_as_string(hide_password=False)
    query = {key: value for key, value in parsed.query.items() if key != "host"}
    rendered = parsed.set(host=_HOSTS, query=query).render_as_string(hide_password=False)
    return rendered.replace(f"@{_HOSTS}", "@" + ",".join(hosts), 1).replace(
        f"://{_HOSTS}", "://" + ",".join(hosts), 1
    )


def dialer(settings: Settings) -> Dialer:
    """Connects host by host, each within LEASEQ_DB_CONNECT_TIMEOUT_SECONDS, and
    watches each connection for a vanished server (app/db/hosts.py). One per
    process for the same settings: the pools, the LISTEN connection and the fleet
    lock share which host answered last, so after a failover none of them pays
    the vanished host's timeout again on every reconnect."""
    return _dialer(settings.db_connect_timeout_seconds, settings.db_dead_peer_seconds)


@functools.lru_cache
def _dialer(connect_timeout: float, dead_peer_seconds: float) -> Dialer:
    return Dialer(connect_timeout=connect_timeout, dead_peer_seconds=dead_peer_seconds)


def single_host_dsns(url: str) -> list[str]:
    """One DSN asyncpg.connect() understands per host of `url` (libpq's
    multi-host form too), in order, each with the URL's user, database and query."""
    parsed = parse_url(url).set(drivername="postgresql")
    hosts = parsed.query.get("host")
    if not isinstance(hosts, tuple):
        return [parsed.render_as_string(hide_password=False)]
    query = {key: value for key, value in parsed.query.items() if key != "host"}
    dsns = []
    for item in hosts:
        host, _, port = item.rpartition(":")
        dsns.append(parsed.set(host=host, port=int(port), query=query)
                    .render_as_string(hide_password=False))
    return dsns


async def connect(url: str, dial: Dialer, **kwargs: Any) -> asyncpg.Connection:
    """A connection of its own, outside the pools (the LISTEN connection, the fleet
    lock), to any postgres URL: libpq's multi-host form too."""
    return await dial(dsn=single_host_dsns(url), **kwargs)


SERVER_SETTINGS = {
    "application_name": "leaseq",
    # asyncpg prepares and caches every statement. After five executions
    # PostgreSQL may switch a prepared statement to a generic plan and keep it:
    # planned on an empty table (a new or purged queue), the claim's generic
    # plan is a sequential scan, still used once the table holds millions of
    # rows, until an ANALYZE. Planning each execution with its parameters and
    # the table's current size costs far less than one such scan.
    "plan_cache_mode": "force_custom_plan",
}
CACHED_PLAN_SETTINGS = {**SERVER_SETTINGS, "plan_cache_mode": "auto"}
"""For the pool of statements marked `-- plan: cached` (app/db/queries.py):
their plans cannot turn bad, and planning each execution was a third of
PostgreSQL's CPU per message in the cycle (docs/performance.md)."""


def split_pool(pool_size: int) -> tuple[int, int]:
    """LEASEQ_POOL_SIZE as (connections planning every statement, connections
    keeping cached plans): half each. A pool under four is not split: a pool of
    one for sends, deletes and heartbeats could be taken whole by heartbeats."""
    if pool_size < 4:
        return pool_size, 0
    cached = pool_size // 2
    return pool_size - cached, cached


def _statement_name() -> str:
    # SQLAlchemy's own statements (its first-connect checks, Alembic's) are
    # named prepared statements even with its cache off; asyncpg numbers them
    # per process, so behind PgBouncer two processes' __asyncpg_stmt_1__ would
    # meet on one server connection ("already exists").
    return f"__leaseq_{uuid.uuid4().hex}__"


def connect_args(
    *, dial: Dialer, cached_plans: bool, pgbouncer: PgBouncerMode
) -> dict[str, Any]:
    """What asyncpg connects with, for LEASEQ_PGBOUNCER (docs/deploy.md).

    `off`: the server settings are startup parameters. Behind PgBouncer (any
    mode) only application_name may be: it refuses every startup parameter it
    does not track ("unsupported startup parameter: plan_cache_mode"), so in
    `session` mode plan_cache_mode is SET once connected (see create_engine).
    `transaction`: a client's next transaction may run on another server
    connection, so nothing may be prepared for later: asyncpg's statement cache
    is off, which makes it run every statement as the unnamed statement, parsed,
    bound and executed in one round (one Sync: PgBouncer keeps the server
    connection in between). plan_cache_mode is not needed then: an unnamed
    statement is planned for its parameters on every execution, what
    force_custom_plan asks for; the cached-plan pool keeps no plans either."""
    server_settings = CACHED_PLAN_SETTINGS if cached_plans else SERVER_SETTINGS
    # SQLAlchemy's dialect hands its connect to this instead of asyncpg.connect.
    dialing = {"async_creator_fn": dial}
    if pgbouncer == "off":
        return {"server_settings": server_settings, **dialing}
    args: dict[str, Any] = {
        "server_settings": {"application_name": server_settings["application_name"]},
        **dialing,
    }
    if pgbouncer == "transaction":
        args.update(
            statement_cache_size=0,
            prepared_statement_cache_size=0,
            prepared_statement_name_func=_statement_name,
        )
    return args


def create_engine(
    url: str,
    *,
    pool_size: int,
    dial: Dialer,
    pgbouncer: PgBouncerMode,
    pool_timeout: float = Settings.model_fields["pool_wait_seconds"].default,
    cached_plans: bool = False,
) -> AsyncEngine:
    """`pgbouncer`: the pool mode of a PgBouncer between us and PostgreSQL
    (LEASEQ_PGBOUNCER)."""
    engine = create_async_engine(
        asyncpg_url(url),
        pool_size=pool_size,
        max_overflow=0,
        pool_pre_ping=False,
        # No connection free for this long means the pool is starved; failing
        # fast as 503 beats a request hanging on it (app/queue/catalog.py).
        pool_timeout=pool_timeout,
        connect_args=connect_args(dial=dial, cached_plans=cached_plans, pgbouncer=pgbouncer),
    )
    if pgbouncer == "session":
        # The client keeps its server connection until it disconnects (PgBouncer
        # then resets it), so a SET lasts as long as the connection.
        plan_cache_mode = (CACHED_PLAN_SETTINGS if cached_plans else SERVER_SETTINGS)[
            "plan_cache_mode"
        ]

        @event.listens_for(engine.sync_engine, "connect")
        def _set_plan_cache_mode(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.run_async(
                lambda driver: driver.execute(f"SET plan_cache_mode = {plan_cache_mode}")
            )

    return engine


def engine_for(settings: Settings, *, pool_size: int, url: str | None = None) -> AsyncEngine:
    """An engine for a command that is not the service (the CLI's, `leaseq
    doctor`'s) on `url` or settings' DATABASE_URL, dialing as the service does."""
    url = url or settings.database_url
    if url is None:
        raise RuntimeError("no DATABASE_URL: run through `leaseq serve` or set DATABASE_URL")
    return create_engine(
        url, pool_size=pool_size, dial=dialer(settings),
        pgbouncer=settings.pgbouncer, pool_timeout=settings.pool_wait_seconds,
    )
