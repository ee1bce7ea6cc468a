"""Group commit: concurrent requests share statements, and each keeps its own
result and error."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
import pytest
from support import eventually, make_queue, receive, send, wait_until

from app.db.connector import DatabaseError
from app.errors import DatabaseUnavailable
from app.queue.coalesce import Coalescer
from app.queue.models import OutgoingMessage, SentMessage
from app.queue.service import QueueService

# -- the grouping itself (no database: the statement is a function here) -----


class Recorder:
    """A statement that records the groups it was given and can be held open."""

    def __init__(self) -> None:
        self.groups: list[list[list[int]]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.refuse: set[int] = set()
        self.unavailable = False
        self.started = asyncio.Event()

    async def run(self, key: str, groups: list[list[int]]) -> list[list[int]]:
        self.groups.append(groups)
        self.started.set()
        await self.gate.wait()
        if self.unavailable:
            raise DatabaseUnavailable()
        if self.refuse & {item for group in groups for item in group}:
            raise ValueError("refused")
        return [[item * 10 for item in group] for group in groups]


async def _pile_up(coalescer: Coalescer[str, int, list[int]], recorder: Recorder,
                   requests: list[list[int]]) -> list[Any]:
    """The first request's statement is held open while the others arrive."""
    recorder.gate.clear()
    tasks = [asyncio.create_task(coalescer.submit("q", requests[0]))]
    await recorder.started.wait()
    tasks += [asyncio.create_task(coalescer.submit("q", items)) for items in requests[1:]]
    for _ in range(3):  # every other request gets in line behind the first statement
        await asyncio.sleep(0)
    recorder.gate.set()
    return await asyncio.gather(*tasks, return_exceptions=True)


async def test_requests_arriving_during_a_statement_share_the_next() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.run, limit=100)
    results = await _pile_up(coalescer, recorder, [[i] for i in range(20)])
    assert results == [[i * 10] for i in range(20)]
    assert [len(g) for g in recorder.groups] == [1, 19]
    assert coalescer.statements == 2


async def test_a_lone_request_runs_at_once_in_a_group_of_one() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.run, limit=100)
    assert await coalescer.submit("q", [1, 2]) == [10, 20]
    assert recorder.groups == [[[1, 2]]]


async def test_a_group_never_exceeds_the_limit_but_a_heavy_request_still_runs() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.run, limit=4)
    results = await _pile_up(coalescer, recorder, [[0], [1, 2], [3, 4], [5], [6, 7, 8, 9, 10]])
    assert results == [[0], [10, 20], [30, 40], [50], [60, 70, 80, 90, 100]]
    weights = [sum(len(items) for items in group) for group in recorder.groups]
    assert weights == [1, 4, 1, 5]  # [5] and the 5-item request cannot share a group


async def test_a_refused_entry_fails_only_the_request_that_brought_it() -> None:
    recorder = Recorder()
    recorder.refuse = {7}
    coalescer = Coalescer(recorder.run, limit=100)
    results = await _pile_up(coalescer, recorder, [[i] for i in range(10)])
    assert isinstance(results[7], ValueError)
    assert [r for i, r in enumerate(results) if i != 7] == [[i * 10] for i in range(10) if i != 7]


async def test_a_lost_connection_is_not_retried_request_by_request() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.run, limit=100)
    recorder.unavailable = True
    results = await _pile_up(coalescer, recorder, [[i] for i in range(5)])
    assert all(isinstance(r, DatabaseUnavailable) for r in results)
    assert len(recorder.groups) == 2  # the first alone, then the other four together: no retries


async def test_a_row_already_in_the_group_waits_for_the_next_statement() -> None:
    recorder = Recorder()
    coalescer: Coalescer[str, int, list[int]] = Coalescer(
        recorder.run, limit=100, rows=lambda item: (item,)
    )
    results = await _pile_up(coalescer, recorder, [[0], [1], [2], [1, 3], [4]])
    assert results == [[0], [10], [20], [10, 30], [40]]
    assert recorder.groups[1] == [[1], [2], [4]]
    assert recorder.groups[2] == [[1, 3]]


async def test_a_claim_whose_caller_stopped_waiting_is_handed_to_abandoned() -> None:
    recorder = Recorder()
    abandoned: list[list[int]] = []

    async def give_back(key: str, result: list[int]) -> None:
        abandoned.append(result)

    coalescer = Coalescer(recorder.run, limit=100, abandoned=give_back)
    recorder.gate.clear()
    task = asyncio.create_task(coalescer.submit("q", [4]))
    await recorder.started.wait()
    task.cancel()
    recorder.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: bool(abandoned))
    assert abandoned == [[40]]


# -- grouped statements on PostgreSQL ------------------------------------------


def _service(client: httpx.AsyncClient) -> QueueService:
    service: QueueService = client.app.state.service  # type: ignore[attr-defined]
    return service


async def test_concurrent_single_sends_share_inserts_and_all_land(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    await make_queue(client, "grouped")
    group = _service(client).group
    before = group.line("send").statements
    ids = await asyncio.gather(*(send(client, "grouped", f"m{i}") for i in range(60)))
    statements = group.line("send").statements - before
    assert len(set(ids)) == 60
    assert statements < 60, "no two sends shared a statement"
    metrics = (await client.get("/metrics")).text
    line = group.line("send")
    assert f'leaseq_grouped_requests_total{{operation="send"}} {line.requests}' in metrics
    assert f'leaseq_grouped_statements_total{{operation="send"}} {line.statements}' in metrics
    assert group.line("send").requests == 60
    rows = await db.fetch(
        "SELECT body FROM leaseq.messages m JOIN leaseq.queues q ON q.id = m.queue_id WHERE "
        "q.name = 'grouped'"
    )
    assert sorted(r["body"] for r in rows) == sorted(f"m{i}" for i in range(60))


async def test_concurrent_short_polls_share_claims_and_never_share_a_message(
    client: httpx.AsyncClient,
) -> None:
    await make_queue(client, "grouped")
    response = await client.post(
        "/v1/queues/grouped/messages", json={"messages": [{"body": str(i)} for i in range(50)]}
    )
    assert response.status_code == 200
    group = _service(client).group
    before = group.line("claim").statements
    batches = await asyncio.gather(
        *(receive(client, "grouped", max=2, visibility_timeout=60) for _ in range(40))
    )
    bodies = [m["body"] for batch in batches for m in batch]
    assert sorted(bodies, key=int) == [str(i) for i in range(50)]  # each exactly once
    assert all(len(batch) <= 2 for batch in batches)
    assert group.line("claim").statements - before < 40
    tokens = [m["fencing_token"] for batch in batches for m in batch]
    assert len(set(tokens)) == 50


async def _claimed(client: httpx.AsyncClient, count: int, lease: int) -> list[dict[str, Any]]:
    """A queue "grouped" with `count` messages, all claimed (ten at a time)."""
    await make_queue(client, "grouped")
    for i in range(count):
        await send(client, "grouped", str(i))
    claimed: list[dict[str, Any]] = []
    while len(claimed) < count:
        batch = await receive(client, "grouped", max=10, visibility_timeout=lease)
        assert batch, "a message sent was not claimable"
        claimed += batch
    return claimed


async def test_grouped_acknowledgements_keep_each_handles_own_answer(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    claimed = await _claimed(client, 30, lease=60)
    handles = [m["receipt_handle"] for m in claimed]
    # The same handle twice at once: one acknowledgement wins, the other is stale.
    twice = handles[0]
    answers = await asyncio.gather(
        *(client.delete(f"/v1/queues/grouped/messages/{h}") for h in [*handles, twice])
    )
    statuses = [a.status_code for a in answers]
    assert statuses.count(204) == 30
    assert statuses.count(409) == 1
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 0


async def test_grouped_heartbeats_extend_each_lease_and_refuse_stale_handles(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    claimed = await _claimed(client, 20, lease=5)
    stale = claimed[0]["receipt_handle"]
    deleted = await client.delete(f"/v1/queues/grouped/messages/{stale}")
    assert deleted.status_code == 204
    answers = await asyncio.gather(*(
        client.patch(f"/v1/queues/grouped/messages/{m['receipt_handle']}/visibility",
                     json={"timeout": 600})
        for m in claimed
    ))
    assert answers[0].status_code == 409
    assert all(a.status_code == 200 for a in answers[1:])
    far = await db.fetchval(
        "SELECT count(*) FROM leaseq.messages WHERE visible_at > now() + interval '500 seconds'"
    )
    assert far == 19


async def test_an_entry_postgresql_refuses_fails_only_its_own_send(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """Below the API (which refuses NUL itself): PostgreSQL's text cannot hold a
    NUL, so that INSERT fails; the sends grouped with it still land."""
    await make_queue(client, "grouped")
    service = _service(client)
    bodies = [f"ok {i}" for i in range(12)]
    bodies[5] = "bad \x00 body"
    results = await asyncio.gather(
        *(service.send("grouped", [OutgoingMessage(body=b)]) for b in bodies),
        return_exceptions=True,
    )
    assert isinstance(results[5], DatabaseError)
    assert all(
        isinstance(r, list) and isinstance(r[0], SentMessage)
        for i, r in enumerate(results) if i != 5
    )
    stored = {r["body"] for r in await db.fetch("SELECT body FROM leaseq.messages")}
    assert stored == {b for i, b in enumerate(bodies) if i != 5}


async def test_heartbeats_across_many_queues_hold_at_most_their_connection_budget(
    app_factory: Any,
) -> None:
    # 12: six connections keep cached plans, and heartbeats may hold two of them
    client = await app_factory(pool_size=12)
    group = _service(client).group
    handles: list[tuple[str, str]] = []
    for q in range(8):
        await make_queue(client, f"beats{q}")
        response = await client.post(
            f"/v1/queues/beats{q}/messages", json={"messages": [{"body": "x"}] * 5}
        )
        assert response.status_code == 200
        handles += [(f"beats{q}", m["receipt_handle"])
                    for m in await receive(client, f"beats{q}", max=5)]
    answers = await asyncio.gather(*(
        client.patch(f"/v1/queues/{queue}/messages/{handle}/visibility", json={"timeout": 120})
        for _ in range(3) for queue, handle in handles
    ))
    assert [a.status_code for a in answers] == [200] * 120
    assert group.budgeted_in_flight_peak == 2  # eight queues, yet never more than two
    assert group.budgeted_in_flight == 0


async def test_a_grouped_claim_nobody_waits_for_is_given_back_uncounted(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """A short poll cancelled while its grouped claim runs (its client went away):
    the message it took is visible again at once, and the receive it counted is
    taken back, so it comes no nearer to its dead-letter queue."""
    await make_queue(client, "abandoned")
    await send(client, "abandoned", "lonely")
    service = _service(client)
    claims = service.group.line("claim")
    before = claims.statements
    async with db.transaction():
        # The claim's UPDATE waits for this lock: the request is cancelled meanwhile.
        await db.execute("LOCK TABLE leaseq.messages IN SHARE MODE")
        receiving = asyncio.create_task(service.receive("abandoned", max_messages=1, wait=0))
        await wait_until(lambda: claims.statements > before)
        await wait_until(lambda: claims.requests > 0)
        receiving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await receiving

    async def given_back() -> bool:
        # Claimed (it has a claim token), then released: not leased, visible.
        row = await db.fetchrow(
            "SELECT claim_token IS NOT NULL AND NOT leased "
            "AND visible_at <= clock_timestamp() AS given FROM leaseq.messages"
        )
        return row is not None and bool(row["given"])

    await eventually(given_back, seconds=10)
    row = await db.fetchrow("SELECT receive_count, first_received_at FROM leaseq.messages")
    assert row["receive_count"] == 0 and row["first_received_at"] is None
    (message,) = await receive(client, "abandoned")
    assert message["body"] == "lonely" and message["receive_count"] == 1


# -- the lean claim -----------------------------------------------------------------


def test_a_plain_claim_takes_the_lean_statement_and_the_rest_the_full_one() -> None:
    import uuid
    from datetime import UTC, datetime

    from app.queue.grouped import Take, _claim_query
    from app.queue.models import Queue, QueueAttributes
    from app.queue.receipts import Receipt
    from app.queue.sql import Q

    def queue(**attributes: Any) -> Queue:
        now = datetime.now(UTC)
        return Queue(1, "q", QueueAttributes(30, 345600, 0, 0, 262144, **attributes), now, now)

    plain, redriven = queue(), queue(dead_letter_queue="dlq", max_receive_count=3)
    acking = [Take(1), Take(1, (Receipt(1, 7, uuid.uuid4()),))]
    # A queue's first claims report its floors (floors.py): both ranges read.
    assert _claim_query((plain, 30), [Take(1), Take(10)]) is Q.claim_ready_messages
    assert _claim_query((plain, 30), acking) is Q.claim_messages
    assert _claim_query((redriven, 30), [Take(1)]) is Q.claim_messages
    # Once a claim came back full and reported, the waiting range alone.
    for claimed in (plain, redriven):
        claimed.floors.learn(None, full_next=False)
        claimed.floors._report_at = float("inf")
    assert _claim_query((plain, 30), [Take(1), Take(10)]) is Q.claim_ready_waiting_messages
    assert _claim_query((plain, 30), acking) is Q.claim_waiting_messages
    assert _claim_query((redriven, 30), [Take(1)]) is Q.claim_waiting_messages


async def test_the_lean_claim_writes_and_returns_what_the_full_claim_does(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """claim_ready_messages is claim_messages without acknowledgements and dead
    letters: the same row written, the same columns returned (a column added to
    one and not the other fails here), a lapsed lease seen by both."""
    from app.queue.sql import Q

    rows = {}
    for name, query in (("lean", Q.claim_ready_messages), ("full", Q.claim_messages),
                        ("lean waiting", Q.claim_ready_waiting_messages),
                        ("full waiting", Q.claim_waiting_messages)):
        queue = await make_queue(client, "claim-" + name.replace(" ", "-"))
        await send(client, queue)
        queue_id = await db.fetchval("SELECT id FROM leaseq.queues WHERE name = $1", queue)
        params = {"queue_id": queue_id, "visibility_timeout": 0, "retention": 345600,
                  "max": 10, "dead_letter_queue_id": None, "max_receive_count": None,
                  "ack_ids": [], "ack_tokens": [], "ready_floor": None, "lease_floor": None}
        args = [params[p] for p in query.params]
        first = [r for r in await db.fetch(query.sql, *args) if r["id"] is not None]
        again = [r for r in await db.fetch(query.sql, *args) if r["id"] is not None]
        stored = await db.fetchrow(
            "SELECT receive_count, leased, claim_token IS NOT NULL AS claimed,"
            " fencing_token IS NOT NULL AS fenced, first_received_at IS NOT NULL AS first,"
            " claimed_at IS NOT NULL AS at FROM leaseq.messages WHERE queue_id = $1", queue_id)
        rows[name] = (first, again, dict(stored))
    claimed_columns = set(rows["full"][0][0].keys()) - {"dead", "acked", "acked_held"}
    for name, (first, again, stored) in rows.items():
        assert set(first[0].keys()) - {"dead", "acked", "acked_held"} == claimed_columns, name
        assert [r["lapsed"] for r in first] == [False]  # never received before
        if name.endswith("waiting"):
            # Its 0-second lease lapsed into the other range, which only the
            # claims that report read.
            assert again == [], name
            assert stored["receive_count"] == 1, name
            continue
        assert [r["lapsed"] for r in again] == [True]   # its 0-second lease lapsed
        assert [r["receive_count"] for r in again] == [2]
        assert stored == {"receive_count": 2, "leased": True, "claimed": True, "fenced": True,
                          "first": True, "at": True}


def test_a_send_naming_no_tenant_takes_the_statement_without_the_tenants_pass() -> None:
    from app.queue.grouped import Outgoing, _send_query
    from app.queue.sql import Q

    plain = Outgoing("a", "{}", None, None, 0, None)
    tenanted = plain._replace(tenant="acme")
    assert _send_query((1, 345600), [plain, plain]) is Q.send_untenanted_messages
    assert _send_query((1, 345600), [plain, tenanted]) is Q.send_messages
    assert _send_query((1, 345600), [plain._replace(tenant="")]) is Q.send_messages


async def test_both_sends_write_the_same_message_and_only_one_gives_a_tenant_a_turn(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """send_untenanted_messages is send_messages without the tenants' pass: the
    same columns written and returned for a message naming no tenant."""
    from app.queue.sql import Q

    written = {}
    for name, query, tenant in (("full", Q.send_messages, "acme"),
                                ("untenanted", Q.send_untenanted_messages, None)):
        queue = await make_queue(client, f"send-{name}")
        queue_id = await db.fetchval("SELECT id FROM leaseq.queues WHERE name = $1", queue)
        params = {"queue_id": queue_id, "retention": 345600, "bodies": ["b"],
                  "attributes": ["{}"], "attribute_types": [None], "sender_ids": [None],
                  "delays": [2], "not_befores": [None], "trace_headers": [None],
                  "tenants": [tenant]}
        (row,) = await db.fetch(query.sql, *[params[p] for p in query.params])
        stored = await db.fetchrow(
            "SELECT body, leased, receive_count, visible_at - sent_at AS delay"
            " FROM leaseq.messages WHERE queue_id = $1", queue_id)
        tenants = await db.fetchval(
            "SELECT count(*) FROM leaseq.turns WHERE queue_id = $1", queue_id)
        written[name] = (set(row.keys()), float(row["due_in"]), dict(stored), tenants)
    full, untenanted = written["full"], written["untenanted"]
    assert full[0] == untenanted[0]
    assert 1.9 < untenanted[1] <= 2.0 and 1.9 < full[1] <= 2.0
    assert full[2] == untenanted[2]
    assert (full[3], untenanted[3]) == (1, 0)
