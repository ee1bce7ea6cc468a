"""app/queue/tally.py: the processing time a process sums per fair queue's
tenant between two flushes, and what a flush does with it (the share it makes
is tested through the fairness round: tests/engine/test_fair_queues.py); the
messages it handed out in the current second, by which it tells a burst noisy
before the round has."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import pytest
from support import make_queue, queue_id_of

from app.db.connector import DatabaseError
from app.queue.models import Fairness
from app.queue.tally import WINDOW_SECONDS, Tally


def test_acknowledgements_sum_per_queue_and_tenant() -> None:
    tally = Tally()
    tally.add(1, [("a", 1.5), ("b", 0.25), ("a", 0.5)])
    tally.add(2, [("a", 3.0)])
    # A message that named no tenant, a claim made before claims were timed,
    # and a clock that stepped back add nothing.
    tally.add(1, [(None, 4.0), ("a", None), ("b", -1.0)])
    assert tally.pending() == {(1, "a"): 2.0, (1, "b"): 0.25, (2, "a"): 3.0}


async def test_a_flush_writes_the_sums_and_a_failed_one_keeps_them(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    app: Any = client.app  # type: ignore[attr-defined]
    queue_id = await queue_id_of(client, await make_queue(client, fair=True))
    tally = Tally()
    tally.add(queue_id, [("a", 2.0), ("a", 1.0)])
    tally.add(queue_id + 1000, [("a", 1.0)])  # a queue gone meanwhile: dropped
    assert await tally.flush(app.state.db) == 2
    assert tally.pending() == {}
    rows = await db.fetch("SELECT queue_id, tenant, busy FROM leaseq.tenants")
    assert [(r["queue_id"], r["tenant"]) for r in rows] == [(queue_id, "a")]
    assert 2.9 < rows[0]["busy"] <= 3.0
    # A write that fails keeps the sums for the next flush.
    tally.add(queue_id, [("b", 1.0)])
    await db.execute("ALTER TABLE leaseq.tenants RENAME TO tenants_away")
    try:
        with pytest.raises(DatabaseError):
            await tally.flush(app.state.db)
    finally:
        await db.execute("ALTER TABLE leaseq.tenants_away RENAME TO tenants")
    assert tally.pending() == {(queue_id, "b"): 1.0}
    assert await tally.flush(app.state.db) == 1


def test_a_tenant_past_the_thresholds_of_what_this_process_handed_out_is_noisy() -> None:
    now = [0.0]
    tally = Tally(clock=lambda: now[0])
    fairness = Fairness(in_flight_share=0.1, in_flight_min=30)
    tally.handed_out(1, ["burst"] * 29 + ["quiet"] * 5 + [None] * 50)
    assert tally.noisy(1, fairness) == {}  # 29: under the least count
    tally.handed_out(1, ["burst"])
    assert tally.noisy(1, fairness) == {"burst": 30}
    # Taken back by acknowledgements, under it again; other queues apart.
    tally.add(1, [("burst", 0.1)])
    assert tally.noisy(1, fairness) == {}
    tally.handed_out(2, ["burst"] * 40)
    assert tally.noisy(1, fairness) == {}
    # Among a few tenants alike, each holds more than the share: all noisy,
    # as the round judges them; the tenant '' (no group) never is.
    tally.handed_out(3, ["a"] * 40 + ["b"] * 40 + [""] * 40)
    assert tally.noisy(3, fairness) == {"a": 40, "b": 40}
    # Counted over the last window or two: the round has judged by then.
    now[0] += WINDOW_SECONDS
    assert tally.noisy(3, fairness) == {"a": 40, "b": 40}
    tally.handed_out(3, ["a"] * 5)
    now[0] += WINDOW_SECONDS
    assert tally.noisy(3, fairness) == {}
    assert tally.noisy(2, fairness) == {}


async def test_the_rounds_judgement_is_read_and_merged_with_this_processs_own(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """The claims are handed the tenants the round judged noisy (read once a
    second, not by each claim from the tenants' rows) together with those this
    process counts noisy itself, with the greater count where both."""
    app: Any = client.app  # type: ignore[attr-defined]
    # Rows of a queue that is not fair: the app's own rounds, running beside the
    # test, judge fair queues' tenants only and leave these as written.
    queue_id = await queue_id_of(client, await make_queue(client))
    await db.execute(
        "INSERT INTO leaseq.tenants (queue_id, tenant, in_flight, noisy) "
        "VALUES ($1, 'judged', 50, true), ($1, 'both', 35, true), ($1, 'quiet', 3, false)",
        queue_id)
    tally = Tally()
    fairness = Fairness(in_flight_share=0.1, in_flight_min=30)
    assert tally.noisy(queue_id, fairness) == {}
    assert await tally.learn_judged(app.state.db) == 2
    assert tally.noisy(queue_id, fairness) == {"judged": 50, "both": 35}
    assert tally.noisy(queue_id + 1, fairness) == {}
    tally.handed_out(queue_id, ["both"] * 40)
    assert tally.noisy(queue_id, fairness) == {"judged": 50, "both": 40}
    # The round's next judgement replaces the last.
    await db.execute("UPDATE leaseq.tenants SET noisy = false WHERE tenant = 'judged'")
    assert await tally.learn_judged(app.state.db) == 1
    assert tally.noisy(queue_id, fairness) == {"both": 40}
