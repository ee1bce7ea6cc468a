"""Telling the database which queues this process has long polls parked on, so
that a send in a caller's own transaction (the SQL API) notifies only when
someone waits (migration 0013, docs/transactions.md).

A NOTIFY serialises the commits of the transactions that issue one; the REST
door's sends share their commits (group commit) and always notify, but the SQL
API's senders commit one by one, and while no receiver waits their notices are
pure cost. So a process that is about to park a long poll on a queue first
*watches* it:
1. it writes a row in `leaseq.watches` (committed at once);
2. it fences: takes the queue's watch lock exclusively, once. A sender holds
   that lock shared from its look for a watch to its commit, so every sender
   that looked before the row existed has ended by then;
3. only then does its receiver look at the queue, and park if it is empty.
A sender that saw no watch thus ended before the look, which sees its message;
every other sender notifies. A watch is kept while long polls use it and a
while after (LINGER_SECONDS), refreshed, and dropped after that; the row of a
process that died lapses by itself (`until`).

The fence waits at most FENCE_TIMEOUT_MS behind senders' transactions (new
senders to the queue queue up behind it meanwhile). A caller that keeps a
transaction open after a send holds the fence off: the watch is then written
but unfenced, and the fence is retried every FENCE_RETRY_SECONDS, a receiver
looking again after each try, until it holds. An unfenced queue is never
taken as known-empty (`holds`).

All of it runs on the process's LISTEN connection (app/queue/waiting.py
Listener): it is a connection of its own to the server, even behind PgBouncer,
and when it is lost every watch is forgotten and the hub re-checks anyway.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Any

from app.db.connector import STATEMENT_ERRORS, pass_lock

_log = logging.getLogger(__name__)

WATCH_LOCK = 1819375457
"""The advisory lock class of watches: pg_advisory_xact_lock(WATCH_LOCK, queue)
here, its shared form in leaseq.announce (migration 0013)."""
HOLD_SECONDS = 60.0
"""A watch row's life unless refreshed."""
REFRESH_SECONDS = 15.0
LINGER_SECONDS = 60.0
"""How long a watch outlives the last long poll that used it: a consumer that
long-polls in a loop re-parks within a moment, and re-watching costs a fence."""
FENCE_TIMEOUT_MS = 50
FENCE_RETRY_SECONDS = 1.0

REGISTER = """
INSERT INTO leaseq.watches (queue_id, watcher, until)
VALUES ($1, $2, clock_timestamp() + make_interval(secs => $3))
ON CONFLICT (queue_id, watcher) DO UPDATE SET until = EXCLUDED.until
"""
REFRESH = """
UPDATE leaseq.watches SET until = clock_timestamp() + make_interval(secs => $2)
WHERE watcher = $1 AND queue_id = ANY($3::bigint[])
"""
DROP = "DELETE FROM leaseq.watches WHERE watcher = $1 AND queue_id = ANY($2::bigint[])"
PURGE = "DELETE FROM leaseq.watches WHERE until < clock_timestamp()"


def lock_key(queue_id: int) -> int:
    """The queue's key in the watch lock class, as leaseq.announce computes it."""
    return queue_id % 2147483648


class Watches:
    """This process's watches. `on_fenced(queue_id)` is told after each retried
    fence (a receiver should look again); `in_use(queue_id)` says whether long
    polls are in the queue's line now."""

    def __init__(
        self,
        *,
        on_fenced: Callable[[int], None] = lambda _queue_id: None,
        in_use: Callable[[int], bool] = lambda _queue_id: False,
    ) -> None:
        self.watcher = uuid.uuid4().hex
        self.on_fenced = on_fenced
        self.in_use = in_use
        self._conn: Any = None  # asyncpg.Connection, the LISTEN connection
        self._lock = asyncio.Lock()  # one statement at a time on it
        self._rows: dict[int, float] = {}  # queue id -> loop time of last use
        self._fenced: set[int] = set()
        self._registering: dict[int, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.linger_seconds = LINGER_SECONDS
        self.fences = 0
        """Fences that held, so far (a watch churning shows here)."""

    def attach(self, conn: Any) -> None:
        """The LISTEN connection is up: watches may be taken on it."""
        self.detach()
        self._conn = conn
        self._spawn(self._refresh(conn))

    def detach(self) -> None:
        """The LISTEN connection is gone: every watch with it (their rows lapse)."""
        self._conn = None
        self._rows.clear()
        self._fenced.clear()
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()

    def holds(self, queue_id: int) -> bool:
        """Whether every send to the queue is announced now, so that an empty
        look may be trusted until a notification says otherwise."""
        if queue_id not in self._fenced:
            return False
        self._rows[queue_id] = asyncio.get_running_loop().time()
        return True

    async def watch(self, queue_id: int) -> None:
        """Watch the queue: returns once it is fenced, or once the fence timed
        out (it is retried; see the module's docstring), or at once without a
        LISTEN connection (the hub then re-checks each second anyway)."""
        if self._conn is None or self.holds(queue_id):
            return
        pending = self._registering.get(queue_id)
        if pending is None:
            pending = asyncio.ensure_future(self._register(self._conn, queue_id))
            self._registering[queue_id] = pending
            pending.add_done_callback(lambda _done: self._registering.pop(queue_id, None))
        # Shared by every receiver that asked meanwhile: one leaving does not
        # cancel it for the others.
        await asyncio.shield(pending)

    async def _register(self, conn: Any, queue_id: int) -> None:
        try:
            async with self._lock:
                await conn.execute(REGISTER, queue_id, self.watcher, HOLD_SECONDS)
            if conn is not self._conn:
                return
            self._rows[queue_id] = asyncio.get_running_loop().time()
            if await self._fence(conn, queue_id):
                return
            self._spawn(self._retry(conn, queue_id))
        except STATEMENT_ERRORS as exc:
            # The listener notices a lost connection and detaches; meanwhile
            # the queue is simply not watched, so never taken as known-empty.
            _log.warning("cannot watch queue %s (%s)", queue_id, exc)

    async def _fence(self, conn: Any, queue_id: int) -> bool:
        async with self._lock:
            if not await pass_lock(conn, (WATCH_LOCK, lock_key(queue_id)), FENCE_TIMEOUT_MS):
                return False
        if conn is not self._conn or queue_id not in self._rows:
            return False
        self._fenced.add(queue_id)
        self.fences += 1
        return True

    async def _retry(self, conn: Any, queue_id: int) -> None:
        """Until the fence holds or no one waits on the queue: a sender that
        looked before the watch may commit meanwhile, unannounced, so a
        receiver looks again after every try."""
        while conn is self._conn and queue_id in self._rows and queue_id not in self._fenced:
            await asyncio.sleep(FENCE_RETRY_SECONDS)
            if not self.in_use(queue_id):
                return
            try:
                await self._fence(conn, queue_id)
            except STATEMENT_ERRORS as exc:
                _log.warning("cannot fence queue %s (%s)", queue_id, exc)
            self.on_fenced(queue_id)

    async def _refresh(self, conn: Any) -> None:
        while conn is self._conn:
            await asyncio.sleep(REFRESH_SECONDS)
            await self.sweep()

    async def sweep(self) -> None:
        """Keeps the rows of the watches in use alive and drops the others
        (unused for `linger_seconds`), and the lapsed rows of dead processes."""
        conn = self._conn
        if conn is None:
            return
        now = asyncio.get_running_loop().time()
        lapsed = [q for q, used in self._rows.items()
                  if now - used > self.linger_seconds and not self.in_use(q)]
        for queue_id in lapsed:
            # Untrusted here before senders stop announcing there.
            del self._rows[queue_id]
            self._fenced.discard(queue_id)
        try:
            async with self._lock:
                if lapsed:
                    await conn.execute(DROP, self.watcher, lapsed)
                if self._rows:
                    await conn.execute(REFRESH, self.watcher, HOLD_SECONDS, list(self._rows))
                await conn.execute(PURGE)
        except STATEMENT_ERRORS as exc:
            # A row may lapse unrefreshed: trust no watch until fenced again.
            _log.warning("cannot refresh the watches (%s)", exc)
            self._fenced.clear()

    def watching(self) -> set[int]:
        """The queues watched and fenced now."""
        return set(self._fenced)

    def _spawn(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
