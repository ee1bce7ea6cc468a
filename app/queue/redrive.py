"""Dead-letter redrive: moving a dead-letter queue's messages back, as tasks.

A task is a row in `redrive_tasks`. Whichever service process holds it (a
lease on the task row, renewed with every batch) moves the messages in
batches; each batch moves its messages and counts them on the task in one
transaction, so a crash at any point loses and duplicates nothing, and the
task is taken over once its holder's lease runs out. Cancelling stops it
between two batches; what was moved stays moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

from app.db.connector import Connector, ConstraintViolation
from app.errors import DatabaseUnavailable, InvalidParameter, RedriveInProgress, TaskNotFound
from app.queue.catalog import QueueCatalog
from app.queue.models import RedriveTask
from app.queue.rows import RedriveBatchRow, RedriveTaskRow
from app.queue.sql import Q

_log = logging.getLogger(__name__)

BATCH = 100
HOLD_SECONDS = 30
"""How long a runner holds a task between two batches before others may take it."""


def _task_id(task_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(task_id)
    except ValueError:
        raise TaskNotFound(f"Redrive task {task_id[:60]!r} does not exist.") from None


def _task_from_row(row: RedriveTaskRow) -> RedriveTask:
    return RedriveTask(
        task_id=str(row["id"]),
        source=row["source"],
        destination=row["destination"],
        status=row["status"],
        moved=row["moved"],
        remaining=row["remaining"],
        to_move_at_start=row["to_move_at_start"],
        max_per_second=row["max_per_second"],
        failure=row["failure"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


class Redrives:
    """Starting, reading and cancelling redrive tasks, and running them."""

    def __init__(
        self, db: Connector, queues: QueueCatalog, *, hold_seconds: int = HOLD_SECONDS
    ) -> None:
        self._db = db
        self._queues = queues
        self._hold = hold_seconds
        self._wake = asyncio.Event()

    async def reached_by(self, source: str, destination: str | None) -> list[str]:
        """The queues a redrive of `source` would write into: its destination, or
        the queues its messages return to (for the caller's authorization)."""
        if destination is not None:
            return [destination]
        async with self._db.transaction() as session:
            queue = await self._queues.lookup(session, source)
            rows = await session.fetch(Q.redrive_return_queues, {"queue_id": queue.id})
        return [row["name"] for row in rows]

    async def start(
        self, source: str, destination: str | None = None, max_per_second: int | None = None
    ) -> RedriveTask:
        if max_per_second is not None and not 1 <= max_per_second <= 100_000:
            raise InvalidParameter("max_per_second must be between 1 and 100000")
        try:
            async with self._db.transaction() as session:
                dead_letter_queue = await self._queues.lookup(session, source)
                destination_id = None
                if destination is not None:
                    target = await self._queues.lookup(session, destination)
                    destination_id = target.id
                    if destination_id == dead_letter_queue.id:
                        raise InvalidParameter("A redrive cannot move a queue into itself.")
                    if target.attributes.fifo != dead_letter_queue.attributes.fifo:
                        raise InvalidParameter(
                            "A redrive moves messages into a queue of the same type: FIFO "
                            "into FIFO, standard into standard."
                        )
                task_id = await session.fetchval(
                    Q.create_redrive_task,
                    {
                        "source_queue_id": dead_letter_queue.id,
                        "destination_queue_id": destination_id,
                        "max_per_second": max_per_second,
                    },
                )
        except ConstraintViolation as exc:
            raise RedriveInProgress(
                f"A redrive of {source!r} is already running; cancel it or wait for it."
            ) from exc
        self._wake.set()
        return await self.get(str(task_id))

    async def get(self, task_id: str) -> RedriveTask:
        rows = await self._db.fetch(Q.get_redrive_task, {"task_id": _task_id(task_id)})
        if not rows:
            raise TaskNotFound(f"Redrive task {task_id!r} does not exist.")
        return _task_from_row(rows[0])

    async def list(self, source: str, limit: int = 100) -> list[RedriveTask]:
        async with self._db.transaction() as session:
            queue = await self._queues.lookup(session, source)
            ids = await session.fetch(
                Q.list_redrive_tasks, {"source_queue_id": queue.id, "limit": limit}
            )
            rows = [
                (await session.fetch(Q.get_redrive_task, {"task_id": row["id"]}))[0]
                for row in ids
            ]
        return [_task_from_row(row) for row in rows]

    async def cancel(self, task_id: str) -> RedriveTask:
        await self._db.fetch(Q.cancel_redrive_task, {"task_id": _task_id(task_id)})
        return await self.get(task_id)

    # -- the runner -------------------------------------------------------------

    async def run_forever(self, scan_seconds: float) -> None:
        """Runs tasks as they come: at once when started here, and ones whose
        runner died (another process's, or this one's before a restart) within
        `scan_seconds`."""
        current: tuple[uuid.UUID, int | None] | None = None
        while True:
            try:
                if current is None:
                    current = await self._take()
                if current is not None:
                    await self._run(*current)
                    current = None
                    continue
            except DatabaseUnavailable:
                # Keep the task: it is still ours; its batch rolled back whole.
                _log.warning("redrive runner: database unavailable; retrying")
                await asyncio.sleep(1.0)
                continue
            except Exception:
                _log.exception("redrive runner failed")
                current = None
            self._wake.clear()
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can lose a cancel
            # that arrives as the event is set, and the app's shutdown then waits
            # for this loop forever (app/db/fleet.py met it).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(scan_seconds):
                    await self._wake.wait()

    async def _batch(self, task_id: uuid.UUID, size: int) -> RedriveBatchRow:
        async with self._db.transaction() as session:
            (row,) = await session.fetch(
                Q.redrive_batch, {"task_id": task_id, "batch": size, "hold": self._hold}
            )
            for queue_id in row["destinations"] or ():
                await session.fetch(Q.notify_ready, {
                    "queue_id": queue_id, "ready": min(row["moved"], BATCH), "due_in": None,
                })
        return row

    async def _take(self) -> tuple[uuid.UUID, int | None] | None:
        rows = await self._db.fetch(Q.take_redrive_task, {"hold": self._hold})
        return None if not rows else (rows[0]["id"], rows[0]["max_per_second"])

    async def _run(self, task_id: uuid.UUID, max_per_second: int | None) -> None:
        size = BATCH if max_per_second is None else min(BATCH, max_per_second)
        retried = False
        while True:
            try:
                row = await self._batch(task_id, size)
            except ConstraintViolation:
                # A destination deleted under the batch: it rolled back whole, and
                # the next one finds the queue gone (and fails the task). Twice in a
                # row is something else.
                if retried:
                    raise
                retried = True
                continue
            retried = False
            if row["status"] != "running":  # completed, cancelled (None), or taken over
                return
            if max_per_second is not None:
                # Spread the batches so the moves keep to the rate.
                await asyncio.sleep(max(row["moved"], 1) / max_per_second)
