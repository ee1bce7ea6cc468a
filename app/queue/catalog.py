"""The queues themselves: create, read, change, tag, purge and delete them, and
the plumbing every operation shares (transactions, and the cache of queue
attributes that NOTIFY keeps true in every process).

Message operations (app/queue/service.py) build on this class.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.errors import (
    DatabaseUnavailable,
    InvalidParameter,
    QueueAlreadyExists,
    QueueError,
    QueueInUse,
    QueueNotFound,
    TooManyTags,
)
from app.queue import attributes, limits
from app.queue.models import Queue, QueueAttributes, QueueStats, RetryBackoff
from app.queue.sql import Q
from app.queue.waiting import WaitHub, changed_payload

QUEUE_CACHE_LISTENING = 60.0
"""Seconds a cached queue lives while changes are announced (a safety net only)."""

_CONNECTION_ERRORS = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.InterfaceError,
    # The protocol state of a connection whose server process went away under
    # an operation ("another operation is in progress"): the connection is dead.
    asyncpg.exceptions.InternalClientError,
    # Connection set-up refused: a wrong database name or credentials.
    asyncpg.exceptions.InvalidCatalogNameError,
    asyncpg.exceptions.InvalidAuthorizationSpecificationError,
)


def check_range(name: str, value: int, bounds: tuple[int, int]) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise InvalidParameter(f"{name} must be between {low} and {high}, got {value}")


def _queue_from_row(row: Any) -> Queue:
    backoff = None
    if row.retry_initial is not None:
        backoff = RetryBackoff(
            initial=row.retry_initial,
            multiplier=row.retry_multiplier,
            max=row.retry_max,
            jitter=row.retry_jitter,
        )
    return Queue(
        id=row.id,
        name=row.name,
        attributes=QueueAttributes(
            visibility_timeout=row.visibility_timeout,
            message_retention=row.message_retention,
            delay=row.delay,
            receive_wait=row.receive_wait,
            max_message_bytes=row.max_message_bytes,
            dead_letter_queue=row.dead_letter_queue,
            max_receive_count=row.max_receive_count,
            retry_backoff=backoff,
        ),
        created_at=row.created_at,
        updated_at=row.updated_at,
        dead_letter_queue_id=row.dead_letter_queue_id,
    )


class QueueCatalog:
    """Queues and their attributes, and the transactions every operation runs in."""

    def __init__(
        self, engine: AsyncEngine, hub: WaitHub, *, queue_cache_seconds: float = 1.0
    ) -> None:
        self._engine = engine
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._hub = hub
        # Receivers polling again read their queue's attributes from here, not
        # from the database. A change or deletion is announced to every process
        # (NOTIFY); while that channel is down, entries live only this long.
        self._queue_cache_seconds = queue_cache_seconds
        self._queue_cache: dict[str, tuple[float, Queue]] = {}
        hub.on_queue_changed = self._forget_queue

    def _forget_queue(self, queue_id: int | None) -> None:
        if queue_id is None:
            self._queue_cache.clear()
            return
        for name, (_, queue) in list(self._queue_cache.items()):
            if queue.id == queue_id:
                del self._queue_cache[name]

    # -- plumbing -----------------------------------------------------------

    @contextlib.asynccontextmanager
    async def transaction(self, *, autocommit: bool = False) -> AsyncIterator[AsyncConnection]:
        """One transaction; driver failures leave here as domain errors.

        With `autocommit`, every statement is its own transaction: no BEGIN and
        COMMIT round trips. For operations whose every write is one statement
        (a claim, a conditional delete): a notification issued by a later
        statement is then delivered after the write it announces is committed.
        """
        try:
            if autocommit:
                async with self._autocommit.connect() as conn:
                    try:
                        yield conn
                    except _CONNECTION_ERRORS:
                        # Raised by the driver directly (the hot path's statements,
                        # see sql.fetch): tell the pool this connection is dead.
                        with contextlib.suppress(Exception):
                            await conn.invalidate()
                        raise
            else:
                async with self._engine.begin() as conn:
                    yield conn
        except QueueError:
            raise
        except sa_exc.TimeoutError as exc:
            raise DatabaseUnavailable("No database connection became free in time.") from exc
        except sa_exc.DBAPIError as exc:
            if exc.connection_invalidated or isinstance(exc.orig, _CONNECTION_ERRORS) or (
                isinstance(getattr(exc.orig, "__cause__", None), _CONNECTION_ERRORS)
            ):
                raise DatabaseUnavailable() from exc
            raise
        except _CONNECTION_ERRORS as exc:
            raise DatabaseUnavailable() from exc

    async def lookup_queue(self, conn: AsyncConnection, name: str) -> Queue:
        if not limits.is_queue_name(name):
            raise QueueNotFound(f"Queue {name!r} does not exist.")
        row = (await conn.execute(Q.get_queue, {"name": name})).one_or_none()
        if row is None:
            self._queue_cache.pop(name, None)
            raise QueueNotFound(f"Queue {name!r} does not exist.")
        queue = _queue_from_row(row)
        lifetime = QUEUE_CACHE_LISTENING if self._hub.listening else self._queue_cache_seconds
        self._queue_cache[name] = (time.monotonic() + lifetime, queue)
        return queue

    async def _queue_for(self, name: str, conn: AsyncConnection | None = None) -> Queue:
        """The queue from the cache (kept true by change notifications), else read,
        in `conn` when the caller holds one. For the message operations, where a
        statement less per request counts."""
        cached = self._cached_queue(name) if self._hub.listening else None
        if cached is not None:
            return cached
        if conn is not None:
            return await self.lookup_queue(conn, name)
        async with self.transaction(autocommit=True) as own:
            return await self.lookup_queue(own, name)

    def _cached_queue(self, name: str) -> Queue | None:
        entry = self._queue_cache.get(name)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    async def ping(self) -> None:
        async with self.transaction() as conn:
            await conn.exec_driver_sql("SELECT 1")

    # -- queues -------------------------------------------------------------

    async def create_queue(
        self, name: str, changes: dict[str, Any], tags: dict[str, str] | None = None
    ) -> tuple[Queue, bool]:
        """Create a queue; (queue, created). Same name and attributes is not an error (SQS).
        `tags` are given to a queue this creates (an existing one keeps its own, as SQS)."""
        if not limits.is_queue_name(name):
            raise InvalidParameter("Queue names are 1-80 letters, digits, '-' or '_'.")
        wanted = attributes.merge(None, changes)
        _check_tags(tags or {})
        async with self.transaction() as conn:
            values = await attributes.sql_values(conn, name, wanted)
            row = (
                await conn.execute(
                    Q.create_queue, {"name": name, "tags": json.dumps(tags or {}), **values}
                )
            ).one_or_none()
            if row is not None:
                return _queue_from_row(row), True
            existing = await self.lookup_queue(conn, name)
        if existing.attributes != wanted:
            raise QueueAlreadyExists(
                f"Queue {name!r} already exists with different attributes."
            )
        return existing, False

    async def get_queue(self, name: str) -> tuple[Queue, QueueStats]:
        async with self.transaction() as conn:
            queue = await self.lookup_queue(conn, name)
            row = (
                await conn.execute(
                    Q.queue_stats,
                    {"queue_id": queue.id, "retention": queue.attributes.message_retention},
                )
            ).one()
        stats = QueueStats(
            visible=row.visible,
            in_flight=row.in_flight,
            delayed=row.delayed,
            oldest_age_seconds=float(row.oldest_age_seconds),
        )
        return queue, stats

    async def list_queues(
        self, prefix: str = "", after: str = "", limit: int = 1000
    ) -> list[Queue]:
        async with self.transaction() as conn:
            rows = await conn.execute(
                Q.list_queues, {"prefix": prefix, "after": after, "limit": limit}
            )
            return [_queue_from_row(row) for row in rows]

    async def _announce_change(self, conn: AsyncConnection, queue_id: int) -> None:
        await conn.execute(Q.notify_queue, {"notice": changed_payload(queue_id)})

    async def update_queue(self, name: str, changes: dict[str, Any]) -> Queue:
        """Change some attributes; None removes a removable one (see attributes.py)."""
        async with self.transaction() as conn:
            if not limits.is_queue_name(name):
                raise QueueNotFound(f"Queue {name!r} does not exist.")
            self._queue_cache.pop(name, None)
            row = (await conn.execute(Q.get_queue_for_update, {"name": name})).one_or_none()
            if row is None:
                raise QueueNotFound(f"Queue {name!r} does not exist.")
            current = _queue_from_row(row)
            wanted = attributes.merge(current.attributes, changes)
            values = await attributes.sql_values(conn, name, wanted)
            row = (await conn.execute(Q.update_queue, {"id": current.id, **values})).one()
            await self._announce_change(conn, current.id)
            return _queue_from_row(row)

    async def dead_letter_sources(self, name: str) -> list[str]:
        """Queues that name this one as their dead-letter queue."""
        async with self.transaction() as conn:
            queue = await self.lookup_queue(conn, name)
            rows = await conn.execute(Q.dead_letter_sources, {"queue_id": queue.id})
            return [row.name for row in rows]

    async def delete_queue(self, name: str) -> None:
        """Delete a queue and its messages; refused while another queue names it as
        its dead-letter queue."""
        try:
            async with self.transaction() as conn:
                queue = await self.lookup_queue(conn, name)
                self._queue_cache.pop(name, None)
                sources = [
                    row.name
                    for row in await conn.execute(Q.dead_letter_sources, {"queue_id": queue.id})
                ]
                if sources:
                    raise QueueInUse(
                        f"Queue {name!r} is the dead-letter queue of {', '.join(sources)}; "
                        f"change their redrive policy first."
                    )
                await conn.execute(Q.delete_queue, {"name": name})
                # Every process forgets it, and its waiting receivers stop waiting.
                await self._announce_change(conn, queue.id)
        except sa_exc.IntegrityError as exc:
            # A redrive policy naming it was committed between the check and the delete.
            raise QueueInUse(f"Queue {name!r} is another queue's dead-letter queue.") from exc

    async def queue_tags(self, name: str) -> dict[str, str]:
        async with self.transaction() as conn:
            queue = await self.lookup_queue(conn, name)
            tags = (await conn.execute(Q.get_queue_tags, {"id": queue.id})).scalar_one()
        return dict(json.loads(tags))

    async def change_tags(
        self, name: str, add: dict[str, str] | None = None, remove: Sequence[str] = ()
    ) -> dict[str, str]:
        """Set the tags `add` and remove the keys `remove`; the queue's tags after."""
        _check_tags(add or {})
        async with self.transaction() as conn:
            queue = await self.lookup_queue(conn, name)
            tags = (
                await conn.execute(
                    Q.change_queue_tags,
                    {"id": queue.id, "add": json.dumps(add or {}), "remove": list(remove)},
                )
            ).scalar_one()
            result: dict[str, str] = json.loads(tags)
            if len(result) > limits.MAX_TAGS:
                raise TooManyTags(f"A queue has at most {limits.MAX_TAGS} tags.")
        return result

    async def purge(self, name: str) -> int:
        async with self.transaction() as conn:
            queue = await self.lookup_queue(conn, name)
            result = await conn.execute(Q.purge_queue, {"queue_id": queue.id})
            return int(getattr(result, "rowcount", 0))


def _check_tags(tags: dict[str, str]) -> None:
    if len(tags) > limits.MAX_TAGS:
        raise TooManyTags(f"A queue has at most {limits.MAX_TAGS} tags.")
    for key, value in tags.items():
        if not 1 <= len(key) <= limits.TAG_KEY_CHARS or len(value) > limits.TAG_VALUE_CHARS:
            raise InvalidParameter(
                f"Tag keys are 1-{limits.TAG_KEY_CHARS} characters and values at most "
                f"{limits.TAG_VALUE_CHARS}."
            )
