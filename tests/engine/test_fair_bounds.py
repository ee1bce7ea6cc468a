"""Fair queues' tenants by their bounds (issue 44, docs/fair-queues.md): a fair
claim reads the tenants that may have a message claimable, in the order of
their bound, so its cost does not grow with the queue's tenants; and every
write that makes a tenant's message claimable sooner brings the tenant back
into that walk, so that no message of a quiet tenant stalls behind a bound.

Each writer's test first puts the tenant out of the walk (its one message in
flight for a minute: its bound is that lease's end), then makes a message of
it claimable now the writer's way, and receives it at once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import httpx
from support import eventually, make_queue, positional, queue_id_of, receive, send

from app.db.engine import plain_url
from app.queue import grouped
from app.queue.fairness import adopt_strays, judge_tenants, restore_tenant_rows
from app.queue.receipts import Receipt


def _bodies(messages: list[dict[str, Any]]) -> list[str]:
    return [m["body"] for m in messages]


async def _bound(db: asyncpg.Connection, queue: str, tenant: str) -> Any:
    return await db.fetchval(
        "SELECT t.ready_at FROM leaseq.tenants AS t JOIN leaseq.queues AS q ON q.id = t.queue_id "
        "WHERE q.name = $1 AND t.tenant = $2", queue, tenant)


async def _held(client: httpx.AsyncClient, db: asyncpg.Connection, queue: str,
                tenant: str = "quiet", **extra: Any) -> dict[str, Any]:
    """The tenant's one message, received for a minute: the tenant is out of the
    claims' walk until then."""
    await send(client, queue, f"{tenant}-held", **({"group": tenant} if tenant else {}), **extra)
    (message,) = await receive(client, queue, max=10, visibility_timeout=60)
    assert message["body"] == f"{tenant}-held"
    assert await db.fetchval("SELECT $1 > now() + interval '50 seconds'",
                             await _bound(db, queue, tenant))
    return message


def _lease_of(client: httpx.AsyncClient, queue: str, message: dict[str, Any]) -> str:
    return f"/v1/queues/{queue}/messages/{message['receipt_handle']}"


# -- a receive's cost -------------------------------------------------------------


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found.extend(_nodes(child))
    return found


def _blocks(node: dict[str, Any]) -> int:
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))


async def _claim_buffers(db: asyncpg.Connection, queue_id: int) -> int:
    """Buffers one fair claim of ten reads or writes, by EXPLAIN (ANALYZE,
    BUFFERS), rolled back: the plan's root, and each data-modifying CTE that
    nothing reads (PostgreSQL runs those after the root, outside its count).
    The least of three."""
    sql, args = positional("claim_fair_messages", {
        "queue_id": queue_id, "visibility_timeout": 30, "retention": 345600, "max": 10,
        "dead_letter_queue_id": None, "max_receive_count": None,
        "ack_ids": [], "ack_tokens": [], "in_flight_min": 30, "in_flight_share": 0.1,
    })
    counts = []
    for _ in range(3):
        tx = db.transaction()
        await tx.start()
        try:
            plan = json.loads(await db.fetchval(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *args))[0]["Plan"]
        finally:
            await tx.rollback()
        read = {n.get("CTE Name") for n in _nodes(plan) if n["Node Type"] == "CTE Scan"}
        counts.append(_blocks(plan) + sum(
            _blocks(n) for n in plan.get("Plans", [])
            if n["Node Type"] == "ModifyTable"
            and n.get("Subplan Name", "").removeprefix("CTE ") not in read))
    return min(counts)


async def test_a_fair_claim_costs_about_the_same_at_20000_tenants_as_at_10(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """Both queues in the same tables (so both plans read the same indexes):
    10 tenants with 100 messages each, and 20,000 tenants with one each. The
    claim reads the tenants that may have a message, by their bound: about as
    much for either, where walking every tenant read 500 times as much."""
    few = await make_queue(client, "few", fair=True)
    many = await make_queue(client, "many", fair=True)
    for queue, tenants in ((few, 10), (many, 20_000)):
        await db.execute(
            "SELECT count(*) FROM leaseq.send_batch($1, "
            "ARRAY(SELECT 'm' || g FROM generate_series(1, greatest($2, 1000)) AS g), "
            "groups => ARRAY(SELECT 't' || g % $2 "
            "FROM generate_series(1, greatest($2, 1000)) AS g))",
            queue, tenants)
    await db.execute("VACUUM ANALYZE leaseq.messages")
    await db.execute("VACUUM ANALYZE leaseq.tenants")
    at_10 = await _claim_buffers(db, await queue_id_of(client, few))
    at_20000 = await _claim_buffers(db, await queue_id_of(client, many))
    assert at_20000 <= 1.5 * at_10, (at_10, at_20000)
    # And the claim is what it was: ten messages, each of its own tenant (sent
    # by one statement, they are all as old).
    got = await receive(client, many, max=10, visibility_timeout=60)
    assert len({m["group"] for m in got}) == 10


# -- every writer brings its tenant back --------------------------------------------


async def test_a_send_brings_back_a_tenant_whose_messages_are_all_in_flight(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client, fair=True)
    await _held(client, db, queue)
    await send(client, queue, "second", group="quiet")
    assert _bodies(await receive(client, queue, max=10)) == ["second"]
    # A delayed one is claimable when its delay ends, not before.
    await send(client, queue, "later", group="quiet", delay=1)
    assert await receive(client, queue, max=10) == []
    await asyncio.sleep(1.1)
    assert _bodies(await receive(client, queue, max=10)) == ["later"]


async def test_the_sql_apis_sends_and_release_bring_a_tenant_back(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client, fair=True)
    held = await _held(client, db, queue)
    await db.execute("SELECT leaseq.send($1, 'one', \"group\" => 'quiet')", queue)
    assert _bodies(await receive(client, queue, max=10, visibility_timeout=60)) == ["one"]
    await db.execute(
        "SELECT count(*) FROM leaseq.send_batch($1, ARRAY['two', 'three'], "
        "groups => ARRAY['quiet', 'quiet'])", queue)
    assert _bodies(await receive(client, queue, max=10, visibility_timeout=60)) == [
        "two", "three"]
    await db.execute("SELECT leaseq.change_visibility($1, $2, 0)", queue,
                     held["receipt_handle"])
    assert _bodies(await receive(client, queue, max=10)) == ["quiet-held"]


async def test_a_release_and_a_shorter_lease_bring_a_tenant_back(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client, fair=True)
    held = await _held(client, db, queue)
    released = await client.post(f"{_lease_of(client, queue, held)}/release", json={})
    assert released.status_code == 200, released.text
    (again,) = await receive(client, queue, max=10, visibility_timeout=60)
    assert again["body"] == "quiet-held"
    # A lease of a minute cut to one second: claimable a second on.
    shorter = await client.patch(f"{_lease_of(client, queue, again)}/visibility",
                                 json={"timeout": 1})
    assert shorter.status_code == 200, shorter.text
    await asyncio.sleep(1.1)
    (third,) = await receive(client, queue, max=10, visibility_timeout=60)
    assert third["body"] == "quiet-held"
    # And the visibility timeout 0 of a batch change.
    response = await client.post(f"/v1/queues/{queue}/messages/visibility", json={
        "entries": [{"receipt_handle": third["receipt_handle"], "timeout": 0}]})
    assert response.status_code == 200, response.text
    assert _bodies(await receive(client, queue, max=10)) == ["quiet-held"]


async def test_a_claim_given_back_brings_its_tenant_back(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue_name = await make_queue(client, fair=True)
    await _held(client, db, queue_name)
    row = await db.fetchrow("SELECT id, claim_token FROM leaseq.messages")
    app: Any = client.app  # type: ignore[attr-defined]
    queue = await app.state.service.queues.find(queue_name)
    statement = grouped.give_back(queue, [Receipt(queue.id, row["id"], row["claim_token"])])
    assert statement is not None
    await app.state.db.fetch(*statement)
    assert _bodies(await receive(client, queue_name, max=10)) == ["quiet-held"]


async def test_a_lapsed_lease_is_claimable_when_it_ends_even_once_extended(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client, fair=True)
    await send(client, queue, "short", group="quiet")
    assert len(await receive(client, queue, visibility_timeout=1)) == 1
    await asyncio.sleep(1.1)
    (second,) = await receive(client, queue, visibility_timeout=1)
    assert second["body"] == "short" and second["receive_count"] == 2
    # Extended to three seconds: the tenant's bound is the first lease's end,
    # early; the claim that finds it so moves it to the new end.
    extended = await client.patch(f"{_lease_of(client, queue, second)}/visibility",
                                  json={"timeout": 3})
    assert extended.status_code == 200, extended.text
    await asyncio.sleep(1.1)
    assert await receive(client, queue, max=10) == []
    assert await db.fetchval("SELECT $1 > now() + interval '1 second'",
                             await _bound(db, queue, "quiet"))
    await asyncio.sleep(2)
    (third,) = await receive(client, queue, max=10)
    assert third["body"] == "short" and third["receive_count"] == 3


async def test_a_message_moved_to_a_fair_dead_letter_queue_is_claimable_there_at_once(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    dlq = await make_queue(client, "dlq", fair=True)
    source = await make_queue(client, "work", fair=True, dead_letter_queue=dlq,
                              max_receive_count=1)
    plain = await make_queue(client, "plain", dead_letter_queue=dlq, max_receive_count=1)
    await _held(client, db, dlq, "quiet")
    await _held(client, db, dlq, "")
    await send(client, source, "poison", group="quiet")
    await send(client, plain, "plain poison")
    for queue in (source, plain):
        assert len(await receive(client, queue, visibility_timeout=0)) == 1
        assert await receive(client, queue) == []  # moved on its second receive
    got = await receive(client, dlq, max=10)
    assert sorted(_bodies(got)) == ["plain poison", "poison"]
    # The standard queue's message is its own tenant there, as a send makes it.
    assert sorted(m.get("group") or "" for m in got) == ["", "quiet"]


async def test_a_redriven_message_is_claimable_in_its_fair_queue_at_once(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    dlq = await make_queue(client, "dlq")
    source = await make_queue(client, "work", dead_letter_queue=dlq, max_receive_count=1)
    # Dead-lettered while its queue was standard: it names no tenant.
    await send(client, source, "early")
    await send(client, source, "named", group="quiet")  # the queue is fair from here
    for _ in range(2):
        await receive(client, source, max=10, visibility_timeout=0)
    assert sorted(_bodies(await receive(client, dlq, max=10, visibility_timeout=0))) == [
        "early", "named"]
    await _held(client, db, source, "quiet")
    await _held(client, db, source, "")
    started = await client.post(f"/v1/queues/{dlq}/redrive", json={})
    assert started.status_code == 202, started.text
    task_id = started.json()["task_id"]

    async def done() -> bool:
        task = (await client.get(f"/v1/redrive-tasks/{task_id}")).json()
        return bool(task["status"] == "completed")

    await eventually(done)
    got = await receive(client, source, max=10)
    assert sorted(_bodies(got)) == ["early", "named"]
    assert sorted(m.get("group") or "" for m in got) == ["", "quiet"]


async def test_a_stray_adopted_and_a_tenant_whose_row_went_missing_come_back(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client, fair=True)
    queue_id = await queue_id_of(client, queue)
    await _held(client, db, queue, "")
    # As a process that had not yet heard the queue became fair would store it.
    await db.execute("INSERT INTO leaseq.messages (queue_id, body, visible_at) "
                     "VALUES ($1, 'stray', statement_timestamp())", queue_id)
    app: Any = client.app  # type: ignore[attr-defined]
    assert await adopt_strays(app.state.db) == 1
    assert _bodies(await receive(client, queue, max=10, visibility_timeout=60)) == ["stray"]
    # As a writer of a version from before the bounds would leave it: a message
    # whose tenant has no row. The seldom round restores the row.
    await db.execute("INSERT INTO leaseq.messages (queue_id, body, tenant, visible_at) "
                     "VALUES ($1, 'rowless', 'new', statement_timestamp())", queue_id)
    assert await receive(client, queue, max=10) == []
    assert await restore_tenant_rows(app.state.db) == 1
    assert await restore_tenant_rows(app.state.db) == 0
    assert _bodies(await receive(client, queue, max=10)) == ["rowless"]


async def test_the_rounds_forget_empty_tenants_and_bring_late_bounds_down(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client, fair=True)
    app: Any = client.app  # type: ignore[attr-defined]
    held = await _held(client, db, queue, "gone")
    # Acknowledged through the SQL API, which writes no tenant: the bound stays
    # at the lease's end until the round finds nothing stored, and forgets the
    # tenant (no processing time was counted).
    await db.execute("SELECT leaseq.delete($1, $2)", queue, held["receipt_handle"])
    assert await _bound(db, queue, "gone") is not None
    await judge_tenants(app.state.db)
    assert await db.fetchval("SELECT count(*) FROM leaseq.tenants WHERE tenant = 'gone'") == 0
    # A bound late by a fault: the seldom round brings it down to the tenant's
    # message (the round of each second looks up only the tenants it may change).
    await send(client, queue, "late", group="late")
    await db.execute("UPDATE leaseq.tenants SET ready_at = now() + interval '1 hour' "
                     "WHERE tenant = 'late'")
    assert await receive(client, queue, max=10) == []
    assert await restore_tenant_rows(app.state.db) == 1
    assert _bodies(await receive(client, queue, max=10)) == ["late"]


async def test_an_acknowledgement_takes_an_emptied_tenant_out_of_the_walk(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client, fair=True)
    held = await _held(client, db, queue)
    deleted = await client.delete(_lease_of(client, queue, held))
    assert deleted.status_code == 204, deleted.text
    assert await _bound(db, queue, "quiet") is None


async def test_a_purge_leaves_no_tenant_in_the_walk(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client, fair=True)
    for tenant in ("a", "b", "c"):
        await send(client, queue, tenant, group=tenant)
    purged = await client.post(f"/v1/queues/{queue}/purge")
    assert purged.status_code == 200, purged.text
    assert await db.fetch("SELECT ready_at FROM leaseq.tenants WHERE ready_at IS NOT NULL") == []
    await send(client, queue, "after", group="b")
    assert _bodies(await receive(client, queue, max=10)) == ["after"]


async def test_a_claim_raises_no_bound_over_a_send_its_snapshot_missed(
    client: httpx.AsyncClient, db: asyncpg.Connection, database_url: str,
) -> None:
    """A caller's transaction sends to the tenant and holds its row; a claim
    that began before that commit takes the tenant's one message it sees and
    would put the tenant's bound at its lease's end. It finds the tenant's
    version moved on, and leaves the bound where the send put it."""
    queue = await make_queue(client, fair=True)
    await send(client, queue, "first", group="quiet")
    other = await asyncpg.connect(plain_url(database_url))
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute("SELECT leaseq.send($1, 'second', \"group\" => 'quiet')", queue)
        claim = asyncio.create_task(receive(client, queue, max=10, visibility_timeout=60))

        async def waiting() -> bool:
            return bool(await db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE '%claim_messages on a fair queue%'"))

        await eventually(waiting)
        await tx.commit()
        assert _bodies(await claim) == ["first"]
    finally:
        await other.close()
    assert _bodies(await receive(client, queue, max=10)) == ["second"]
