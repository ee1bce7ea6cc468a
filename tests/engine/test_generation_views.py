"""Which table a statement names under each view of the generations
(app/queue/generations.py), and the epoch a process holds (app/db/epochs.py):
it lets go of the old one only once its last statement under it has ended, and
until then the rotation moves nothing."""

from __future__ import annotations

import asyncpg
from conftest import AppClient
from support import eventually, make_queue, send, wait_until

from app.queue.generations import EPOCH_LOCKS, View
from app.queue.sql import Q


def test_between_rotations_every_statement_names_the_live_generation() -> None:
    claim = View(live=3).rename(Q.claim_messages.text)
    sent = View(live=3).rename(Q.send_messages.text)
    assert "leaseq.messages_g0" not in claim + sent
    assert "leaseq.messages_g3 AS" in claim and "INSERT INTO leaseq.messages_g3" in sent


def test_while_a_generation_drains_sends_go_to_the_live_one_and_the_rest_to_the_parent() -> None:
    view = View(live=1, draining=0)
    sent = view.rename(Q.send_messages.text)
    deleted = view.rename(Q.delete_messages.text)
    assert "INSERT INTO leaseq.messages_g1" in sent
    assert "DELETE FROM leaseq.messages AS m" in deleted
    assert "leaseq.messages_g" not in deleted


def test_with_no_view_everything_goes_through_the_parent() -> None:
    for query in (Q.send_messages, Q.claim_fifo_messages, Q.change_visibility):
        assert "leaseq.messages_g" not in View().rename(query.text), query.name


def test_whole_queue_reads_name_the_parent_whatever_the_view() -> None:
    assert View(live=5).rename(Q.queue_stats.text) == Q.queue_stats.text


async def test_the_old_epoch_is_held_until_its_last_statement_ends(
    app_factory: AppClient, db: asyncpg.Connection
) -> None:
    client = await app_factory(rotate_after=0)
    queue = await make_queue(client)
    await send(client, queue, "waits")
    state = client.app.state  # type: ignore[attr-defined]
    epochs = state.generations.epochs
    await wait_until(lambda: epochs.epoch is not None)
    ticket = epochs.enter()  # a statement under way under the first epoch
    try:
        assert await state.rotation.start()
        # The process takes the new view at once...
        await wait_until(lambda: state.generations.view.draining == 0)
        # ...but holds the old epoch, so the rotation moves nothing.
        for _ in range(3):
            await state.rotation.step()
        assert await db.fetchval("SELECT count(*) FROM leaseq.messages_g0") == 1
        held = await db.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 "
            "AND classid = $1 AND objid = $2", EPOCH_LOCKS, ticket)
        assert held == 1
    finally:
        epochs.leave(ticket)

    async def moved() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM leaseq.messages_g1") == 1)

    await eventually(moved)
