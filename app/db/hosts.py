"""Connecting to one of DATABASE_URL's hosts, and noticing one that vanished.

asyncpg's own multi-host connect spends its one `timeout` on all the hosts
together, in the order given. When the first host's machine is gone (no RST,
no ICMP: its SYNs are simply never answered) the whole timeout goes on it and
the standby promoted in its place is never tried. libpq's `connect_timeout`
is per host; so is ours (LEASEQ_DB_CONNECT_TIMEOUT_SECONDS), and the host
that answered last is tried first, so after a failover new connections stop
paying the vanished host's timeout.

A connection already open to a host that vanishes would wait for its answer
as long as the kernel retransmits (about 15 minutes): nothing closes it. Each
TCP connection therefore gets keepalives (an idle connection is probed, and
one whose probes go unanswered fails) and TCP_USER_TIMEOUT (a connection whose
sent data stays unacknowledged fails), both within
LEASEQ_DB_DEAD_PEER_SECONDS. A server that is merely slow still acknowledges
at the TCP level, so a long statement is never cut by this.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import asyncpg

_NEXT_HOST = (
    OSError,
    TimeoutError,
    asyncpg.exceptions.TargetServerAttributeNotMatched,
    asyncpg.exceptions.CannotConnectNowError,
)
"""What makes a connect try the next host instead of failing."""


class Dialer:
    """asyncpg.connect's signature, one host at a time: `host` and `port` a value
    or a list of them (as SQLAlchemy's asyncpg dialect calls it), or `dsn` a list
    of single-host DSNs (engine.single_host_dsns)."""

    def __init__(self, *, connect_timeout: float, dead_peer_seconds: float) -> None:
        self.connect_timeout = connect_timeout
        self.dead_peer_seconds = dead_peer_seconds
        self._last_good: dict[str, Any] | None = None

    async def __call__(self, *args: Any, **kwargs: Any) -> asyncpg.Connection:
        dsns = kwargs.pop("dsn", None)
        if dsns is not None:
            targets = [{"dsn": dsn} for dsn in dsns]
        else:
            targets = [{"host": host, "port": port} for host, port in
                       _pairs(kwargs.pop("host", None), kwargs.pop("port", None))]
        kwargs.pop("timeout", None)
        if self._last_good in targets:
            targets.remove(self._last_good)
            targets.insert(0, self._last_good)
        failure: BaseException | None = None
        for target in targets:
            try:
                conn = await asyncpg.connect(
                    *args, timeout=self.connect_timeout, **target, **kwargs
                )
            except _NEXT_HOST as exc:
                failure = exc
                continue
            self._last_good = target
            self._watch(conn)
            return conn
        assert failure is not None
        raise failure

    def _watch(self, conn: asyncpg.Connection) -> None:
        transport = getattr(conn, "_transport", None)
        sock = None if transport is None else transport.get_extra_info("socket")
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return  # a Unix socket: a dead peer is seen at once
        dead = max(self.dead_peer_seconds, 3.0)
        idle, interval = max(1, int(dead / 2)), max(1, int(dead / 6))
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(dead * 1000))


def _pairs(host: Any, port: Any) -> list[tuple[Any, Any]]:
    """(host, port) pairs from a value or a list of each (a missing port: asyncpg's)."""
    hosts = host if isinstance(host, list | tuple) else [host]
    if isinstance(port, list | tuple):
        ports = list(port) + [None] * (len(hosts) - len(port))
    else:
        ports = [port] * len(hosts)
    return list(zip(hosts, ports, strict=False))
