"""DATABASE_URL naming several hosts (docs/deploy.md, "PostgreSQL failover"):
libpq's form, `postgresql://user@h1:5432,h2:5432/db?target_session_attrs=read-write`,
which SQLAlchemy's make_url does not parse, reaches the pool (SQLAlchemy's
`?host=h1:p1&host=h2:p2`) and the LISTEN connection (asyncpg, which reads only
the last of several `host=`) with every host."""

from __future__ import annotations

import inspect

import pytest
from asyncpg.connect_utils import _parse_connect_dsn_and_args
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.engine import make_url

from app.db.engine import asyncpg_url, plain_url

URL = "postgresql://leaseq:p%40ss@db1:5433,db2/queue?target_session_attrs=read-write"


def _asyncpg_hosts(url: str) -> tuple[list[tuple[str, int]], str]:
    # asyncpg's own DSN parser (private: its keywords vary between versions).
    names = inspect.signature(_parse_connect_dsn_and_args).parameters
    addrs, params = _parse_connect_dsn_and_args(
        dsn=url, **{name: None for name in names if name != "dsn"}
    )
    return list(addrs), str(params.target_session_attrs.value)


def test_the_pool_gets_every_host_and_the_session_attrs() -> None:
    _, opts = PGDialect_asyncpg().create_connect_args(make_url(asyncpg_url(URL)))
    assert opts["host"] == ["db1", "db2"] and opts["port"] == [5433, 5432]
    assert opts["target_session_attrs"] == "read-write"
    assert (opts["user"], opts["password"], opts["database"]) == ("leaseq", "p@ss", "queue")


def test_the_listen_connection_gets_every_host() -> None:
    plain = plain_url(URL)
    assert plain == (
        "postgresql://leaseq:p%40ss@db1:5433,db2:5432/queue?target_session_attrs=read-write"
    )
    assert _asyncpg_hosts(plain) == ([("db1", 5433), ("db2", 5432)], "read-write")
    # SQLAlchemy's own multi-host form, given as DATABASE_URL, reaches asyncpg whole too.
    assert _asyncpg_hosts(plain_url("postgresql://u@/d?host=a:1&host=b:2"))[0] == [
        ("a", 1), ("b", 2)]
    assert _asyncpg_hosts(plain_url("postgresql://a:1,b:2/d"))[0] == [("a", 1), ("b", 2)]


@pytest.mark.parametrize("url", [
    "postgresql://u@db/leaseq",
    "postgresql://u:secret@db:6000/leaseq?sslmode=require",
    "postgresql://postgres@/leaseq?host=/tmp/leaseq-pg-x&port=5432",  # the embedded server
])
def test_a_single_host_url_is_unchanged(url: str) -> None:
    assert make_url(plain_url(url)) == make_url(url)
    assert make_url(asyncpg_url(url)) == make_url(url).set(drivername="postgresql+asyncpg")


@pytest.mark.parametrize("url", [
    "postgresql://u@db1:x,db2/leaseq",
    "postgresql://u@[::1]:5432,db2/leaseq",
    "postgresql://u@db1,db2/leaseq?host=db3",
])
def test_a_host_list_it_cannot_pass_on_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        asyncpg_url(url)
