"""The named statements of the queries.sql files: every one is used, and the claim
uses its index."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from support import make_queue, positional

from app.auth.sql import Q as AUTH
from app.db.connector import Connector
from app.db.queries import compile_query, parse
from app.doctor.sql import Q as DOCTOR
from app.queue.sql import Q

SOURCE = Q.source
AUTH_SOURCE = AUTH.source
DOCTOR_SOURCE = DOCTOR.source


def test_every_named_query_is_used() -> None:
    code = "\n".join(p.read_text() for p in Path("app").rglob("*.py"))
    used = set(re.findall(r"\bQ\.(\w+)", code))
    sources = [set(SOURCE), set(AUTH_SOURCE), set(DOCTOR_SOURCE)]
    named = set().union(*sources)
    assert sum(map(len, sources)) == len(named), "a name in two queries.sql files"
    assert named == used


async def test_the_claim_uses_the_claim_index_on_a_large_queue(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    await make_queue(client, "big")
    queue_id = await db.fetchval("SELECT id FROM leaseq.queues WHERE name = 'big'")
    await db.execute(
        "INSERT INTO leaseq.messages (queue_id, body, visible_at) "
        "SELECT $1, 'x', now() + (g % 100) * interval '1 second' FROM generate_series(1, 20000) g",
        queue_id,
    )
    await db.execute("ANALYZE leaseq.messages")
    rows = [r["id"] for r in await db.fetch("SELECT id FROM leaseq.messages LIMIT 10")]
    # Alone, and carrying ten acknowledgements (deleted by primary key).
    for ack_ids in ([], rows):
        sql, args = positional("claim_messages", {
            "queue_id": queue_id, "visibility_timeout": 30, "retention": 345600, "max": 10,
            "dead_letter_queue_id": None, "max_receive_count": None,
            "ack_ids": ack_ids, "ack_tokens": [uuid.uuid4() for _ in ack_ids],
            "ready_floor": None, "lease_floor": None,
        })
        async with db.transaction():
            plan = await db.fetch(f"EXPLAIN {sql}", *args)
        text = "\n".join(row[0] for row in plan)
        assert "messages_by_state" in text, text
        assert "Seq Scan on messages" not in text, text


async def test_the_claim_keeps_its_index_when_the_table_fills_after_being_empty(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """asyncpg caches the claim as a prepared statement; a generic plan made on an
    empty table would be a sequential scan kept as the table grows."""
    await make_queue(client, "plans")
    queue_id = await db.fetchval("SELECT id FROM leaseq.queues WHERE name = 'plans'")
    await db.execute("VACUUM ANALYZE leaseq.messages")  # empty, as after a purge
    params = {"queue_id": queue_id, "visibility_timeout": 30, "retention": 345600, "max": 1,
              "dead_letter_queue_id": None, "max_receive_count": None,
              "ack_ids": [], "ack_tokens": [], "ready_floor": None, "lease_floor": None}
    scans = "SELECT seq_scan, idx_scan FROM pg_stat_user_tables WHERE relname = 'messages_g0'"
    connector: Connector = client.app.state.db  # type: ignore[attr-defined]
    async with connector.session() as session:  # a connection of the service's pool
        for _ in range(10):
            await session.fetch(Q.claim_messages, params)
        await db.execute(
            "INSERT INTO leaseq.messages (queue_id, body, visible_at) "
            "SELECT $1, 'x', now() - (g % 100) * interval '1 second' "
            "FROM generate_series(1, 20000) g",
            queue_id,
        )
        driver = session._driver
        await driver.execute("SELECT pg_stat_force_next_flush()")
        before = await driver.fetchrow(scans)
        for _ in range(5):
            assert (await session.fetch(Q.claim_messages, params))[0]["id"] is not None
        await driver.execute("SELECT pg_stat_force_next_flush()")
        after = await driver.fetchrow(scans)
        plans = await driver.fetchrow(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement = $1", Q.claim_messages.sql,
        )
    assert after["seq_scan"] == before["seq_scan"]
    assert after["idx_scan"] > before["idx_scan"]
    assert plans["generic_plans"] == 0 and plans["custom_plans"] >= 15


def test_every_parameter_is_one_of_the_statement_not_of_its_comments() -> None:
    """`:name` is found by a pattern: one only in a comment would be a parameter
    PostgreSQL cannot type."""
    for query in [*Q, *AUTH]:
        code = re.sub(r"--[^\n]*", "", query.text)
        assert set(compile_query(query.name, code).params) == set(query.params), query.name


def test_only_statements_whose_plan_cannot_turn_bad_keep_cached_plans() -> None:
    cached = {query.name for query in Q if query.cached_plan}
    assert cached == {"send_messages", "send_untenanted_messages", "delete_messages",
                      "change_visibility", "give_back_claims", "notify_ready",
                      "send_fifo_messages", "delete_fifo_messages", "change_fifo_visibility",
                      "give_back_fifo_claims", "replay_receive_attempt",
                      "record_receive_attempt", "delete_fair_messages",
                      "change_fair_visibility", "give_back_fair_claims", "add_busy"}
    assert not Q.claim_messages.cached_plan and not Q.queue_outlook.cached_plan
    assert not Q.claim_fifo_messages.cached_plan and not Q.fifo_outlook.cached_plan
    assert not Q.claim_fair_messages.cached_plan


async def test_the_fair_claim_reads_no_backlog_it_does_not_take(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """On a fair queue with a noisy tenant's 19,800 messages waiting, a claim
    reads each tenant's head through messages_tenant_claim and its candidates by
    primary key: no sequential scan of the messages."""
    await make_queue(client, "shared")
    queue_id = await db.fetchval("SELECT id FROM leaseq.queues WHERE name = 'shared'")
    await db.execute("SELECT leaseq.make_fair($1)", queue_id)
    await db.execute(
        "INSERT INTO leaseq.messages (queue_id, body, tenant, visible_at) "
        "SELECT $1, 'x', CASE WHEN g % 100 = 0 THEN 'quiet-' || (g % 2000) ELSE 'burst' END, "
        "now() - interval '1 minute' + g * interval '1 millisecond' "
        "FROM generate_series(1, 20000) g", queue_id)
    # Each tenant's turn, as the sends would have left them; the burst is
    # handed to the claim noisy, as the process would from the round's judgement.
    await db.execute("INSERT INTO leaseq.turns (queue_id, tenant, at) "
                     "SELECT $1, tenant, min(visible_at) FROM leaseq.messages "
                     "WHERE queue_id = $1 GROUP BY tenant", queue_id)
    await db.execute("VACUUM ANALYZE leaseq.messages")
    sql, args = positional("claim_fair_messages", {
        "queue_id": queue_id, "visibility_timeout": 30, "retention": 345600, "max": 10,
        "dead_letter_queue_id": None, "max_receive_count": None,
        "ack_ids": [], "ack_tokens": [], "ready_floor": None,
        "noisy_tenants": ["burst"], "noisy_in_flight": [160],
    })
    tx = db.transaction()
    await tx.start()
    try:
        plan = json.loads(await db.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args))
    finally:
        await tx.rollback()
    assert "messages" not in _seq_scans(plan[0]["Plan"]).split()
    tx = db.transaction()
    await tx.start()
    try:
        claimed = await db.fetch(sql, *args)
    finally:
        await tx.rollback()
    # The quiet tenants' ten oldest, though 9,900 of the burst's are older.
    assert [row["tenant"] for row in claimed] == [f"quiet-{n}" for n in range(100, 1100, 100)]


def _seq_scans(node: dict[str, Any]) -> str:
    """The relations the plan reads by sequential scan, as text."""
    found = [node.get("Relation Name", "")] if node.get("Node Type") == "Seq Scan" else []
    for child in node.get("Plans", []):
        found.append(_seq_scans(child))
    return " ".join(found)


async def test_the_two_pools_plan_as_their_statements_need(client: httpx.AsyncClient) -> None:
    connector: Connector = client.app.state.db  # type: ignore[attr-defined]
    assert connector.cached_engine is not None
    async with connector.session() as session:
        assert await session._driver.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
    async with connector.session(cached_plans=True) as session:
        assert await session._driver.fetchval("SHOW plan_cache_mode") == "auto"


@pytest.mark.unit
def test_a_fragment_is_read_in_place_of_its_use() -> None:
    source = (
        "-- fragment: columns\n-- Why they go together.\na, b,\n    c\n\n"
        "-- name: one\nSELECT\n    {{columns}},\n    d\nFROM t;\n"
    )
    assert parse(source) == {"one": "SELECT\n    a, b,\n        c,\n    d\nFROM t;"}
    with pytest.raises(ValueError, match="no fragment named 'missing'"):
        parse("-- name: one\nSELECT\n    {{missing}}\n")
    with pytest.raises(ValueError, match="'one' is named twice"):
        parse("-- fragment: one\na\n-- name: one\nSELECT\n    {{one}}\n")


@pytest.mark.unit
def test_the_claims_share_what_they_write_and_return() -> None:
    """The claim's writes and a received message's columns are written once
    (queries.sql's fragments), so a new column cannot reach one claim only."""
    raw = Path("app/queue/queries.sql").read_text()
    statements = parse(raw)
    claims = [name for name in statements if name.startswith("claim_")]
    assert len(claims) == 6, claims  # standard (four), fair, FIFO
    # Written once in the file, and present in every claim once expanded.
    assert raw.count("claim_token       = gen_random_uuid()") == 1
    assert raw.count("m.trace_header, m.receive_count, m.claim_token") == 1
    for name in claims:
        text = statements[name]
        assert "claim_token       = gen_random_uuid()" in text, name
        assert "m.trace_header, m.receive_count, m.claim_token" in text, name
