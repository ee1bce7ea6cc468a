"""app/queue/busy.py: the processing time a process sums per fair queue's
tenant between two flushes, and what a flush does with it (the share it makes
is tested through the fairness round: tests/engine/test_fair_queues.py)."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import pytest
from support import make_queue, queue_id_of

from app.db.connector import DatabaseError
from app.queue.busy import Busy


def test_acknowledgements_sum_per_queue_and_tenant() -> None:
    busy = Busy()
    busy.add(1, [("a", 1.5), ("b", 0.25), ("a", 0.5)])
    busy.add(2, [("a", 3.0)])
    # A message that named no tenant, a claim made before claims were timed,
    # and a clock that stepped back add nothing.
    busy.add(1, [(None, 4.0), ("a", None), ("b", -1.0)])
    assert busy.pending() == {(1, "a"): 2.0, (1, "b"): 0.25, (2, "a"): 3.0}


async def test_a_flush_writes_the_sums_and_a_failed_one_keeps_them(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    app: Any = client.app  # type: ignore[attr-defined]
    queue_id = await queue_id_of(client, await make_queue(client, fair=True))
    busy = Busy()
    busy.add(queue_id, [("a", 2.0), ("a", 1.0)])
    busy.add(queue_id + 1000, [("a", 1.0)])  # a queue gone meanwhile: dropped
    assert await busy.flush(app.state.db) == 2
    assert busy.pending() == {}
    rows = await db.fetch("SELECT queue_id, tenant, busy FROM leaseq.tenants")
    assert [(r["queue_id"], r["tenant"]) for r in rows] == [(queue_id, "a")]
    assert 2.9 < rows[0]["busy"] <= 3.0
    # A write that fails keeps the sums for the next flush.
    busy.add(queue_id, [("b", 1.0)])
    await db.execute("ALTER TABLE leaseq.tenants RENAME TO tenants_away")
    try:
        with pytest.raises(DatabaseError):
            await busy.flush(app.state.db)
    finally:
        await db.execute("ALTER TABLE leaseq.tenants_away RENAME TO tenants")
    assert busy.pending() == {(queue_id, "b"): 1.0}
    assert await busy.flush(app.state.db) == 1
