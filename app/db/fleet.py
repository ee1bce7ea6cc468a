"""One process of a fleet at a time: a session-level advisory lock on a connection
of its own.

Every service process (each replica, each uvicorn worker) keeps one direct
connection and tries the lock on it every second until it holds it; the holder
keeps it for as long as that connection lives and pings it every second.
PostgreSQL releases a session lock when its connection ends: at once when the
holder is killed (the kernel closes its socket), after TCP keepalives give up
(about 25 s, set below) when its host vanished. A holder whose connection fails
(a database restart, a network fault, a ping unanswered in time) stops holding
before it closes it, reconnects and tries again like everyone else.

The lock must not be taken through PgBouncer's transaction pooling: it would stay
with whichever server connection took it. The URL is the LISTEN connection's
(LEASEQ_LISTEN_URL when set, else DATABASE_URL), which is direct, or in session
pooling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from app.db.engine import connect
from app.db.hosts import Dialer
from app.db.queries import Query

_log = logging.getLogger(__name__)

CHECK_SECONDS = 1.0
"""How often a process tries the lock, and the holder pings its connection."""
PING_TIMEOUT = 5.0
# PostgreSQL's side of an idle connection: probe after 10 s of silence, every
# 5 s, give up after 3 unanswered (ignored on a Unix socket, where a dead peer
# is always seen at once).
KEEPALIVES = (
    "SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; "
    "SET tcp_keepalives_count = 3"
)


async def reconnecting(
    url: str, dial: Dialer, name: str, check: float,
    keep: Callable[[asyncpg.Connection], Awaitable[None]], lost: Callable[[], None],
) -> None:
    """A connection of its own named `name`, kept by `keep` until it fails; then
    `lost()`, and a new one after `check` seconds (backing off to 5 s while none
    can be made). Runs until cancelled."""
    backoff = check
    while True:
        connected = False
        try:
            conn = await connect(url, dial, server_settings={"application_name": name})
            connected = True
            try:
                await keep(conn)
            finally:
                lost()
                conn.terminate()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            _log.warning("%s: connection failed (%s); retrying", name, exc)
        backoff = check if connected else min(backoff * 2, 5.0)
        await asyncio.sleep(backoff)


class FleetLock:
    """A session-level advisory lock, taken by `acquire` (a statement answering
    true when this session got it), held while this process's connection lives."""

    def __init__(
        self, url: str, acquire: Query[Any], *, name: str, dial: Dialer,
        check_seconds: float = CHECK_SECONDS,
    ) -> None:
        self._url = url
        self._dial = dial
        self._acquire = acquire
        self.name = name
        self._check = check_seconds
        self._held = asyncio.Event()

    @property
    def held(self) -> bool:
        """Whether this process holds the lock (as of its last check)."""
        return self._held.is_set()

    async def wait_held(self) -> None:
        await self._held.wait()

    def start(self) -> asyncio.Task[None]:
        """The task keeping the lock; cancelling it closes the connection, which
        releases the lock for another process."""
        return asyncio.create_task(self._run(), name=self.name)

    async def _run(self) -> None:
        await reconnecting(self._url, self._dial, self.name, self._check, self._keep,
                           self._lost)

    def _lost(self) -> None:
        if self._held.is_set():
            self._held.clear()
            _log.warning("%s: lock lost (pid %d)", self.name, os.getpid())

    async def _keep(self, conn: asyncpg.Connection) -> None:
        """Tries the lock, then pings, every `check` seconds until the connection fails."""
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: lost.set())
        with contextlib.suppress(asyncpg.PostgresError):
            await conn.execute(KEEPALIVES)
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for loses a cancel that
        # arrives as its awaitable finishes, and this loop then never ends.
        while not lost.is_set():
            async with asyncio.timeout(PING_TIMEOUT):
                if self._held.is_set():
                    await conn.fetchval("SELECT 1")
                elif await conn.fetchval(self._acquire.sql):
                    self._held.set()
                    _log.info("%s: lock held by this process (pid %d)", self.name, os.getpid())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._check):
                    await lost.wait()
