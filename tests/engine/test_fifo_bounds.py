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
    make_queue,
    positional,
    queue_id_of,
    receive,
    redriven,
    statement_buffers,
)

from app.db.engine import plain_url
from app.queue.grouped import Take
from app.queue.grouped_fifo import fifo_claim_params


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

    async def claim_buffers() -> int:
        sql, args = positional("claim_fifo_messages", fifo_claim_params(found, 30, [Take(10)]))
        return min([await statement_buffers(db, sql, args) for _ in range(3)])

    clean = await claim_buffers()
    holder = await asyncpg.connect(plain_url(database_url))
    try:
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT count(*) FROM leaseq.queues")
        await _cycle(client, queue, 500, 4000, 10)
        held = await claim_buffers()
        # What it kept: each acknowledged message's versions, which the
        # group's range still holds, and the turns read and deleted.
        kept = await db.fetchval(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'messages_g0'")
    finally:
        await holder.close()
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
