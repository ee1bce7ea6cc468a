"""Connecting to one of several database hosts when one of them hangs
(app/db/hosts.py): each host has its own connect timeout, the host that answered
last is tried first, and every TCP connection is watched for a vanished peer.

The hanging host is a local socket that accepts and never answers, as a
PostgreSQL whose machine froze would; the answering one a TCP forwarder to the
test server (the embedded server listens on a Unix socket only)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.engine import make_url

from app.config import Settings
from app.db.engine import connect, dialer, single_host_dsns
from app.db.hosts import Dialer


class Silent:
    """Accepts connections and never says a word."""

    def __init__(self) -> None:
        self.accepted = 0
        self._held: list[asyncio.StreamWriter] = []

    async def __call__(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._held.append(writer)

    def close(self) -> None:
        for writer in self._held:
            writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def _server(handler: object) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)  # type: ignore[arg-type]
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


def _forwarder(database_url: str) -> object:
    url = make_url(database_url)
    socket_dir = url.query.get("host")

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if isinstance(socket_dir, str) and socket_dir.startswith("/"):
            upstream = await asyncio.open_unix_connection(
                f"{socket_dir}/.s.PGSQL.{url.query.get('port', 5432)}")
        else:
            upstream = await asyncio.open_connection(url.host or "127.0.0.1", url.port or 5432)
        await asyncio.gather(_pipe(reader, upstream[1]), _pipe(upstream[0], writer))

    return forward


def _two_hosts(database_url: str, silent: int, answering: int) -> str:
    url = make_url(database_url)
    return (f"postgresql://{url.username or 'postgres'}@127.0.0.1:{silent},"
            f"127.0.0.1:{answering}/{url.database}")


async def test_a_hanging_first_host_costs_its_own_timeout_then_is_passed_over(
    database_url: str,
) -> None:
    silent = Silent()
    async with _server(silent) as hanging, _server(_forwarder(database_url)) as answering:
        dial = Dialer(connect_timeout=0.5, dead_peer_seconds=10)
        hosts = {"host": ["127.0.0.1", "127.0.0.1"], "port": [hanging, answering]}
        url = make_url(database_url)
        started = time.monotonic()
        conn = await dial(user=url.username or "postgres", database=url.database, **hosts)
        # asyncpg alone spends its whole timeout (60 s) on the first host.
        assert time.monotonic() - started < 10
        assert await conn.fetchval("SELECT 1") == 1 and silent.accepted == 1
        await conn.close()
        again = await dial(user=url.username or "postgres", database=url.database, **hosts)
        assert silent.accepted == 1, "the host that answered last is tried first"
        await again.close()
    silent.close()


async def test_the_service_connect_takes_libpq_multi_host_urls(
    database_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LEASEQ_DB_CONNECT_TIMEOUT_SECONDS", "0.5")
    dial = dialer(Settings())
    assert dial.connect_timeout == 0.5
    silent = Silent()
    async with _server(silent) as hanging, _server(_forwarder(database_url)) as answering:
        conn = await connect(_two_hosts(database_url, hanging, answering), dial,
                             server_settings={"application_name": "leaseq-test"})
        try:
            assert await conn.fetchval("SHOW application_name") == "leaseq-test"
            assert silent.accepted == 1
            # Watched for a vanished peer: keepalives, and unacknowledged data
            # given up on, within LEASEQ_DB_DEAD_PEER_SECONDS (10 s by default).
            sock = conn._transport.get_extra_info("socket")  # type: ignore[attr-defined]
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 5
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 10_000
        finally:
            await conn.close()
        # The next connection of the process (a LISTEN reconnecting, the fleet
        # lock's) starts with the host that answered.
        again = await connect(_two_hosts(database_url, hanging, answering), dial)
        await again.close()
        assert silent.accepted == 1
    silent.close()


async def test_every_host_down_raises_the_last_failure() -> None:
    silent = Silent()
    async with _server(silent) as hanging:
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            refused = closed.getsockname()[1]
        dial = Dialer(connect_timeout=0.3, dead_peer_seconds=10)
        with pytest.raises((OSError, TimeoutError)):
            await dial(user="postgres", database="x", host=["127.0.0.1"] * 2,
                       port=[refused, hanging])
        assert silent.accepted == 1
    silent.close()


def test_single_host_dsns_split_libpq_and_sqlalchemy_forms() -> None:
    assert single_host_dsns(
        "postgresql://u:p%40ss@db1:5433,db2/queue?target_session_attrs=read-write"
    ) == ["postgresql://u:p%40ss@db1:5433/queue?target_session_attrs=read-write",
          "postgresql://u:p%40ss@db2:5432/queue?target_session_attrs=read-write"]
    assert single_host_dsns("postgresql://u@/d?host=a:1&host=b:2") == [
        "postgresql://u@a:1/d", "postgresql://u@b:2/d"]
    one = "postgresql://postgres@/leaseq?host=/tmp/leaseq-pg-x&port=5432"
    assert [make_url(d) for d in single_host_dsns(one)] == [make_url(one)]


def test_the_dialer_follows_the_settings() -> None:
    made = dialer(Settings(db_connect_timeout_seconds=2.5, db_dead_peer_seconds=30))
    assert (made.connect_timeout, made.dead_peer_seconds) == (2.5, 30)
    assert dialer(Settings(db_connect_timeout_seconds=2.5, db_dead_peer_seconds=30)) is made
