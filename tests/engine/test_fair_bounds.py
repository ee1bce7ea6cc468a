"""Fair queues' tenants by their turns (issue 44, docs/fair-queues.md): a fair
claim reads the tenants that may have a message claimable, in the order of
their turns, so its cost does not grow with the queue's tenants; and every
write that makes a tenant's message claimable sooner gives the tenant a turn,
so that no message of a quiet tenant stalls behind a later one.

Each writer's test first puts the tenant out of the walk (its one message in
flight for a minute: its turn is that lease's end), then makes a message of
it claimable now the writer's way, and receives it at once."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
from support import (
    cycle,
    eventually,
    held_horizon,
    make_queue,
    positional,
    queue_id_of,
    receive,
    redriven,
    send,
    statement_buffers,
)

from app.db.engine import plain_url
from app.queue import grouped
from app.queue.fairness import adopt_strays, judge_tenants, restore_turns
from app.queue.receipts import Receipt


def _bodies(messages: list[dict[str, Any]]) -> list[str]:
    return [m["body"] for m in messages]


async def _bound(db: asyncpg.Connection, queue: str, tenant: str) -> Any:
    """The tenant's first turn (None: it has none)."""
    return await db.fetchval(
        "SELECT min(u.at) FROM leaseq.turns AS u JOIN leaseq.queues AS q ON q.id = u.queue_id "
        "WHERE q.name = $1 AND u.tenant = $2", queue, tenant)


async def _due_now(db: asyncpg.Connection, queue: str, tenant: str) -> None:
    """As if the tenant's turns had come: each one moved to now."""
    await db.execute(
        "UPDATE leaseq.turns AS u SET at = now() FROM leaseq.queues AS q "
        "WHERE q.id = u.queue_id AND q.name = $1 AND u.tenant = $2", queue, tenant)


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


async def _claim_buffers(db: asyncpg.Connection, queue_id: int,
                         floor: Any = None) -> int:
    """Buffers one fair claim of ten reads or writes (_statement_buffers), the
    least of three."""
    sql, args = positional("claim_fair_messages", {
        "queue_id": queue_id, "visibility_timeout": 30, "retention": 345600, "max": 10,
        "dead_letter_queue_id": None, "max_receive_count": None,
        "ack_ids": [], "ack_tokens": [], "ready_floor": floor,
        "noisy_tenants": [], "noisy_in_flight": [],
    })
    return min([await statement_buffers(db, sql, args) for _ in range(3)])


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
    await db.execute("VACUUM ANALYZE leaseq.turns")
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


async def test_messages_of_one_send_with_delays_each_come_when_their_delay_ends(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """A claim reads no message whose deadline is to come: a send gives its
    tenant a turn at each deadline it has, not only the earliest."""
    queue = await make_queue(client, fair=True)
    response = await client.post(f"/v1/queues/{queue}/messages", json={"messages": [
        {"body": "now", "group": "quiet"},
        {"body": "soon", "group": "quiet", "delay": 1}]})
    assert response.status_code == 200, response.text
    assert _bodies(await receive(client, queue, max=10, visibility_timeout=60)) == ["now"]
    got: list[dict[str, Any]] = []

    async def arrived() -> bool:
        got.extend(await receive(client, queue, max=10, visibility_timeout=60))
        return bool(got)

    await eventually(arrived, seconds=10)
    assert _bodies(got) == ["soon"]


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
    # Extended to three seconds: the tenant's turn is at the first lease's end,
    # early; the claim that finds it so gives it the next at the new end.
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
    await redriven(client, dlq)
    got = await receive(client, source, max=10)
    assert sorted(_bodies(got)) == ["early", "named"]
    assert sorted(m.get("group") or "" for m in got) == ["", "quiet"]


async def test_a_stray_adopted_and_a_tenant_without_a_turn_come_back_below_the_floors(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """The seldom repairs give a turn at the deadline of a message they find
    stranded, below the floor the claims read from by then: each tells its
    queue changed, and the claims of every process read from the start again
    (within a look-back of 30 s they would not)."""
    queue = await make_queue(client, fair=True)
    queue_id = await queue_id_of(client, queue)
    app: Any = client.app  # type: ignore[attr-defined]
    found = await app.state.service.queues.find(queue)
    await _held(client, db, queue, "")
    for n in range(3):  # claims that leave a floor above a minute ago
        await send(client, queue, f"m{n}", group="other")
        assert len(await receive(client, queue, max=10, visibility_timeout=60)) == 1
    assert found.floors.params()["ready_floor"] is not None

    async def received(body: str) -> bool:
        return _bodies(await receive(client, queue, max=10, visibility_timeout=60)) == [body]

    # As a process that had not yet heard the queue became fair would store it.
    await db.execute("INSERT INTO leaseq.messages (queue_id, body, visible_at) "
                     "VALUES ($1, 'stray', now() - interval '1 minute')", queue_id)
    assert await adopt_strays(app.state.db) == 1
    await eventually(lambda: received("stray"), seconds=10)
    # As a writer of a version from before the turns would leave it: a message
    # whose tenant has no turn. The seldom round gives it one.
    await db.execute("INSERT INTO leaseq.messages (queue_id, body, tenant, visible_at) "
                     "VALUES ($1, 'turnless', 'new', now() - interval '1 minute')", queue_id)
    assert await receive(client, queue, max=10) == []
    assert await restore_turns(app.state.db) == 1
    assert await restore_turns(app.state.db) == 0
    await eventually(lambda: received("turnless"), seconds=10)


async def test_a_checkpoint_gives_its_tenant_a_turn_at_the_leases_new_end(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """A checkpoint renews the lease as a heartbeat does: a claim reads no
    message whose deadline is to come, so the new end needs a turn of its own."""
    queue = await make_queue(client, fair=True, visibility_timeout=60)
    held = await _held(client, db, queue)
    saved = await client.put(f"{_lease_of(client, queue, held)}/checkpoint",
                             json={"cursor": {"page": 2}})
    assert saved.status_code == 200, saved.text
    deadline = await db.fetchval("SELECT visible_at FROM leaseq.messages")
    assert await db.fetchval(
        "SELECT count(*) FROM leaseq.turns WHERE tenant = 'quiet' AND at = $1", deadline) == 1


async def test_the_rounds_forget_empty_tenants_and_restore_a_lost_turn(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client, fair=True)
    app: Any = client.app  # type: ignore[attr-defined]
    held = await _held(client, db, queue, "gone")
    await judge_tenants(app.state.db)  # one in flight: the round keeps its row
    count = "SELECT count(*) FROM leaseq.tenants WHERE tenant = 'gone'"
    assert await db.fetchval(count) == 1
    # Acknowledged through the SQL API: nothing left in flight and no processing
    # time counted (the SQL API sums none), so the round forgets the tenant.
    await db.execute("SELECT leaseq.delete($1, $2)", queue, held["receipt_handle"])
    await judge_tenants(app.state.db)
    assert await db.fetchval(count) == 0
    # A turn lost by a fault: the seldom round gives the tenant one again.
    await send(client, queue, "late", group="late")
    await db.execute("UPDATE leaseq.turns SET at = now() + interval '1 hour' "
                     "WHERE tenant = 'late'")
    assert await receive(client, queue, max=10) == []
    assert await restore_turns(app.state.db) == 1
    assert _bodies(await receive(client, queue, max=10)) == ["late"]


async def test_a_leases_turn_goes_with_the_last_message_it_was_for(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """A claim gives each tenant a turn at its lease's end; a heartbeat moves a
    message to a turn at the new end; an acknowledgement or a heartbeat takes
    the old turn away once no message of the tenant is left at that end."""
    queue = await make_queue(client, fair=True)
    for body in ("one", "two"):
        await send(client, queue, body, group="quiet")
    one, two = await receive(client, queue, max=10, visibility_timeout=60)
    turns = ("SELECT array_agg(at ORDER BY at) FROM leaseq.turns "
             "WHERE tenant = 'quiet' AND at > now()")
    (lease_end,) = await db.fetchval(turns)
    deleted = await client.delete(_lease_of(client, queue, one))
    assert deleted.status_code == 204, deleted.text
    assert await db.fetchval(turns) == [lease_end]  # "two" is still leased to then
    extended = await client.patch(f"{_lease_of(client, queue, two)}/visibility",
                                  json={"timeout": 120})
    assert extended.status_code == 200, extended.text
    (new_end,) = await db.fetchval(turns)
    assert new_end > lease_end
    deleted = await client.delete(_lease_of(client, queue, two))
    assert deleted.status_code == 204, deleted.text
    assert await db.fetchval("SELECT count(*) FROM leaseq.turns") == 0


async def test_an_emptied_tenant_leaves_the_walk_at_the_claim_that_finds_it_empty(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client, fair=True)
    held = await _held(client, db, queue)
    # Acknowledged through the SQL API, which deletes no turn: the one at the
    # lease's end stays until a claim reads it, finds nothing, and deletes it.
    await db.execute("SELECT leaseq.delete($1, $2)", queue, held["receipt_handle"])
    assert await _bound(db, queue, "quiet") is not None
    await _due_now(db, queue, "quiet")
    assert await receive(client, queue, max=10) == []
    assert await _bound(db, queue, "quiet") is None


async def test_a_purge_leaves_no_tenant_in_the_walk(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client, fair=True)
    for tenant in ("a", "b", "c"):
        await send(client, queue, tenant, group=tenant)
    purged = await client.post(f"/v1/queues/{queue}/purge")
    assert purged.status_code == 200, purged.text
    assert await db.fetch("SELECT * FROM leaseq.turns") == []
    await send(client, queue, "after", group="b")
    assert _bodies(await receive(client, queue, max=10)) == ["after"]


async def test_a_claim_loses_no_send_its_snapshot_missed(
    client: httpx.AsyncClient, db: asyncpg.Connection, database_url: str,
) -> None:
    """A caller's transaction sends to the tenant and stays open; a claim takes
    the tenant's one message it sees, deletes the turn it read and inserts the
    next at its lease's end. The send's own turn, which the claim could not
    see, brings the tenant's second message once the caller commits."""
    queue = await make_queue(client, fair=True)
    await send(client, queue, "first", group="quiet")
    other = await asyncpg.connect(plain_url(database_url))
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute("SELECT leaseq.send($1, 'second', \"group\" => 'quiet')", queue)
        assert _bodies(await receive(client, queue, max=10, visibility_timeout=60)) == ["first"]
        assert await db.fetchval("SELECT $1 > now() + interval '50 seconds'",
                                 await _bound(db, queue, "quiet"))
        await tx.commit()
    finally:
        await other.close()
    assert _bodies(await receive(client, queue, max=10)) == ["second"]


# -- a held cleanup horizon ---------------------------------------------------------


async def _cycle(client: httpx.AsyncClient, queue: str, count: int, tenants: int) -> None:
    """`count` messages sent in batches of ten over `tenants` tenants, received
    ten at a time and acknowledged."""
    await cycle(client, queue, ([{"body": f"m{n}", "group": f"t{n % tenants}"}
                                 for n in range(start, start + 10)]
                                for start in range(0, count, 10)))


async def test_a_fair_claim_costs_the_same_while_a_transaction_holds_the_horizon(
    client: httpx.AsyncClient, db: asyncpg.Connection, database_url: str,
) -> None:
    """While a REPEATABLE READ transaction stays open, no VACUUM removes a row
    version settled since it began. Rewritten by every claim and
    acknowledgement, each tenant's row kept thousands of versions, and a fair
    claim of ten read about 45 times the buffers it reads on a clean database
    (docs/decisions.md). Its tenants are now found through turns, inserted and
    deleted and read from the claims' floor, and nothing per tenant is written
    per message: the claim reads about as much after 4,000 messages settled
    under the held horizon as before."""
    queue = await make_queue(client, fair=True)
    queue_id = await queue_id_of(client, queue)
    app: Any = client.app  # type: ignore[attr-defined]
    await _cycle(client, queue, 500, 10)
    # A standing backlog of ten a tenant, as the bench keeps.
    await _cycle_free_send(client, queue, 100, 10)
    found = await app.state.service.queues.find(queue)

    async def claim_buffers() -> int:
        return await _claim_buffers(db, queue_id, found.floors.params()["ready_floor"])

    clean = await claim_buffers()
    async with held_horizon(database_url):
        await _cycle(client, queue, 4000, 10)
        held = await claim_buffers()
        # The fairness round looks into the messages of each tenant with some
        # in flight: from the claims' floor, only what was settled since.
        await receive(client, queue, max=10, visibility_timeout=60)
        floor = found.floors.params()["ready_floor"]
        assert floor is not None
        from_floor = await _round_buffers(db, {queue_id: floor})
        from_start = await _round_buffers(db, {})
    assert held <= 2 * clean + 100, (clean, held)
    assert 2 * from_floor < from_start, (from_floor, from_start)


async def _round_buffers(db: asyncpg.Connection, floors: dict[int, Any]) -> int:
    """Buffers one fairness round reads or writes, rolled back."""
    sql, args = positional("fairness_round", {
        "floor_queues": list(floors), "floors": list(floors.values())})
    return await statement_buffers(db, sql, args)


async def _cycle_free_send(client: httpx.AsyncClient, queue: str, count: int,
                           tenants: int) -> None:
    response = await client.post(f"/v1/queues/{queue}/messages", json={"messages": [
        {"body": f"s{n}", "group": f"t{n % tenants}"} for n in range(count)]})
    assert response.status_code == 200, response.text
