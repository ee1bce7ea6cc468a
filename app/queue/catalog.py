"""The queues themselves: create, read, change, tag, purge and delete them, and
the cache of queue attributes that NOTIFY keeps true in every process.

The message operations (app/queue/service.py) hold a catalog and ask it for
the queue of each request.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from datetime import datetime
from typing import Any

from app.db.connector import Connector, ConstraintViolation, Session
from app.errors import (
    InvalidParameter,
    QueueAlreadyExists,
    QueueInUse,
    QueueNotFound,
    TooManyTags,
)
from app.queue import attributes, limits
from app.queue.floors import Floors
from app.queue.models import (
    Fairness,
    Queue,
    QueueAttributes,
    QueueStats,
    RetryBackoff,
    TenantBacklog,
    TenantStats,
)
from app.queue.rows import GaugeRow, QueueRow
from app.queue.sql import Q
from app.queue.tally import Tally
from app.queue.waiting import WaitHub

QUEUE_CACHE_LISTENING = 60.0
"""Seconds a cached queue lives while changes are announced (a safety net only)."""

SQS_SETTINGS = (
    "policy", "kms_master_key_id", "kms_data_key_reuse_period", "sqs_managed_sse",
    "redrive_allow_policy", "redrive_sources",
)
"""The SQS door's settings: stored and returned, kept here rather than among
the rules of attributes.py (the allowed redrive sources are enforced there, on
the queue that names this one as its dead-letter queue)."""
KMS_DATA_KEY_REUSE_PERIOD = (60, 86400)
"""Seconds SQS may reuse a KMS data key: its bounds (the column's CHECK)."""


def check_range(name: str, value: int, bounds: tuple[int, int]) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise InvalidParameter(f"{name} must be between {low} and {high}, got {value}")


def _queue_from_row(
    row: QueueRow, floors: Floors | None = None, tally: Tally | None = None,
) -> Queue:
    backoff = None
    initial, multiplier = row["retry_initial"], row["retry_multiplier"]
    maximum, jitter = row["retry_max"], row["retry_jitter"]
    if initial is not None:
        # Set together or not at all (the constraint queues_retry_backoff_whole).
        assert multiplier is not None and maximum is not None and jitter is not None
        backoff = RetryBackoff(initial=initial, multiplier=multiplier, max=maximum, jitter=jitter)
    return Queue(
        id=row["id"],
        name=row["name"],
        attributes=QueueAttributes(
            visibility_timeout=row["visibility_timeout"],
            message_retention=row["message_retention"],
            delay=row["delay"],
            receive_wait=row["receive_wait"],
            max_message_bytes=row["max_message_bytes"],
            dead_letter_queue=row["dead_letter_queue"],
            max_receive_count=row["max_receive_count"],
            retry_backoff=backoff,
            fifo=row["fifo"],
            content_based_deduplication=row["content_based_deduplication"],
            deduplication_scope=row["deduplication_scope"],
            fifo_throughput_limit=row["fifo_throughput_limit"],
            policy=row["policy"],
            kms_master_key_id=row["kms_master_key_id"],
            kms_data_key_reuse_period=row["kms_data_key_reuse_period"],
            sqs_managed_sse=row["sqs_managed_sse"],
            redrive_allow_policy=row["redrive_allow_policy"],
            redrive_sources=None if row["redrive_sources"] is None
            else tuple(row["redrive_sources"]),
            fair=row["fair"],
            fairness=Fairness(
                in_flight_share=row["fair_in_flight_share"],
                in_flight_min=row["fair_in_flight_min"],
                processing_share=row["fair_processing_share"],
            ),
        ),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        dead_letter_queue_id=row["dead_letter_queue_id"],
        deduplicates_by=row["deduplicates_by"],
        floors=Floors() if floors is None else floors,
        tally=Tally() if tally is None else tally,
    )


TOP_TENANTS = 10
"""Tenants a fair queue's stats list by backlog."""


async def _tenant_stats(session: Session, queue: Queue) -> TenantStats:
    params = {"queue_id": queue.id, "retention": queue.attributes.message_retention}
    (row,) = await session.fetch(Q.fair_queue_stats, params)
    top = await session.fetch(Q.top_tenants, {**params, "limit": TOP_TENANTS})
    return TenantStats(
        noisy_tenants=row["noisy_tenants"],
        quiet_visible=row["quiet_visible"],
        quiet_in_flight=row["quiet_in_flight"],
        quiet_oldest_age_seconds=float(row["quiet_oldest_age_seconds"]),
        top=[TenantBacklog(**r) for r in top],
    )


def _merge(current: QueueAttributes | None, changes: dict[str, Any]) -> QueueAttributes:
    """attributes.merge, and the SQS settings it does not know (None removes the
    policy or the KMS key)."""
    settings = {k: v for k, v in changes.items() if k in SQS_SETTINGS}
    merged = attributes.merge(
        current, {k: v for k, v in changes.items() if k not in SQS_SETTINGS}
    )
    if settings.get("kms_data_key_reuse_period") is not None:
        check_range(
            "kms_data_key_reuse_period", settings["kms_data_key_reuse_period"],
            KMS_DATA_KEY_REUSE_PERIOD,
        )
    for name in ("kms_data_key_reuse_period", "sqs_managed_sse"):
        if name in settings and settings[name] is None:
            del settings[name]  # not removable: None is "not given"
    return replace(merged, **settings)


async def _sql_values(
    session: Session, name: str, wanted: QueueAttributes
) -> dict[str, Any]:
    values = await attributes.sql_values(session, name, wanted)
    settings = {k: getattr(wanted, k) for k in SQS_SETTINGS}
    if wanted.redrive_sources is not None:
        settings["redrive_sources"] = list(wanted.redrive_sources)
    return {**values, **settings}


def _differing(current: QueueAttributes, wanted: QueueAttributes) -> tuple[str, ...]:
    return tuple(
        f.name for f in fields(current) if getattr(current, f.name) != getattr(wanted, f.name)
    )


def _not_found(name: str) -> QueueNotFound:
    return QueueNotFound(f"Queue {name!r} does not exist.")


class QueueCatalog:
    """Queues and their attributes."""

    def __init__(
        self, db: Connector, hub: WaitHub, *, queue_cache_seconds: float = 1.0
    ) -> None:
        self._db = db
        self._hub = hub
        # Receivers polling again read their queue's attributes from here, not
        # from the database. A change or deletion is announced to every process
        # (NOTIFY); while that channel is down, entries live only this long.
        self._queue_cache_seconds = queue_cache_seconds
        self._queue_cache: dict[str, tuple[float, Queue]] = {}
        # Kept across the queue's attribute changes: a floor holds whatever the
        # attributes say (a deleted queue's few bytes stay until the process ends).
        # A queue turning fair gets floors of its own: a fair or FIFO claim's
        # floor is under the queue's turns, not its messages
        # (claim_fair_messages, claim_fifo_messages).
        self._floors: dict[tuple[int, bool], Floors] = {}
        self.tally = Tally()
        hub.on_queue_changed = self._forget_queue

    def fair_floors(self) -> dict[int, datetime]:
        """The floor of each fair (or FIFO) queue's turns that this process's
        claims hold (app/queue/fairness.py starts its looks there)."""
        return {queue_id: floors.ready for (queue_id, turned), floors in self._floors.items()
                if turned and floors.ready is not None}

    def _forget_queue(self, queue_id: int | None) -> None:
        # A fair queue's floors start again too: a repair of its turns tells it
        # changed when it wrote turns below them (queries.sql, floors_reset).
        for (floored, turned), floors in self._floors.items():
            if turned and queue_id in (None, floored):
                floors.reset()
        if queue_id is None:
            self._queue_cache.clear()
            return
        for name, (_, queue) in list(self._queue_cache.items()):
            if queue.id == queue_id:
                del self._queue_cache[name]

    async def gauges(self) -> list[GaugeRow]:
        """Every queue's depth by state, per dead-letter source (queue_gauges)."""
        return await self._db.fetch(Q.queue_gauges)

    # -- a request's queue ----------------------------------------------------

    async def lookup(self, session: Session, name: str) -> Queue:
        """The queue, read in `session` (and cached)."""
        if not limits.is_queue_name(name):
            raise _not_found(name)
        row = await session.fetchrow(Q.get_queue, {"name": name})
        if row is None:
            self._queue_cache.pop(name, None)
            raise _not_found(name)
        key = (row["id"], row["fair"] or row["fifo"])
        floors = self._floors.get(key)
        if floors is None:
            floors = self._floors[key] = Floors()
        queue = _queue_from_row(row, floors, self.tally)
        lifetime = QUEUE_CACHE_LISTENING if self._hub.listening else self._queue_cache_seconds
        self._queue_cache[name] = (time.monotonic() + lifetime, queue)
        return queue

    async def find(self, name: str, session: Session | None = None) -> Queue:
        """The queue from the cache (kept true by change notifications), else read,
        in `session` when the caller holds one. For the message operations, where a
        statement less per request counts."""
        cached = self.cached(name) if self._hub.listening else None
        if cached is not None:
            return cached
        if session is not None:
            return await self.lookup(session, name)
        async with self._db.session() as own:
            return await self.lookup(own, name)

    async def make_fair(self, name: str) -> Queue:
        """The standard queue made fair, as its first message naming a tenant
        does (every process is told to read it again), and read again here."""
        async with self._db.transaction() as session:
            queue = await self.lookup(session, name)
            if not queue.attributes.fair and not queue.attributes.fifo:
                queue = await self._make_fair_in(session, queue)
        return queue

    async def _make_fair_in(self, session: Session, queue: Queue) -> Queue:
        await session.fetch(Q.make_fair, {"queue_id": queue.id})
        return await self.lookup(session, queue.name)

    def cached(self, name: str) -> Queue | None:
        entry = self._queue_cache.get(name)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def forget(self, name: str) -> None:
        """Drop a cached queue that turned out to be gone."""
        self._queue_cache.pop(name, None)

    # -- queues -------------------------------------------------------------

    async def create_queue(
        self,
        name: str,
        changes: dict[str, Any],
        tags: dict[str, str] | None = None,
        *,
        given_only: bool = False,
    ) -> tuple[Queue, bool]:
        """Create a queue; (queue, created). Same name and attributes is not an error (SQS).
        `tags` are given to a queue this creates (an existing one keeps its own, as SQS).
        An existing queue must have every attribute as `changes` would make a new one;
        with `given_only`, only those `changes` names (SQS's CreateQueue: attributes
        left out are not compared)."""
        if not limits.is_queue_name(name):
            raise InvalidParameter(
                "Queue names are 1-80 letters, digits, '-' or '_'; a FIFO queue's end in "
                "'.fifo' (and only a FIFO queue's)."
            )
        wanted = _merge(None, changes)
        if wanted.fifo != name.endswith(limits.FIFO_SUFFIX):
            raise InvalidParameter(
                f"A FIFO queue's name must end in {limits.FIFO_SUFFIX!r}." if wanted.fifo
                else f"Only a FIFO queue's name may end in {limits.FIFO_SUFFIX!r}: create it "
                f"with fifo true."
            )
        _check_tags(tags or {})
        async with self._db.transaction() as session:
            values = await _sql_values(session, name, wanted)
            row = await session.fetchrow(
                Q.create_queue, {"name": name, "tags": json.dumps(tags or {}), **values}
            )
            if row is not None:
                created = _queue_from_row(row)
                if wanted.fair:
                    created = await self._make_fair_in(session, created)
                return created, True
            existing = await self.lookup(session, name)
        if given_only:
            wanted = _merge(existing.attributes, changes)
        differing = _differing(existing.attributes, wanted)
        if differing:
            raise QueueAlreadyExists(
                f"Queue {name!r} already exists with different attributes.", differing
            )
        return existing, False

    async def get_queue(self, name: str) -> tuple[Queue, QueueStats]:
        async with self._db.transaction() as session:
            queue = await self.lookup(session, name)
            (row,) = await session.fetch(Q.queue_stats, {
                "queue_id": queue.id,
                "retention": queue.attributes.message_retention,
                "fifo_delay": queue.attributes.delay if queue.attributes.fifo else 0,
            })
            tenants = await _tenant_stats(session, queue) if queue.attributes.fair else None
        stats = QueueStats(
            visible=row["visible"],
            in_flight=row["in_flight"],
            delayed=row["delayed"],
            oldest_age_seconds=float(row["oldest_age_seconds"]),
            tenants=tenants,
        )
        return queue, stats

    async def list_queues(
        self, prefix: str = "", after: str = "", limit: int = 1000,
        patterns: Sequence[str] | None = None,
    ) -> list[Queue]:
        """A page of queues by name; with `patterns` (names in which `*` stands
        for any run of characters, as a key's scopes write them), only those
        matching one."""
        like = None if patterns is None else [
            "%".join(part.replace("_", "\\_") for part in p.split("*")) for p in patterns
        ]
        rows = await self._db.fetch(
            Q.list_queues, {"prefix": prefix, "after": after, "limit": limit, "like": like}
        )
        return [_queue_from_row(row) for row in rows]

    async def update_queue(self, name: str, changes: dict[str, Any]) -> Queue:
        """Change some attributes; None removes a removable one (see attributes.py)."""
        return await self.edit_queue(name, lambda _: changes)

    async def edit_queue(
        self, name: str, edit: Callable[[QueueAttributes], dict[str, Any]]
    ) -> Queue:
        """update_queue with the changes `edit` makes of the current attributes, read
        under the queue's lock: an edit of a value (SQS's AddPermission of the policy)
        loses no concurrent one."""
        if not limits.is_queue_name(name):
            raise _not_found(name)
        async with self._db.transaction() as session:
            self._queue_cache.pop(name, None)
            row = await session.fetchrow(Q.get_queue_for_update, {"name": name})
            if row is None:
                raise _not_found(name)
            current = _queue_from_row(row)
            wanted = _merge(current.attributes, edit(current.attributes))
            values = await _sql_values(session, name, wanted)
            (row,) = await session.fetch(Q.update_queue, {"id": current.id, **values})
            updated = _queue_from_row(row)
            if wanted.fair and not current.attributes.fair:
                updated = await self._make_fair_in(session, updated)
            for statement in current.kind.on_change(current.attributes, wanted):
                await session.execute(statement, {"queue_id": current.id})
            await _announce_change(session, current.id)
            return updated

    async def names_of(self, ids: set[int]) -> dict[int, str]:
        """The names of the queues by these ids that still exist."""
        rows = await self._db.fetch(Q.queue_names, {"ids": sorted(ids)})
        return {row["id"]: row["name"] for row in rows}

    async def existing(self, names: Sequence[str]) -> set[str]:
        """Which of `names` are queues now."""
        rows = await self._db.fetch(Q.existing_queue_names, {"names": sorted(names)})
        return {row["name"] for row in rows}

    async def dead_letter_sources(self, name: str) -> list[str]:
        """Queues that name this one as their dead-letter queue."""
        async with self._db.transaction() as session:
            queue = await self.lookup(session, name)
            rows = await session.fetch(Q.dead_letter_sources, {"queue_id": queue.id})
        return [row["name"] for row in rows]

    async def delete_queue(
        self, name: str, readable: Callable[[str], bool] | None = None
    ) -> None:
        """Delete a queue and its messages; refused while another queue names it as
        its dead-letter queue (the refusal names those `readable` allows, and
        counts the others)."""
        try:
            async with self._db.transaction() as session:
                queue = await self.lookup(session, name)
                self._queue_cache.pop(name, None)
                rows = await session.fetch(Q.dead_letter_sources, {"queue_id": queue.id})
                if rows:
                    raise QueueInUse(
                        f"Queue {name!r} is the dead-letter queue of "
                        f"{_some_named([row['name'] for row in rows], readable)}; "
                        f"change their redrive policy first."
                    )
                await session.fetch(Q.lock_redrive_tasks_of_queue, {"queue_id": queue.id})
                await session.execute(Q.delete_queue, {"name": name})
                # Every process forgets it, and its waiting receivers stop waiting.
                await _announce_change(session, queue.id)
        except ConstraintViolation as exc:
            # A redrive policy naming it was committed between the check and the delete.
            raise QueueInUse(f"Queue {name!r} is another queue's dead-letter queue.") from exc

    async def queue_tags(self, name: str) -> dict[str, str]:
        async with self._db.transaction() as session:
            queue = await self.lookup(session, name)
            tags = await session.fetchval(Q.get_queue_tags, {"id": queue.id})
        return dict(json.loads(tags))

    async def change_tags(
        self, name: str, add: dict[str, str] | None = None, remove: Sequence[str] = ()
    ) -> dict[str, str]:
        """Set the tags `add` and remove the keys `remove`; the queue's tags after."""
        _check_tags(add or {})
        async with self._db.transaction() as session:
            queue = await self.lookup(session, name)
            tags = await session.fetchval(
                Q.change_queue_tags,
                {"id": queue.id, "add": json.dumps(add or {}), "remove": list(remove)},
            )
            result: dict[str, str] = json.loads(tags)
            if len(result) > limits.MAX_TAGS:
                raise TooManyTags(f"A queue has at most {limits.MAX_TAGS} tags.")
        return result

    async def purge(self, name: str) -> int:
        async with self._db.transaction() as session:
            queue = await self.lookup(session, name)
            # A fair or FIFO queue's turns first: a send committed between the
            # two statements keeps its turn, whether the purge deletes its
            # message or not (queries.sql, forget_turns).
            for statement in queue.kind.forget_on_purge:
                await session.execute(statement, {"queue_id": queue.id})
            return await session.execute(Q.purge_queue, {"queue_id": queue.id})


def _some_named(names: list[str], readable: Callable[[str], bool] | None) -> str:
    """`names` as a caller may see them: those it may read, the others counted."""
    shown = [n for n in names if readable is None or readable(n)]
    hidden = len(names) - len(shown)
    parts = [", ".join(shown)] if shown else []
    if hidden:
        parts.append(f"{hidden} queue{'s' if hidden > 1 else ''} you may not read")
    return " and ".join(parts)


async def _announce_change(session: Session, queue_id: int) -> None:
    await session.execute(Q.notify_queue_changed, {"queue_id": queue_id})


def _check_tags(tags: dict[str, str]) -> None:
    if len(tags) > limits.MAX_TAGS:
        raise TooManyTags(f"A queue has at most {limits.MAX_TAGS} tags.")
    for key, value in tags.items():
        if not 1 <= len(key) <= limits.TAG_KEY_CHARS or len(value) > limits.TAG_VALUE_CHARS:
            raise InvalidParameter(
                f"Tag keys are 1-{limits.TAG_KEY_CHARS} characters and values at most "
                f"{limits.TAG_VALUE_CHARS}."
            )
