"""The SQLAlchemy async engine (asyncpg) and the URL it connects to."""

from __future__ import annotations

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.config import Settings, get_settings


def asyncpg_url(url: str) -> str:
    """Any postgres URL as SQLAlchemy's asyncpg form."""
    parsed = make_url(url)
    return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def plain_url(url: str) -> str:
    """A URL asyncpg.connect() itself understands (for the LISTEN connection)."""
    parsed = make_url(url)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def resolve_database_url() -> str:
    url = get_settings().database_url
    if url is None:
        raise RuntimeError("no DATABASE_URL: run through `leaseq serve` or set DATABASE_URL")
    return url


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


def create_engine(
    url: str,
    *,
    pool_size: int,
    pool_timeout: float = Settings.model_fields["pool_wait_seconds"].default,
    cached_plans: bool = False,
) -> AsyncEngine:
    return create_async_engine(
        asyncpg_url(url),
        pool_size=pool_size,
        max_overflow=0,
        pool_pre_ping=False,
        # No connection free for this long means the pool is starved; failing
        # fast as 503 beats a request hanging on it (app/queue/catalog.py).
        pool_timeout=pool_timeout,
        connect_args={
            "server_settings": CACHED_PLAN_SETTINGS if cached_plans else SERVER_SETTINGS
        },
    )
