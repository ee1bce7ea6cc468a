"""The epoch a process acts by: a shared advisory lock on a connection of its own,
held from the moment the process takes a view of the database's layout until its
last statement under that view has ended.

Why. The engine names the tables of a view in its statements (the live
generation of the messages, app/queue/generations.py). Whoever changes the layout
(the rotation, app/queue/rotation.py) publishes a new view with a new epoch and
must not act on the old tables until no process still names them: it asks for
the old epoch's lock exclusively, which it gets only once every process holding
it has let go (a process that died let go with its connection; one that hangs
holds up the rotation, never the cycle).

The order that makes that enough: a process takes the shared lock on the epoch
it read, then reads the epoch again, and acts by it only if it is still the
current one. A process that locks an epoch after the rotation found it free
therefore reads the newer one and never acts by the old.

While this process has no view (starting, or its connection lost: the lock went
with it), `epoch` is None and its statements must use a layout that is right
whatever the view (the engine reads through the parent table).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import asyncpg

from app.db.fleet import KEEPALIVES, reconnecting
from app.db.hosts import Dialer
from app.db.queries import Query

CHECK_SECONDS = 0.5
"""How often the epoch is read again."""
STATEMENT_TIMEOUT = 5.0
_TAKE = "SELECT pg_try_advisory_lock_shared($1, $2)"
_LET_GO = "SELECT pg_advisory_unlock_shared($1, $2)"

NO_EPOCH = -1
"""The ticket of a statement run while the process had no view."""


class Epochs:
    """This process's epoch: `read` answers the current one (a row with `epoch`,
    passed whole to `on_view`), `space` is the advisory locks' first key (the
    epoch their second)."""

    def __init__(
        self, url: str, read: Query[Any], *, space: int,
        on_view: Callable[[Mapping[str, Any] | None], None], dial: Dialer,
        name: str = "leaseq-epochs", check_seconds: float = CHECK_SECONDS,
    ) -> None:
        self._url = url
        self._read = read
        self._space = space
        self._on_view = on_view
        self._dial = dial
        self._name = name
        self._check = check_seconds
        self.epoch: int | None = None
        self._in_flight: dict[int, int] = {}
        self._ended = asyncio.Event()
        self.changes = 0
        """How many views this process has taken (for tests)."""

    def enter(self) -> int:
        """A statement begins under the current view; its ticket for `leave`."""
        epoch = NO_EPOCH if self.epoch is None else self.epoch
        self._in_flight[epoch] = self._in_flight.get(epoch, 0) + 1
        return epoch

    def leave(self, epoch: int) -> None:
        left = self._in_flight[epoch] - 1
        if left:
            self._in_flight[epoch] = left
        else:
            del self._in_flight[epoch]
            self._ended.set()

    def start(self) -> asyncio.Task[None]:
        return asyncio.create_task(self._run(), name=self._name)

    async def _run(self) -> None:
        await reconnecting(self._url, self._dial, self._name, self._check, self._keep,
                           self._lose)

    def _lose(self) -> None:
        # The server let go of the lock with the connection: from now on this
        # process's statements must not name one view's tables.
        if self.epoch is not None:
            self.epoch = None
            self._on_view(None)

    async def _keep(self, conn: asyncpg.Connection) -> None:
        # Read again every CHECK_SECONDS rather than LISTEN: a listening backend
        # reads every notification of the database (one per send), which cost
        # this connection 13-15 us of PostgreSQL's CPU per message single
        # (docs/performance.md); a rotation waits a fraction of a second more.
        lost = asyncio.Event()

        def on_lost(_conn: object) -> None:
            self._lose()
            lost.set()

        conn.add_termination_listener(on_lost)
        with contextlib.suppress(asyncpg.PostgresError):
            await conn.execute(KEEPALIVES)
        while not lost.is_set():
            await self._follow(conn)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._check):
                    await lost.wait()

    async def _follow(self, conn: asyncpg.Connection) -> None:
        """Takes the current epoch, if it is not the one held."""
        while True:
            async with asyncio.timeout(STATEMENT_TIMEOUT):
                row = await conn.fetchrow(self._read.sql)
            if row is None or row["epoch"] == self.epoch:
                return
            epoch = int(row["epoch"])
            async with asyncio.timeout(STATEMENT_TIMEOUT):
                taken = await conn.fetchval(_TAKE, self._space, epoch)
                again = await conn.fetchrow(self._read.sql) if taken else None
            if again is None or again["epoch"] != epoch:
                if taken:
                    async with asyncio.timeout(STATEMENT_TIMEOUT):
                        await conn.fetchval(_LET_GO, self._space, epoch)
                await asyncio.sleep(0.05)  # the rotation moved on meanwhile
                continue
            old, self.epoch = self.epoch, epoch
            self.changes += 1
            self._on_view(dict(again))
            if old is not None:
                await self._ended_all(old)
                async with asyncio.timeout(STATEMENT_TIMEOUT):
                    await conn.fetchval(_LET_GO, self._space, old)
            return

    async def _ended_all(self, epoch: int) -> None:
        """Until no statement begun under `epoch` is running."""
        while epoch in self._in_flight:
            self._ended.clear()
            if epoch in self._in_flight:
                await self._ended.wait()

