"""Fair queues (issue 29, docs/fair-queues.md): on a standard queue whose
messages name tenants, a noisy tenant's backlog waits while quiet tenants'
messages are delivered first; nothing is dropped, and a noisy tenant still
drains when no quiet one has a message waiting.

Time passes the way the database sees it: a test that needs "five minutes
later" moves the stored timestamps back, and the fairness round is run by
hand (app/queue/fairness.py) rather than waited for, as is the flush of the
processing time a process summed (app/queue/tally.py)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families
from support import make_queue, queue_id_of, receive

from app.queue.fairness import adopt_strays, judge_tenants


async def _send_many(client: httpx.AsyncClient, queue: str, tenant: str | None, count: int,
                     prefix: str | None = None) -> None:
    for start in range(0, count, 100):
        entries: list[dict[str, Any]] = []
        for n in range(start, min(count, start + 100)):
            entry: dict[str, Any] = {"body": f"{prefix or tenant}-{n}"}
            if tenant is not None:
                entry["group"] = tenant
            entries.append(entry)
        response = await client.post(f"/v1/queues/{queue}/messages", json={"messages": entries})
        assert response.status_code == 200, response.text


async def _take(client: httpx.AsyncClient, queue: str, count: int) -> list[dict[str, Any]]:
    """Receives `count` messages (10 at a time), each leased for a minute."""
    taken: list[dict[str, Any]] = []
    while len(taken) < count:
        got = await receive(client, queue, max=min(10, count - len(taken)),
                            visibility_timeout=60)
        assert got, f"only {len(taken)} of {count} messages were claimable"
        taken.extend(got)
    return taken


async def _noisy(db: asyncpg.Connection, queue_id: int) -> set[str]:
    rows = await db.fetch(
        "SELECT tenant FROM leaseq.tenants WHERE queue_id = $1 AND noisy", queue_id)
    return {row["tenant"] for row in rows}


async def _judge(client: httpx.AsyncClient) -> None:
    """The fairness round, after the processing time summed so far is written,
    and its judgement read by this process, as its tally does once a second."""
    app: Any = client.app  # type: ignore[attr-defined]
    await app.state.service.queues.tally.flush(app.state.db)
    await judge_tenants(app.state.db)
    await app.state.service.queues.tally.learn_judged(app.state.db)


def _tenants(messages: list[dict[str, Any]]) -> list[str | None]:
    return [m.get("group") for m in messages]


async def test_a_queue_becomes_fair_with_its_first_message_naming_a_tenant(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client)
    await _send_many(client, queue, None, 3, prefix="before")
    queue_out = (await client.get(f"/v1/queues/{queue}")).json()
    assert queue_out["attributes"]["fair"] is False
    assert queue_out["attributes"]["fairness"] == {
        "in_flight_share": 0.1, "in_flight_min": 30, "processing_share": 0.1}
    await _send_many(client, queue, "acme", 1)
    assert (await client.get(f"/v1/queues/{queue}")).json()["attributes"]["fair"] is True
    # The messages that named no tenant are each their own (''), and still delivered.
    stored = await db.fetch(
        "SELECT body, tenant FROM leaseq.messages WHERE queue_id = $1 ORDER BY id",
        await queue_id_of(client, queue))
    assert [(r["body"], r["tenant"]) for r in stored] == [
        ("before-0", ""), ("before-1", ""), ("before-2", ""), ("acme-0", "acme")]
    got = await receive(client, queue, max=10)
    assert sorted(m["body"] for m in got) == ["acme-0", "before-0", "before-1", "before-2"]
    assert Counter(_tenants(got)) == {"acme": 1, None: 3}


async def test_a_queue_without_tenants_stays_as_it_was(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client)
    await _send_many(client, queue, None, 20)
    assert len(await _take(client, queue, 20)) == 20
    assert (await client.get(f"/v1/queues/{queue}")).json()["attributes"]["fair"] is False


async def test_quiet_tenants_are_served_before_a_noisy_tenants_backlog(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client)
    queue_id = await queue_id_of(client, queue)
    await _send_many(client, queue, "burst", 200)
    # The burst is oldest: with nobody noisy yet, it is served first.
    first = await _take(client, queue, 40)
    assert set(_tenants(first)) == {"burst"}
    # The claims count nothing: the round, within a second, finds 40 of the 40
    # in flight, at least 30, and the backlog waiting: noisy.
    assert await _noisy(db, queue_id) == set()
    await _judge(client)
    assert await _noisy(db, queue_id) == {"burst"}
    await _send_many(client, queue, "quiet-a", 3)
    await _send_many(client, queue, "quiet-b", 2)
    await _send_many(client, queue, None, 2, prefix="loner")
    # Newer than 160 of the burst's, and every one of them served first.
    after = await receive(client, queue, max=10, visibility_timeout=60)
    assert Counter(_tenants(after)) == {"quiet-a": 3, "quiet-b": 2, None: 2, "burst": 3}
    assert _tenants(after)[-3:] == ["burst"] * 3  # the rest of the batch, after them
    # Oldest first across the quiet ones.
    assert [m["body"] for m in after[:7]] == [
        "quiet-a-0", "quiet-a-1", "quiet-a-2", "quiet-b-0", "quiet-b-1", "loner-0", "loner-1"]
    # The round agrees while the burst has a backlog and most of the messages in flight.
    await _judge(client)
    assert await _noisy(db, queue_id) == {"burst"}


async def test_a_burst_is_told_noisy_by_the_claims_of_this_process_before_any_round(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    """The round judges once a second; meanwhile each process counts what it
    handed out in the current second (app/queue/tally.py), and its claims serve
    the quiet tenants first from the claim that passes the thresholds."""
    queue = await make_queue(client)
    queue_id = await queue_id_of(client, queue)
    await _send_many(client, queue, "burst", 200)
    assert set(_tenants(await _take(client, queue, 30))) == {"burst"}
    await _send_many(client, queue, "quiet-a", 3)
    after = await receive(client, queue, max=10, visibility_timeout=60)
    assert _tenants(after) == ["quiet-a"] * 3 + ["burst"] * 7
    assert await _noisy(db, queue_id) == set()  # no round has run


async def test_operators_see_the_noisy_tenants_and_the_quiet_tenants_messages(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client)
    await _send_many(client, queue, "burst", 100)
    await _take(client, queue, 40)
    await _judge(client)
    await _send_many(client, queue, "quiet-a", 3)
    await _send_many(client, queue, None, 1, prefix="loner")
    await receive(client, queue, max=1, visibility_timeout=60)  # quiet-a-0
    stats = (await client.get(f"/v1/queues/{queue}")).json()["stats"]
    tenants = stats["tenants"]
    assert (tenants["noisy_tenants"], tenants["quiet_visible"], tenants["quiet_in_flight"]) == (
        1, 3, 1)
    assert tenants["quiet_oldest_age_seconds"] > 0
    assert tenants["top"][:2] == [
        {"tenant": "burst", "visible": 60, "in_flight": 40, "noisy": True},
        {"tenant": "quiet-a", "visible": 2, "in_flight": 1, "noisy": False},
    ]
    exposition = (await client.get("/metrics")).text
    found = {
        (sample.name, sample.labels.get("queue")): sample.value
        for family in text_string_to_metric_families(exposition) for sample in family.samples
    }
    assert found[("leaseq_queue_noisy_tenants", queue)] == 1
    assert found[("leaseq_queue_quiet_visible_messages", queue)] == 3
    assert found[("leaseq_queue_quiet_in_flight_messages", queue)] == 1
    assert found[("leaseq_queue_quiet_oldest_visible_age_seconds", queue)] > 0
    # A queue that is not fair has no tenants to tell of.
    plain = await make_queue(client, "plain")
    assert (await client.get(f"/v1/queues/{plain}")).json()["stats"]["tenants"] is None
    assert ("leaseq_queue_noisy_tenants", plain) not in found


async def test_a_noisy_tenant_still_drains_and_is_quiet_once_its_backlog_is_gone(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client)
    queue_id = await queue_id_of(client, queue)
    await _send_many(client, queue, "burst", 60)
    taken = await _take(client, queue, 30)
    await _judge(client)  # 30 in flight and a backlog: noisy
    assert await _noisy(db, queue_id) == {"burst"}
    taken += await _take(client, queue, 30)  # nobody else waits
    assert len(taken) == 60 and set(_tenants(taken)) == {"burst"}
    # Every message delivered; acknowledged, the backlog is gone.
    response = await client.post(f"/v1/queues/{queue}/messages/delete", json={
        "receipt_handles": [m["receipt_handle"] for m in taken]})
    assert response.status_code == 200, response.text
    await _judge(client)
    assert await _noisy(db, queue_id) == set()
    # Counted again from the messages, and the processing time the deletes held
    # written by the flush.
    counts = await db.fetchrow(
        "SELECT in_flight, busy > 0 AS busy FROM leaseq.tenants "
        "WHERE queue_id = $1 AND tenant = 'burst'", queue_id)
    assert counts is not None and counts["in_flight"] == 0 and counts["busy"]


async def test_a_tenant_that_sent_nothing_for_five_minutes_is_quiet_again(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client)
    queue_id = await queue_id_of(client, queue)
    await _send_many(client, queue, "burst", 100)
    await _take(client, queue, 40)
    await _judge(client)
    assert await _noisy(db, queue_id) == {"burst"}
    # Six minutes on, by the database's clock: its last send was six minutes ago
    # (the leases it holds are left as they are).
    await db.execute(
        "UPDATE leaseq.messages SET sent_at = sent_at - interval '6 minutes', "
        "visible_at = CASE WHEN leased THEN visible_at "
        "ELSE visible_at - interval '6 minutes' END WHERE queue_id = $1", queue_id)
    await _judge(client)
    assert await _noisy(db, queue_id) == set()
    # A send makes it count as sending again; its in-flight share makes it noisy.
    await _send_many(client, queue, "burst", 1, prefix="again")
    await _judge(client)
    assert await _noisy(db, queue_id) == {"burst"}


async def test_a_tenant_is_noisy_by_its_share_of_processing_time(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client)
    queue_id = await queue_id_of(client, queue)
    for tenant in ("slow", *(f"t{n}" for n in range(10))):
        await _send_many(client, queue, tenant, 2)
    taken = await _take(client, queue, 22)
    # The slow tenant's messages were held 30 s each, the others' a moment.
    await db.execute(
        "UPDATE leaseq.messages SET claimed_at = claimed_at - interval '30 seconds' "
        "WHERE queue_id = $1 AND tenant = 'slow'", queue_id)
    response = await client.post(f"/v1/queues/{queue}/messages/delete", json={
        "receipt_handles": [m["receipt_handle"] for m in taken
                            if m["group"] != "slow" or m["body"] == "slow-0"]})
    assert response.status_code == 200, response.text
    # It has messages in flight but 1 of 21: by in-flight share it is quiet.
    await _judge(client)
    assert await _noisy(db, queue_id) == set()  # no backlog waiting: quiet whatever its share
    await _send_many(client, queue, "slow", 1, prefix="slow-more")
    await _send_many(client, queue, "t0", 1, prefix="t0-more")
    await _judge(client)
    assert await _noisy(db, queue_id) == {"slow"}
    # Its waiting message is served after the quiet tenant's.
    got = await receive(client, queue, max=2, visibility_timeout=60)
    assert [m["body"] for m in got] == ["t0-more-0", "slow-more-0"]


async def test_noisy_tenants_are_served_fewest_in_flight_first(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client)
    queue_id = await queue_id_of(client, queue)
    await _send_many(client, queue, "many", 60)
    await _take(client, queue, 50)  # all of them "many"'s: the oldest
    await _judge(client)
    await _send_many(client, queue, "some", 50)
    # "many" is noisy: "some" (quiet) is served first, noisy too from 30 in flight.
    taken = await _take(client, queue, 35)
    assert set(_tenants(taken)) == {"some"}
    await _judge(client)
    assert await _noisy(db, queue_id) == {"many", "some"}
    # Both noisy, nobody quiet waiting: "some" has fewer in flight (35, then 45,
    # against 50), though "many"'s waiting messages are older.
    got = await receive(client, queue, max=10, visibility_timeout=60)
    assert _tenants(got) == ["some"] * 10
    got = await receive(client, queue, max=5, visibility_timeout=60)
    assert _tenants(got) == ["some"] * 5
    # And "many" drains.
    got = await receive(client, queue, max=10, visibility_timeout=60)
    assert _tenants(got) == ["many"] * 10


async def test_sixteen_receivers_never_get_one_message_twice_within_its_lease(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client)
    await _send_many(client, queue, "burst", 600)
    for n in range(20):
        await _send_many(client, queue, f"quiet-{n}", 5)
    seen: Counter[str] = Counter()

    async def receiver() -> None:
        while True:
            got = await receive(client, queue, max=10, visibility_timeout=120)
            if not got:
                return
            seen.update(m["message_id"] for m in got)

    await asyncio.gather(*(receiver() for _ in range(16)))
    assert len(seen) == 700
    assert max(seen.values()) == 1


async def test_the_sql_api_makes_a_queue_fair_and_names_the_tenant_of_the_rest(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client)
    queue_id = await queue_id_of(client, queue)
    await db.execute("SELECT leaseq.send($1, 'plain')", queue)
    await db.execute("SELECT leaseq.send($1, 'named', \"group\" => 'acme')", queue)
    await db.execute(
        "SELECT leaseq.send_batch($1, ARRAY['b1', 'b2'], groups => ARRAY['zeta', NULL])", queue)
    await db.execute("SELECT leaseq.send($1, 'plain again')", queue)
    rows = await db.fetch(
        "SELECT body, tenant FROM leaseq.messages WHERE queue_id = $1 ORDER BY id", queue_id)
    assert [(r["body"], r["tenant"]) for r in rows] == [
        ("plain", ""), ("named", "acme"), ("b1", "zeta"), ("b2", ""), ("plain again", "")]
    assert await db.fetchval("SELECT fair FROM leaseq.queues WHERE id = $1", queue_id)
    got = await receive(client, queue, max=10)
    assert sorted(m["body"] for m in got) == ["b1", "b2", "named", "plain", "plain again"]


async def test_a_message_a_fair_queue_got_without_a_tenant_is_adopted(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client)
    queue_id = await queue_id_of(client, queue)
    await _send_many(client, queue, "acme", 1)
    # As a process that had not yet heard the queue became fair would store it.
    await db.execute(
        "INSERT INTO leaseq.messages (queue_id, body, visible_at) "
        "VALUES ($1, 'stray', statement_timestamp())", queue_id)
    got = await receive(client, queue, max=10)
    assert [m["body"] for m in got] == ["acme-0"]  # the fair claim does not reach it
    app: Any = client.app  # type: ignore[attr-defined]
    assert await adopt_strays(app.state.db) == 1
    got = await receive(client, queue, max=10)
    assert [m["body"] for m in got] == ["stray"]


async def test_the_thresholds_are_queue_attributes(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/queues", json={
        "name": "tuned", "fairness": {"in_flight_min": 5, "in_flight_share": 0.5}})
    assert response.status_code == 201, response.text
    assert response.json()["attributes"]["fairness"] == {
        "in_flight_share": 0.5, "in_flight_min": 5, "processing_share": 0.1}
    response = await client.patch("/v1/queues/tuned", json={
        "fairness": {"processing_share": 0.25}})
    assert response.status_code == 200, response.text
    assert response.json()["attributes"]["fairness"] == {
        "in_flight_share": 0.1, "in_flight_min": 30, "processing_share": 0.25}
    for bad in ({"in_flight_share": 0}, {"in_flight_min": 0}, {"processing_share": 1.5}):
        response = await client.patch("/v1/queues/tuned", json={"fairness": bad})
        assert response.status_code == 422, response.text
        assert response.json()["code"] == "validation_error"
    response = await client.post("/v1/queues", json={
        "name": "ordered.fifo", "fifo": True, "fairness": {"in_flight_min": 5}})
    assert response.status_code == 422, response.text
    assert "fairness is for standard queues" in response.json()["detail"]


async def test_a_queue_may_be_made_fair_before_its_first_tenant_and_stays_fair(
    client: httpx.AsyncClient, db: asyncpg.Connection,
) -> None:
    queue = await make_queue(client)
    await _send_many(client, queue, None, 2, prefix="early")
    response = await client.patch(f"/v1/queues/{queue}", json={"fair": True})
    assert response.status_code == 200, response.text
    assert response.json()["attributes"]["fair"] is True
    tenants = await db.fetch(
        "SELECT tenant FROM leaseq.messages WHERE queue_id = $1", await queue_id_of(client, queue))
    assert [row["tenant"] for row in tenants] == ["", ""]
    response = await client.patch(f"/v1/queues/{queue}", json={"fair": False})
    assert response.status_code == 422, response.text
    assert "stays fair" in response.json()["detail"]
    created = await client.post("/v1/queues", json={"name": "born-fair", "fair": True})
    assert created.status_code == 201 and created.json()["attributes"]["fair"] is True
    refused = await client.post("/v1/queues", json={"name": "f.fifo", "fifo": True, "fair": True})
    assert refused.status_code == 422, refused.text
    # Given back as it reads, an attribute set is no change.
    again = await client.post("/v1/queues", json={
        "name": "born-fair", **created.json()["attributes"]})
    assert again.status_code == 200, again.text
