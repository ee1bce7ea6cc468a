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
from typing import Any

from sqlalchemy import exc as sa_exc

from app.errors import DatabaseUnavailable, InvalidParameter, RedriveInProgress, TaskNotFound
from app.queue.models import RedriveTask
from app.queue.service import QueueService
from app.queue.sql import Q
from app.queue.waiting import payload

_log = logging.getLogger(__name__)

BATCH = 100
HOLD_SECONDS = 30
"""How long a runner holds a task between two batches before others may take it."""


def _task_id(task_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(task_id)
    except ValueError:
        raise TaskNotFound(f"Redrive task {task_id[:60]!r} does not exist.") from None


def _task_from_row(row: Any) -> RedriveTask:
    return RedriveTask(
        task_id=str(row.id),
        source=row.source,
        destination=row.destination,
        status=row.status,
        moved=row.moved,
        remaining=row.remaining,
        to_move_at_start=row.to_move_at_start,
        max_per_second=row.max_per_second,
        failure=row.failure,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


class Redrives:
    """Starting, reading and cancelling redrive tasks, and running them."""

    def __init__(self, service: QueueService, *, hold_seconds: int = HOLD_SECONDS) -> None:
        self._service = service
        self._hold = hold_seconds
        self._wake = asyncio.Event()

    async def start(
        self, source: str, destination: str | None = None, max_per_second: int | None = None
    ) -> RedriveTask:
        if max_per_second is not None and not 1 <= max_per_second <= 100_000:
            raise InvalidParameter("max_per_second must be between 1 and 100000")
        try:
            async with self._service.transaction() as conn:
                dead_letter_queue = await self._service.lookup_queue(conn, source)
                destination_id = None
                if destination is not None:
                    destination_id = (
                        await self._service.lookup_queue(conn, destination)
                    ).id
                    if destination_id == dead_letter_queue.id:
                        raise InvalidParameter("A redrive cannot move a queue into itself.")
                task_id = (
                    await conn.execute(
                        Q.create_redrive_task,
                        {
                            "source_queue_id": dead_letter_queue.id,
                            "destination_queue_id": destination_id,
                            "max_per_second": max_per_second,
                        },
                    )
                ).scalar_one()
        except sa_exc.IntegrityError as exc:
            raise RedriveInProgress(
                f"A redrive of {source!r} is already running; cancel it or wait for it."
            ) from exc
        self._wake.set()
        return await self.get(str(task_id))

    async def get(self, task_id: str) -> RedriveTask:
        async with self._service.transaction() as conn:
            row = (
                await conn.execute(Q.get_redrive_task, {"task_id": _task_id(task_id)})
            ).one_or_none()
        if row is None:
            raise TaskNotFound(f"Redrive task {task_id!r} does not exist.")
        return _task_from_row(row)

    async def list(self, source: str, limit: int = 100) -> list[RedriveTask]:
        async with self._service.transaction() as conn:
            queue = await self._service.lookup_queue(conn, source)
            ids = (
                await conn.execute(
                    Q.list_redrive_tasks, {"source_queue_id": queue.id, "limit": limit}
                )
            ).scalars().all()
            rows = [
                (await conn.execute(Q.get_redrive_task, {"task_id": task_id})).one()
                for task_id in ids
            ]
        return [_task_from_row(row) for row in rows]

    async def cancel(self, task_id: str) -> RedriveTask:
        async with self._service.transaction() as conn:
            await conn.execute(Q.cancel_redrive_task, {"task_id": _task_id(task_id)})
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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=scan_seconds)

    async def _take(self) -> tuple[uuid.UUID, int | None] | None:
        async with self._service.transaction() as conn:
            row = (
                await conn.execute(Q.take_redrive_task, {"hold": self._hold})
            ).one_or_none()
        return None if row is None else (row.id, row.max_per_second)

    async def _run(self, task_id: uuid.UUID, max_per_second: int | None) -> None:
        size = BATCH if max_per_second is None else min(BATCH, max_per_second)
        while True:
            async with self._service.transaction() as conn:
                row = (
                    await conn.execute(
                        Q.redrive_batch, {"task_id": task_id, "batch": size, "hold": self._hold}
                    )
                ).one()
                for queue_id in row.destinations or ():
                    notice = payload(queue_id, ready=min(row.moved, BATCH))
                    await conn.execute(Q.notify_queue, {"notice": notice})
            if row.status != "running":  # completed, cancelled (None), or taken over
                return
            if max_per_second is not None:
                # Spread the batches so the moves keep to the rate.
                await asyncio.sleep(max(row.moved, 1) / max_per_second)
