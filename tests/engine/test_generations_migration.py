"""Migration 0022 takes the messages table to the partitioned layout online: a
table of 1,000,000 messages, workers sending, claiming and acknowledging all
along, none of their statements waiting a second for a lock, nothing lost or
changed; and while a long transaction holds a lock on the table (a pg_dump), no
try of the migration's queues the workers behind it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg
import pytest
from support import eventually

from alembic import command
from app.db.engine import plain_url
from app.db.migrate import alembic_config, upgrade

STANDING = 1_000_000
WORKERS = 4

# What an earlier version's process does, by the names it knows: the table is
# `leaseq.messages` before the migration and the parent of its generations after.
_SEND = ("INSERT INTO leaseq.messages (queue_id, body, visible_at) "
         "VALUES ($1, $2, now()) RETURNING id")
_CLAIM = """
UPDATE leaseq.messages AS m
SET leased = true, claim_token = gen_random_uuid(), fencing_token = 1,
    visible_at = now() + interval '30 seconds', receive_count = m.receive_count + 1
WHERE m.id = (SELECT c.id FROM leaseq.messages AS c
              WHERE c.queue_id = $1 AND NOT c.leased AND c.visible_at <= now()
              ORDER BY c.visible_at LIMIT 1 FOR UPDATE SKIP LOCKED)
  AND m.queue_id = $1
RETURNING m.id, m.body
"""
_ACK = "DELETE FROM leaseq.messages WHERE id = $1 AND queue_id = $2 AND leased"

_FINGERPRINT = """
SELECT count(*) AS n, sum(id) AS ids, md5(string_agg(id || ':' || body, ',' ORDER BY id)) AS bodies
FROM leaseq.messages WHERE queue_id = $1 AND id <= $2
"""


@dataclass
class Load:
    sent: set[int] = field(default_factory=set)
    acked: dict[int, str] = field(default_factory=dict)
    cycles: int = 0


async def _work(url: str, queue_id: int, load: Load, stop: asyncio.Event, n: int,
                lock_wait: str = "1s") -> None:
    conn = await asyncpg.connect(url)
    try:
        # A statement that waits longer for a lock fails, and the test with it.
        await conn.execute(f"SET lock_timeout = '{lock_wait}'")
        while not stop.is_set():
            load.sent.add(await conn.fetchval(_SEND, queue_id, f"load {n}"))
            claimed = await conn.fetchrow(_CLAIM, queue_id)
            assert claimed is not None
            assert await conn.execute(_ACK, claimed["id"], queue_id) == "DELETE 1"
            load.acked[claimed["id"]] = claimed["body"]
            load.cycles += 1
    finally:
        await conn.close()


async def _at(url: str, revision: str) -> None:
    await asyncio.to_thread(command.upgrade, alembic_config(url), revision)


async def test_a_million_messages_move_to_generation_0_under_load(empty_database: str) -> None:
    await _at(empty_database, "0021")
    url = plain_url(empty_database)
    conn = await asyncpg.connect(url)
    try:
        queue_id = await conn.fetchval(
            "INSERT INTO leaseq.queues (name) VALUES ('standing') RETURNING id")
        # Settled history the workers claim from the front of, and a message in flight.
        await conn.execute(
            "INSERT INTO leaseq.messages (queue_id, body, visible_at, sent_at) "
            "SELECT $1, 'standing ' || n, now() - interval '1 hour' + n * interval '1 ms', "
            "now() - interval '1 hour' FROM generate_series(1, $2) AS n", queue_id, STANDING)
        await conn.execute(
            "UPDATE leaseq.messages SET leased = true, claim_token = gen_random_uuid(), "
            "fencing_token = 7, visible_at = now() + interval '1 hour' "
            "WHERE id = (SELECT max(id) FROM leaseq.messages)")
        await conn.execute("ANALYZE leaseq.messages")
        last = await conn.fetchval("SELECT max(id) FROM leaseq.messages")
        before = await conn.fetchrow(_FINGERPRINT, queue_id, last)
        in_flight = await conn.fetchrow(
            "SELECT id, claim_token, visible_at FROM leaseq.messages WHERE leased")

        load, stop = Load(), asyncio.Event()
        workers = [asyncio.create_task(_work(url, queue_id, load, stop, n))
                   for n in range(WORKERS)]
        await _wait_for(lambda: load.cycles >= 50, workers)
        started = load.cycles
        await asyncio.to_thread(upgrade, empty_database)
        during = load.cycles - started
        await _wait_for(lambda: load.cycles >= started + during + 50, workers)
        stop.set()
        await asyncio.gather(*workers)  # a worker's failure (a lock waited 1 s) fails here

        assert await conn.fetchval(
            "SELECT relkind::text FROM pg_class WHERE oid = 'leaseq.messages'::regclass") == "p"
        assert await conn.fetchval(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'leaseq.messages'::regclass "
            "AND inhrelid = 'leaseq.messages_g0'::regclass") == 1
        assert during > 0, "the workers made no progress while the migration ran"
        # Every standing message the workers did not take is there as it was.
        taken = [i for i in load.acked if i <= last]
        after = await conn.fetchrow(_FINGERPRINT, queue_id, last)
        assert after["n"] == before["n"] - len(taken)
        assert after["ids"] == before["ids"] - sum(taken)
        assert all(body.startswith("standing ") for i, body in load.acked.items() if i <= last)
        assert await conn.fetchrow(
            "SELECT id, claim_token, visible_at FROM leaseq.messages WHERE id = $1",
            in_flight["id"]) == in_flight
        # What the load sent was either acknowledged or is still there, never both,
        # never lost; ids go on from the old identity's counter without a reuse.
        left = {r["id"] for r in await conn.fetch(
            "SELECT id FROM leaseq.messages WHERE id > $1", last)}
        assert left | {i for i in load.acked if i > last} == load.sent
        assert not left & set(load.acked)
        assert len(load.sent) == load.cycles
        fresh = await conn.fetchval(_SEND, queue_id, "after")
        assert fresh > max(load.sent)
        assert await conn.fetchval(
            "SELECT generation FROM leaseq.messages WHERE id = $1", fresh) == 0
    finally:
        await conn.close()


async def _wait_for(done: Callable[[], bool], workers: list[asyncio.Task[None]]) -> None:
    """Until `done()` holds, or a worker has failed (its error raised here)."""
    async with asyncio.timeout(120):
        while not done():
            failed = [w for w in workers if w.done() and w.exception()]
            if failed:
                await failed[0]
            await asyncio.sleep(0.01)


async def _queue_of(conn: asyncpg.Connection, messages: int) -> int:
    queue_id: int = await conn.fetchval(
        "INSERT INTO leaseq.queues (name) VALUES ('q') RETURNING id")
    await conn.execute("INSERT INTO leaseq.messages (queue_id, body, visible_at) "
                       "SELECT $1, 'm', now() FROM generate_series(1, $2)", queue_id, messages)
    return queue_id


async def _send_one(conn: asyncpg.Connection, queue_id: int) -> int:
    sent: int = await conn.fetchval("INSERT INTO leaseq.messages (queue_id, body, visible_at) "
                                    "VALUES ($1, 'n', now()) RETURNING id", queue_id)
    return sent


async def test_a_migration_cut_short_is_taken_up_where_it_stopped(empty_database: str) -> None:
    """The first step and the sequence done by hand (a try that died before the
    swap): the next try finds them, validates the CHECK and swaps."""
    await _at(empty_database, "0021")
    url = plain_url(empty_database)
    conn = await asyncpg.connect(url)
    try:
        queue_id = await _queue_of(conn, 3)
        await conn.execute(
            "ALTER TABLE leaseq.messages ADD COLUMN generation smallint NOT NULL DEFAULT 0, "
            "ADD CONSTRAINT messages_generation_0 CHECK (generation = 0) NOT VALID")
        await conn.execute("CREATE SEQUENCE leaseq.message_ids AS bigint")
        await asyncio.to_thread(upgrade, empty_database)
        assert await conn.fetchval("SELECT count(*) FROM leaseq.messages_g0") == 3
        assert await conn.fetchval(
            "SELECT count(*) FROM pg_constraint WHERE conname = 'messages_generation_0'") == 0
        # The counter went on from the identity's: no id is given twice.
        assert await _send_one(conn, queue_id) == 4
    finally:
        await conn.close()


async def test_downgrade_takes_generation_0_back_as_the_table(empty_database: str) -> None:
    await asyncio.to_thread(upgrade, empty_database)
    url = plain_url(empty_database)
    conn = await asyncpg.connect(url)
    try:
        queue_id = await _queue_of(conn, 5)
        await asyncio.to_thread(command.downgrade, alembic_config(empty_database), "0021")
        assert await conn.fetchval(
            "SELECT relkind::text FROM pg_class WHERE oid = 'leaseq.messages'::regclass") == "r"
        assert await conn.fetchval("SELECT count(*) FROM leaseq.messages") == 5
        # Its identity again, going on after the ids given.
        assert await _send_one(conn, queue_id) == 6
        await asyncio.to_thread(upgrade, empty_database)
        assert await conn.fetchval("SELECT count(*) FROM leaseq.messages_g0") == 6
    finally:
        await conn.close()


async def test_the_migration_waits_for_a_long_holder_without_queueing_the_cycle_behind_it(
    empty_database: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A transaction holding a lock on the table (as pg_dump holds ACCESS SHARE until
    it ends): the migration makes no try while it lasts, so the workers, which here
    may wait no more than 150 ms for a lock (a try waits up to 200 ms, and they
    would wait behind it), never do; it names the holder, and finishes after it."""
    await _at(empty_database, "0021")
    url = plain_url(empty_database)
    conn, holder = await asyncpg.connect(url), await asyncpg.connect(url)
    try:
        queue_id = await _queue_of(conn, 1000)
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT count(*) FROM leaseq.messages")
        pid = holder.get_server_pid()

        async def held_long() -> bool:  # what the migration takes for a long holder
            return bool(await conn.fetchval(
                "SELECT xact_start < clock_timestamp() - interval '1.1 seconds' "
                "FROM pg_stat_activity WHERE pid = $1", pid))

        await eventually(held_long)
        load, stop = Load(), asyncio.Event()
        workers = [asyncio.create_task(_work(url, queue_id, load, stop, n, lock_wait="150ms"))
                   for n in range(2)]
        caplog.set_level(logging.WARNING, logger="leaseq.migrate")
        migration = asyncio.create_task(asyncio.to_thread(upgrade, empty_database))
        named = f"waits for pid {pid} "
        await _wait_for(lambda: any(named in r.getMessage() for r in caplog.records), workers)
        assert not migration.done()
        held = load.cycles
        await _wait_for(lambda: load.cycles >= held + 50, workers)
        await holder.execute("ROLLBACK")
        await migration
        stop.set()
        await asyncio.gather(*workers)
        assert await conn.fetchval(
            "SELECT relkind::text FROM pg_class WHERE oid = 'leaseq.messages'::regclass") == "p"
    finally:
        await holder.close()
        await conn.close()
