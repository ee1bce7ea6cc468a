"""Alembic owns the schema: it upgrades an empty database, downgrades to nothing,
and upgrades again."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from alembic.script import ScriptDirectory
from processes import LEASEQ, service_env
from support import eventually

from alembic import command
from app.db.engine import plain_url
from app.db.migrate import MIGRATION_LOCK, alembic_config, upgrade

SCHEMA = {
    "alembic_version", "queues", "messages", "redrive_tasks", "api_keys", "receipt_keys",
    "message_deduplication", "receive_attempts", "grants", "watches",
    "tenants", "dashboard_sessions", "messages_g0", "messages_g1", "generations", "rotation",
    "turns", "group_heads",
}


async def _tables(url: str) -> set[str]:
    conn = await asyncpg.connect(plain_url(url))
    try:
        rows = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'leaseq'"
        )
        return {row["tablename"] for row in rows}
    finally:
        await conn.close()


async def test_upgrade_downgrade_upgrade(empty_database: str) -> None:
    await asyncio.to_thread(upgrade, empty_database)
    assert await _tables(empty_database) == SCHEMA
    await asyncio.to_thread(command.downgrade, alembic_config(empty_database), "base")
    assert await _tables(empty_database) == {"alembic_version"}
    await asyncio.to_thread(upgrade, empty_database)
    assert await _tables(empty_database) == SCHEMA


async def test_the_sql_api_announces_through_the_watches_and_back(empty_database: str) -> None:
    """0013 rewrites 0012's functions in place (pg_notify made leaseq.announce);
    its downgrade turns them back."""

    async def calls() -> list[tuple[str, bool, bool]]:
        conn = await asyncpg.connect(plain_url(empty_database))
        try:
            rows = await conn.fetch(
                "SELECT p.proname, pg_get_functiondef(p.oid) AS definition FROM pg_proc AS p "
                "WHERE p.pronamespace = 'leaseq'::regnamespace AND p.proname = ANY($1) "
                "ORDER BY p.proname",
                ["send", "send_batch", "send_fifo", "delete", "change_visibility"])
            return [(r["proname"], "pg_notify(" in r["definition"],
                     "leaseq.announce(" in r["definition"]) for r in rows]
        finally:
            await conn.close()

    await asyncio.to_thread(upgrade, empty_database)
    announcing = await calls()
    assert len(announcing) == 5
    assert all(not notify and announce for _, notify, announce in announcing)
    await asyncio.to_thread(command.downgrade, alembic_config(empty_database), "0012")
    notifying = await calls()
    assert len(notifying) == 5
    assert all(notify and not announce for _, notify, announce in notifying)


async def test_the_messages_table_is_vacuumed_by_dead_tuples_not_by_its_size(
    empty_database: str,
) -> None:
    await asyncio.to_thread(upgrade, empty_database)
    conn = await asyncpg.connect(plain_url(empty_database))
    try:
        options = await conn.fetchval(
            "SELECT reloptions FROM pg_class WHERE relname = 'messages_g0'"
        )
    finally:
        await conn.close()
    assert "autovacuum_vacuum_threshold=2000" in options
    assert "autovacuum_vacuum_cost_delay=0" in options


@pytest.mark.e2e
async def test_replicas_migrating_together_take_turns_on_the_advisory_lock(
    empty_database: str,
) -> None:
    # The test holds the lock while three replicas start migrating: all three
    # queue on it, then race for it the moment it is released.
    holder = await asyncpg.connect(plain_url(empty_database))
    replicas: list[asyncio.subprocess.Process] = []
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
        for _ in range(3):
            replicas.append(await asyncio.create_subprocess_exec(
                LEASEQ, "migrate", env=service_env(empty_database),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            ))

        async def all_queued() -> bool:
            exited = [r.returncode for r in replicas if r.returncode is not None]
            assert not exited, "a replica finished without waiting for the lock"
            waiting = await holder.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 1",
                MIGRATION_LOCK >> 32, MIGRATION_LOCK & 0xFFFF_FFFF,
            )
            return bool(waiting == len(replicas))

        await eventually(all_queued, seconds=60)
        assert await _tables(empty_database) == set()
        await holder.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)
        outputs = await asyncio.wait_for(
            asyncio.gather(*(r.communicate() for r in replicas)), timeout=120
        )
    finally:
        for replica in replicas:
            if replica.returncode is None:
                replica.kill()
                await replica.wait()
        await holder.close()
    assert [r.returncode for r in replicas] == [0] * len(replicas), outputs
    assert SCHEMA <= await _tables(empty_database)
    head = ScriptDirectory.from_config(alembic_config(empty_database)).get_current_head()
    conn = await asyncpg.connect(plain_url(empty_database))
    try:
        assert await conn.fetch("SELECT version_num FROM leaseq.alembic_version") == [(head,)]
    finally:
        await conn.close()


async def _as_before_0011(url: str) -> None:
    """The layout a deployment migrated before 0011 has: leaseq's objects and
    the version table in `public`, no `leaseq` schema. 0011's downgrade moves
    the objects back; the version table follows them here."""
    await asyncio.to_thread(command.downgrade, alembic_config(url), "0010")
    conn = await asyncpg.connect(plain_url(url))
    try:
        await conn.execute("ALTER TABLE leaseq.alembic_version SET SCHEMA public")
        await conn.execute("DROP SCHEMA leaseq")
    finally:
        await conn.close()


async def test_a_deployment_from_before_the_schema_upgrades_in_place_with_its_data(
    empty_database: str,
) -> None:
    await asyncio.to_thread(upgrade, empty_database)
    await _as_before_0011(empty_database)
    conn = await asyncpg.connect(plain_url(empty_database))
    try:
        assert await _public_tables(conn) >= SCHEMA - {
            "grants", "watches", "tenants", "dashboard_sessions", "messages_g0", "messages_g1",
            "generations", "rotation", "turns", "group_heads"}
        # What a running deployment holds: a standard and a FIFO queue with
        # messages (one in flight), a group, a deduplication id, keys.
        await conn.execute(
            "INSERT INTO queues (name) VALUES ('jobs');"
            "INSERT INTO queues (name, fifo, content_based_deduplication) "
            "VALUES ('steps.fifo', true, true);"
            "INSERT INTO messages (queue_id, body, visible_at) "
            "SELECT id, 'job ' || n, now() FROM queues, generate_series(1, 3) AS n "
            "WHERE name = 'jobs';"
            "UPDATE messages SET claim_token = gen_random_uuid(), "
            "fencing_token = nextval('fencing_tokens'), leased = true, "
            "visible_at = now() + interval '1 hour', receive_count = 1 "
            "WHERE body = 'job 1';"
            "INSERT INTO message_groups (queue_id, group_id, visible_at) "
            "SELECT id, 'g', now() FROM queues WHERE name = 'steps.fifo';"
            "INSERT INTO messages (queue_id, body, visible_at, group_id, sequence_number, "
            "deduplication_id) SELECT id, 'step', now(), 'g', nextval('message_sequence'), 'd' "
            "FROM queues WHERE name = 'steps.fifo';"
            "INSERT INTO message_deduplication (queue_id, scope, deduplication_id, message_id, "
            "sequence_number, expires_at) SELECT queue_id, '', 'd', message_id, sequence_number, "
            "now() + interval '5 minutes' FROM messages WHERE group_id = 'g';"
            "INSERT INTO receipt_keys (id, secret) "
            "VALUES (1, '\\x0102030405060708090a0b0c0d0e0f10');"
        )
        before = await conn.fetch("SELECT * FROM messages ORDER BY id")
        queues = await conn.fetch("SELECT * FROM queues ORDER BY id")
        fencing = await conn.fetchval("SELECT last_value FROM fencing_tokens")
        # An application's own table in the same database stays where it is.
        await conn.execute("CREATE TABLE public.orders (id int PRIMARY KEY)")
    finally:
        await conn.close()

    await asyncio.to_thread(upgrade, empty_database)

    conn = await asyncpg.connect(plain_url(empty_database))
    try:
        assert await _public_tables(conn) == {"orders"}
        after = await conn.fetch("SELECT * FROM leaseq.messages ORDER BY id")
        # Each column as it was; the columns added since empty (0014's tenant) or
        # generation 0 (0022).
        assert [{k: r[k] for k in before[0].keys()} for r in after] == [
            dict(r) for r in before]
        assert {k for k in after[0].keys() if k not in before[0].keys()} == {
            "tenant", "generation"}
        assert {r["generation"] for r in after} == {0}
        assert {r["tenant"] for r in after} == {None}
        assert [dict(r)["name"] for r in await conn.fetch(
            "SELECT * FROM leaseq.queues ORDER BY id")] == [q["name"] for q in queues]
        assert await conn.fetchval("SELECT nextval('leaseq.fencing_tokens')") == fencing + 1
        head = ScriptDirectory.from_config(alembic_config(empty_database)).get_current_head()
        assert await conn.fetchval("SELECT version_num FROM leaseq.alembic_version") == head
        # The SQL API works on what was moved: a send to the moved FIFO queue
        # is deduplicated against the message stored before the move.
        (sent,) = await conn.fetch("SELECT * FROM leaseq.send('steps.fifo', 'again', "
                                   "\"group\" => 'g', deduplication_id => 'd')")
        assert sent["message_id"] == before[-1]["message_id"]
        assert sent["sequence_number"] == before[-1]["sequence_number"]
        assert await conn.fetchval("SELECT count(*) FROM leaseq.messages") == len(before)
    finally:
        await conn.close()


async def _public_tables(conn: asyncpg.Connection) -> set[str]:
    rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    return {row["tablename"] for row in rows}


async def test_a_fresh_install_sits_beside_an_applications_tables_of_the_same_names(
    empty_database: str,
) -> None:
    conn = await asyncpg.connect(plain_url(empty_database))
    try:
        # An application that has its own queues, messages and Alembic history.
        await conn.execute(
            "CREATE TABLE public.queues (id int PRIMARY KEY, title text);"
            "CREATE TABLE public.messages (id int PRIMARY KEY, text text);"
            "CREATE TABLE public.alembic_version (version_num varchar(32) PRIMARY KEY);"
            "INSERT INTO public.alembic_version VALUES ('0001');"
            "INSERT INTO public.queues VALUES (1, 'mine');"
        )
    finally:
        await conn.close()
    await asyncio.to_thread(upgrade, empty_database)
    conn = await asyncpg.connect(plain_url(empty_database))
    try:
        assert await _public_tables(conn) == {"queues", "messages", "alembic_version"}
        assert await conn.fetchval("SELECT version_num FROM public.alembic_version") == "0001"
        assert await conn.fetchval("SELECT title FROM public.queues") == "mine"
        assert SCHEMA <= await _tables(empty_database)
    finally:
        await conn.close()


async def test_the_tenants_of_fair_queues_get_their_bounds_from_their_messages(
    empty_database: str,
) -> None:
    """0020: each tenant with a message on a fair queue gets a row whose bound is
    its earliest message's deadline (a row the claims had made keeps its counts);
    a standard queue's messages that name a tenant (a dead-letter queue's) get none."""
    await asyncio.to_thread(command.upgrade, alembic_config(empty_database), "0019")
    conn = await asyncpg.connect(plain_url(empty_database))
    try:
        await conn.execute(
            "INSERT INTO leaseq.queues (name, fair) VALUES ('fair', true), ('dlq', false);"
            "INSERT INTO leaseq.messages (queue_id, body, tenant, visible_at) "
            "SELECT q.id, m.body, m.tenant, now() + m.due * interval '1 second' "
            "FROM leaseq.queues AS q, (VALUES ('a1', 'a', 60), ('a2', 'a', -5), ('b1', 'b', 0), "
            "('e1', '', 30)) AS m(body, tenant, due) WHERE q.name = 'fair';"
            "INSERT INTO leaseq.messages (queue_id, body, tenant, visible_at) "
            "SELECT id, 'dead', 'a', now() FROM leaseq.queues WHERE name = 'dlq';"
            "INSERT INTO leaseq.tenants (queue_id, tenant, in_flight) "
            "SELECT id, 'a', 1 FROM leaseq.queues WHERE name = 'fair'")
    finally:
        await conn.close()
    await asyncio.to_thread(command.upgrade, alembic_config(empty_database), "0020")
    conn = await asyncpg.connect(plain_url(empty_database))
    try:
        rows = await conn.fetch(
            "SELECT q.name, t.tenant, t.in_flight, t.ready_at = (SELECT min(m.visible_at) "
            "FROM leaseq.messages AS m WHERE m.queue_id = t.queue_id AND m.tenant = t.tenant) "
            "AS exact FROM leaseq.tenants AS t JOIN leaseq.queues AS q ON q.id = t.queue_id "
            "ORDER BY q.name, t.tenant")
        assert [tuple(r) for r in rows] == [
            ("fair", "", 0, True), ("fair", "a", 1, True), ("fair", "b", 0, True)]
    finally:
        await conn.close()


async def test_the_messages_of_fair_queues_get_their_turns(empty_database: str) -> None:
    """0024: each tenant of a fair queue gets a turn at its earliest message due
    and one at each deadline to come (a claim reads no message whose deadline
    is to come); a standard queue's messages that name a tenant get none. The
    SQL API's send then gives its tenant a turn of its own."""
    await asyncio.to_thread(command.upgrade, alembic_config(empty_database), "0023")
    conn = await asyncpg.connect(plain_url(empty_database))
    try:
        await conn.execute(
            "INSERT INTO leaseq.queues (name, fair) VALUES ('fair', true), ('dlq', false);"
            "INSERT INTO leaseq.messages (queue_id, body, tenant, visible_at) "
            "SELECT q.id, m.body, m.tenant, now() + m.due * interval '1 second' "
            "FROM leaseq.queues AS q, (VALUES ('a1', 'a', 60), ('a2', 'a', -5), "
            "('a3', 'a', -9), ('a4', 'a', 60), ('b1', 'b', 30), ('e1', '', -1)) "
            "AS m(body, tenant, due) WHERE q.name = 'fair';"
            "INSERT INTO leaseq.messages (queue_id, body, tenant, visible_at) "
            "SELECT id, 'dead', 'a', now() FROM leaseq.queues WHERE name = 'dlq'")
    finally:
        await conn.close()
    await asyncio.to_thread(command.upgrade, alembic_config(empty_database), "0024")
    conn = await asyncpg.connect(plain_url(empty_database))
    try:
        turns = await conn.fetch(
            "SELECT q.name, u.tenant, u.at FROM leaseq.turns AS u "
            "JOIN leaseq.queues AS q ON q.id = u.queue_id ORDER BY q.name, u.tenant, u.at")
        at = {r["body"]: r["visible_at"] for r in await conn.fetch(
            "SELECT body, visible_at FROM leaseq.messages")}
        assert at["a1"] == at["a4"]
        assert [tuple(r) for r in turns] == [
            ("fair", "", at["e1"]), ("fair", "a", at["a3"]), ("fair", "a", at["a1"]),
            ("fair", "b", at["b1"])]
        await conn.execute("SELECT leaseq.send('fair', 'c1', \"group\" => 'c')")
        assert await conn.fetchval(
            "SELECT count(*) FROM leaseq.turns WHERE tenant = 'c'") == 1
    finally:
        await conn.close()
