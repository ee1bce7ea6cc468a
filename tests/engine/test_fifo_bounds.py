"""FIFO queues' groups by their turns and heads (issue 44, step four): a FIFO
claim reads the groups whose turn has come, each from the last head a claim
saw, so its cost does not grow with what a held cleanup horizon keeps; and
every write that sets a message's deadline gives its group a turn, so that no
group stalls behind a turn it lost."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
from support import (
    cycle,
    held_horizon,
    make_queue,
    positional,
    queue_id_of,
    receive,
    redriven,
    statement_buffers,
)

from app.queue.grouped import Take
from app.queue.grouped_fifo import fifo_claim_params
from app.queue.models import Queue
from app.queue.retention import BACKSTOP_EVERY, DeduplicationSweep


async def _fifo(client: httpx.AsyncClient, name: str = "steps.fifo", **attrs: Any) -> str:
    return await make_queue(client, name, fifo=True, **attrs)


async def _send(client: httpx.AsyncClient, queue: str, body: str, group: str = "G") -> None:
    response = await client.post(f"/v1/queues/{queue}/messages", json={
        "body": body, "group": group, "deduplication_id": f"{queue}-{body}"})
    assert response.status_code == 201, response.text


def _bodies(messages: list[dict[str, Any]]) -> list[str]:
    return [m["body"] for m in messages]


def _lease(queue: str, message: dict[str, Any]) -> str:
    return f"/v1/queues/{queue}/messages/{message['receipt_handle']}"


async def _cycle(client: httpx.AsyncClient, queue: str, start: int, count: int,
                 groups: int) -> None:
    """`count` messages sent in batches of ten over `groups` groups, received
    ten at a time and acknowledged."""
    await cycle(client, queue, ([{"body": f"m{n}", "group": f"g{n % groups}",
                                  "deduplication_id": f"d{n}"}
                                 for n in range(first, first + 10)]
                                for first in range(start, start + count, 10)))


async def _claim_buffers(db: asyncpg.Connection, found: Queue) -> int:
    """Buffers a FIFO claim of ten reads, the least of three tries."""
    sql, args = positional("claim_fifo_messages", fifo_claim_params(found, 30, [Take(10)]))
    return min([await statement_buffers(db, sql, args) for _ in range(3)])


# -- a receive's cost ---------------------------------------------------------------


async def test_a_fifo_claim_costs_the_same_while_a_transaction_holds_the_horizon(
    client: httpx.AsyncClient, db: asyncpg.Connection, database_url: str,
) -> None:
    """While a REPEATABLE READ transaction stays open, no VACUUM removes a row
    version settled since it began. Each group's row, rewritten by every send,
    claim and acknowledgement of the group, kept them all, and each group's
    messages were read from the start of its range, past every message it
    settled: a FIFO queue of 100 groups fell to a ninth of its rate in three
    minutes (docs/performance.md). Through turns from the claims' floor and
    each group's last head, a claim of ten reads about as much after 4,000
    messages settled under the held horizon as before."""
    queue = await _fifo(client)
    app: Any = client.app  # type: ignore[attr-defined]
    await _cycle(client, queue, 0, 500, 10)
    # A standing backlog of a few a group, as the bench keeps.
    response = await client.post(f"/v1/queues/{queue}/messages", json={"messages": [
        {"body": f"s{n}", "group": f"g{n % 10}", "deduplication_id": f"s{n}"}
        for n in range(10)]})
    assert response.status_code == 200, response.text
    found = await app.state.service.queues.find(queue)
    clean = await _claim_buffers(db, found)
    async with held_horizon(database_url):
        await _cycle(client, queue, 500, 4000, 10)
        held = await _claim_buffers(db, found)
        # What it kept: each acknowledged message's versions, which the
        # group's range still holds, and the turns read and deleted.
        kept = await db.fetchval(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'messages_g0'")
    assert held <= 2 * clean + 100, (clean, held, kept)


# -- every writer brings its group back ---------------------------------------------


async def test_a_heartbeat_gives_the_group_a_turn_at_the_leases_new_end(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """A claim reads no deadline to come: a head in flight is met at its
    lease's end by that lease's own turn, so a heartbeat that moves the end
    gives one there."""
    queue = await _fifo(client)
    await _send(client, queue, "a0")
    await _send(client, queue, "a1")
    (head,) = await receive(client, queue, max=1, visibility_timeout=60)
    beat = await client.patch(f"{_lease(queue, head)}/visibility", json={"timeout": 600})
    assert beat.status_code == 200, beat.text
    deadline = await db.fetchval("SELECT visible_at FROM leaseq.messages WHERE body = 'a0'")
    assert await db.fetchval(
        "SELECT count(*) FROM leaseq.turns WHERE tenant = 'G' AND at = $1", deadline) == 1
    # The turn at the first lease's end, come early, finds the head in flight.
    await db.execute("UPDATE leaseq.turns SET at = now() WHERE at < $1", deadline)
    assert await receive(client, queue, max=10) == []
    # Released, the head is the group's again at once, and its order holds.
    released = await client.patch(f"{_lease(queue, head)}/visibility", json={"timeout": 0})
    assert released.status_code == 200, released.text
    assert _bodies(await receive(client, queue, max=10)) == ["a0", "a1"]


async def test_a_checkpoint_gives_the_group_a_turn_at_the_leases_new_end(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await _fifo(client, visibility_timeout=60)
    await _send(client, queue, "a0")
    (head,) = await receive(client, queue, max=1)
    saved = await client.put(f"{_lease(queue, head)}/checkpoint", json={"cursor": {"page": 2}})
    assert saved.status_code == 200, saved.text
    deadline = await db.fetchval("SELECT visible_at FROM leaseq.messages")
    assert await db.fetchval(
        "SELECT count(*) FROM leaseq.turns WHERE tenant = 'G' AND at = $1", deadline) == 1


async def test_a_release_and_a_give_back_bring_the_group_back_at_once(
    client: httpx.AsyncClient,
) -> None:
    queue = await _fifo(client)
    await _send(client, queue, "a0")
    (head,) = await receive(client, queue, max=1, visibility_timeout=600)
    released = await client.post(f"{_lease(queue, head)}/release", json={})
    assert released.status_code == 200, released.text
    (again,) = await receive(client, queue, max=10, visibility_timeout=600)
    assert again["body"] == "a0"


async def test_a_shorter_delay_makes_a_waiting_group_claimable_at_once(
    client: httpx.AsyncClient,
) -> None:
    """A FIFO message counts the queue's delay from its sending: a group whose
    turn is the delay's end is claimable once the delay is shortened."""
    queue = await _fifo(client, delay=600)
    await _send(client, queue, "a0")
    assert await receive(client, queue, max=10) == []
    changed = await client.patch(f"/v1/queues/{queue}", json={"delay": 0})
    assert changed.status_code == 200, changed.text
    assert _bodies(await receive(client, queue, max=10)) == ["a0"]


async def test_a_longer_delay_keeps_the_group_until_its_end(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """The send's turn comes at the old delay's end; the claim that finds the
    head still waiting gives the group a turn at the new end."""
    queue = await _fifo(client)
    changed = await client.patch(f"/v1/queues/{queue}", json={"delay": 0})
    assert changed.status_code == 200
    await _send(client, queue, "a0")
    changed = await client.patch(f"/v1/queues/{queue}", json={"delay": 600})
    assert changed.status_code == 200, changed.text
    assert await receive(client, queue, max=10) == []
    assert await db.fetchval(
        "SELECT count(*) FROM leaseq.turns WHERE tenant = 'G' "
        "AND at > now() + interval '500 seconds'") == 1


async def test_a_message_dead_lettered_into_a_fifo_queue_goes_after_its_group_there(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """A message entering a group takes a number above all the group holds (a
    claim reads each group from the last head it saw, below which nothing may
    come): moved to the dead-letter queue, it goes to the end of its group
    there, after a message sent there since, and is claimable at once."""
    dlq = await _fifo(client, "dead.fifo")
    source = await _fifo(client, "work.fifo", dead_letter_queue=dlq, max_receive_count=1)
    await _send(client, source, "first")
    await _send(client, dlq, "direct")
    (once,) = await receive(client, source, max=1, visibility_timeout=600)
    released = await client.patch(f"{_lease(source, once)}/visibility", json={"timeout": 0})
    assert released.status_code == 200, released.text
    assert await receive(client, source, max=10) == []  # moves it
    got = await receive(client, dlq, max=10)
    assert _bodies(got) == ["direct", "first"]
    numbers = [int(m["sequence_number"]) for m in got]
    assert numbers == sorted(numbers)


async def test_a_redriven_message_is_claimable_in_its_fifo_queue_at_once(
    client: httpx.AsyncClient,
) -> None:
    dlq = await _fifo(client, "dead.fifo")
    source = await _fifo(client, "work.fifo", dead_letter_queue=dlq, max_receive_count=1)
    await _send(client, source, "a0")
    (once,) = await receive(client, source, max=1, visibility_timeout=600)
    released = await client.patch(f"{_lease(source, once)}/visibility", json={"timeout": 0})
    assert released.status_code == 200
    assert await receive(client, source, max=10) == []
    await redriven(client, dlq)
    assert _bodies(await receive(client, source, max=10)) == ["a0"]


async def test_the_claims_learn_each_groups_head_and_forget_them_when_retention_grows(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await _fifo(client, message_retention=3600)
    for n in range(3):
        await _send(client, queue, f"a{n}")
    first = await receive(client, queue, max=1, visibility_timeout=600)
    ack = await client.delete(_lease(queue, first[0]))
    assert ack.status_code == 204
    assert _bodies(await receive(client, queue, max=10)) == ["a1", "a2"]
    numbers = await db.fetch(
        "SELECT sequence_number FROM leaseq.messages ORDER BY sequence_number")
    assert await db.fetchval("SELECT max(since) FROM leaseq.group_heads") == \
        numbers[0]["sequence_number"]
    changed = await client.patch(f"/v1/queues/{queue}", json={"message_retention": 7200})
    assert changed.status_code == 200, changed.text
    assert await db.fetchval(
        "SELECT count(*) FROM leaseq.group_heads WHERE queue_id = $1",
        await queue_id_of(client, queue)) == 0


async def test_a_replayed_receive_attempt_gives_the_group_a_turn_at_the_leases_new_end(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """SQS's ReceiveRequestAttemptId: a retried receive gets the same messages
    with their leases set from now again, and the group a turn at the new end."""
    queue = await _fifo(client)
    await _send(client, queue, "a0")
    app: Any = client.app  # type: ignore[attr-defined]
    service = app.state.service
    (first,) = await service.receive(queue, max_messages=1, visibility_timeout=600,
                                     attempt_id="try-1")
    (again,) = await service.receive(queue, max_messages=1, attempt_id="try-1")
    assert again.message_id == first.message_id
    deadline = await db.fetchval("SELECT visible_at FROM leaseq.messages")
    assert deadline > first.lease_expires_at
    assert await db.fetchval(
        "SELECT count(*) FROM leaseq.turns WHERE tenant = 'G' AND at = $1", deadline) == 1


# -- what the turns and heads leave behind -------------------------------------------


async def test_a_claim_takes_every_turn_due_of_a_group_it_claims_and_none_of_one_it_leaves(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """Every send gives its group a turn. Left there, the turns of a busy group
    piled up behind the claims' walk (a held FIFO bench grew 30,000 of them),
    and each claim deleted and wrote again the turn of every open group it did
    not take. A claim now deletes every turn due of a group it claims from,
    and leaves an open group's as they are."""
    queue = await _fifo(client)
    for n in range(3):
        await _send(client, queue, f"a{n}", group="A")
    await _send(client, queue, "b0", group="B")
    before = await db.fetch(
        "SELECT tenant, ctid::text AS ctid FROM leaseq.turns WHERE tenant = 'B'")
    got = await receive(client, queue, max=3, visibility_timeout=600)
    assert _bodies(got) == ["a0", "a1", "a2"]
    # A: the turn at its lease's end alone; B, open and not taken: untouched.
    assert await db.fetchval(
        "SELECT count(*) FROM leaseq.turns WHERE tenant = 'A' AND at <= now()") == 0
    assert await db.fetchval(
        "SELECT count(*) FROM leaseq.turns WHERE tenant = 'A' AND at > now()") == 1
    after = await db.fetch(
        "SELECT tenant, ctid::text AS ctid FROM leaseq.turns WHERE tenant = 'B'")
    assert [dict(r) for r in after] == [dict(r) for r in before]
    assert _bodies(await receive(client, queue, max=3)) == ["b0"]


async def test_a_claim_that_learns_a_groups_next_head_forgets_the_one_it_read(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await _fifo(client)
    for n in range(3):
        await _send(client, queue, f"a{n}")
    for expected in ("a0", "a1", "a2"):
        (got,) = await receive(client, queue, max=1, visibility_timeout=600)
        assert got["body"] == expected
        ack = await client.delete(_lease(queue, got))
        assert ack.status_code == 204, ack.text
    # The receive after a2's acknowledgement finds the group empty; the one
    # that took a2 learned its head: one head left, the last.
    assert await receive(client, queue, max=1) == []
    heads = await db.fetch("SELECT since FROM leaseq.group_heads")
    last = await db.fetchval("SELECT max(sequence_number) FROM leaseq.messages")
    assert last is None or [r["since"] for r in heads] == [last]
    assert len(heads) == 1


async def test_the_sweep_forgets_the_heads_no_claim_reads(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """A head superseded that a claim left (another held it), and the last
    head of a group with no turn learnt more than ten minutes ago; the head a
    claim reads stays."""
    queue = await _fifo(client)
    await _send(client, queue, "a0", group="A")
    await _send(client, queue, "b0", group="B")
    queue_id = await queue_id_of(client, queue)
    await db.execute(
        "INSERT INTO leaseq.group_heads (queue_id, group_id, since, learned_at) VALUES "
        "($1, 'A', 1, now()), ($1, 'A', 2, now()), "
        "($1, 'B', 3, now() - interval '11 minutes'), "
        "($1, 'C', 4, now() - interval '11 minutes'), ($1, 'D', 5, now())", queue_id)
    app: Any = client.app  # type: ignore[attr-defined]
    assert await DeduplicationSweep(app.state.db).sweep_heads(batch=1) == 2
    left = await db.fetch("SELECT group_id, since FROM leaseq.group_heads ORDER BY since")
    # A's superseded head and C's (no turn, old) go; B has a turn, D is recent.
    assert [(r["group_id"], r["since"]) for r in left] == [("A", 2), ("B", 3), ("D", 5)]


async def test_the_deduplication_sweep_reads_from_where_it_stopped_and_from_the_start_seldom(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """Under a held horizon the expiry index keeps every id a sweep deleted, so
    a round reads from the last expiry it reached. A row that turns up below
    it (its writer's transaction outlived its five minutes) waits for the
    round from the start."""
    queue = await _fifo(client)
    for n in range(3):
        await _send(client, queue, f"m{n}")
    await db.execute(
        "UPDATE leaseq.message_deduplication SET expires_at = now() - interval '1 minute' "
        "WHERE deduplication_id LIKE '%-m1'")
    clock = [0.0]
    app: Any = client.app  # type: ignore[attr-defined]
    sweep = DeduplicationSweep(app.state.db, clock=lambda: clock[0])
    assert await sweep.once() == 1
    # Committed late, below where the sweep stopped.
    await db.execute(
        "UPDATE leaseq.message_deduplication SET expires_at = now() - interval '2 minutes' "
        "WHERE deduplication_id LIKE '%-m0'")
    assert await sweep.once() == 0
    clock[0] = BACKSTOP_EVERY
    assert await sweep.once() == 1
    left = await db.fetch("SELECT deduplication_id FROM leaseq.message_deduplication")
    assert [r[0] for r in left] == [f"{queue}-m2"]


async def test_a_claim_reads_each_groups_newest_head_from_the_top_of_its_index(
    client: httpx.AsyncClient, db: asyncpg.Connection, database_url: str,
) -> None:
    """About one head a group is live, so PostgreSQL would estimate one row a
    group and read the group's every index entry by a bitmap: under a held
    horizon, every head the group ever had. Told a group has many (0026), it
    reads from the top and stops at the first."""
    queue = await _fifo(client)
    for n in range(20):
        await _send(client, queue, f"m{n}", group=f"g{n % 10}")
    found = await client.app.state.service.queues.find(queue)  # type: ignore[attr-defined]
    queue_id = await queue_id_of(client, queue)
    clean = await _claim_buffers(db, found)
    async with held_horizon(database_url):
        # Each group's heads learned one after another, each superseding the
        # last (all below the groups' messages: any lower bound is a head).
        for since in range(-300, 0):
            await db.execute(
                "WITH learned AS (INSERT INTO leaseq.group_heads (queue_id, group_id, since) "
                "SELECT $1, 'g' || g, $2 FROM generate_series(0, 9) AS g) "
                "DELETE FROM leaseq.group_heads WHERE queue_id = $1 AND since < $2",
                queue_id, since)
        await db.execute("ANALYZE leaseq.group_heads")
        held = await _claim_buffers(db, found)
    assert held <= clean + 100, (clean, held)
