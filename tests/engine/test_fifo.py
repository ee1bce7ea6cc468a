"""FIFO queues through the REST API: groups in order, one batch of a group in
flight at a time, deduplication, sequence numbers, and what a FIFO queue refuses."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
from support import eventually, make_queue, parked, receive

from app.queue.retention import DeduplicationSweep


async def fifo_queue(client: httpx.AsyncClient, name: str = "orders.fifo", **attrs: Any) -> str:
    return await make_queue(client, name, fifo=True, **attrs)


async def send_fifo(
    client: httpx.AsyncClient, queue: str, body: str, group: str, dedup: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    payload: dict[str, Any] = {"body": body, "group": group, **extra}
    payload["deduplication_id"] = dedup if dedup is not None else body
    response = await client.post(f"/v1/queues/{queue}/messages", json=payload)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


async def ack(client: httpx.AsyncClient, queue: str, *messages: dict[str, Any]) -> None:
    for message in messages:
        response = await client.delete(
            f"/v1/queues/{queue}/messages/{message['receipt_handle']}"
        )
        assert response.status_code == 204, response.text


async def test_a_group_is_delivered_in_send_order_one_batch_at_a_time(
    client: httpx.AsyncClient,
) -> None:
    queue = await fifo_queue(client)
    for n in range(5):
        await send_fifo(client, queue, f"a{n}", "A")
    first = await receive(client, queue, max=2)
    assert [m["body"] for m in first] == ["a0", "a1"]
    assert all(m["group"] == "A" for m in first)
    # While any of the group is in flight, nothing later of it is delivered.
    assert await receive(client, queue, max=10) == []
    await ack(client, queue, first[0])
    assert await receive(client, queue, max=10) == []
    await ack(client, queue, first[1])
    rest = await receive(client, queue, max=10)
    assert [m["body"] for m in rest] == ["a2", "a3", "a4"]


async def test_groups_are_independent_and_a_receive_fills_from_several(
    client: httpx.AsyncClient,
) -> None:
    queue = await fifo_queue(client)
    for n in range(3):
        await send_fifo(client, queue, f"a{n}", "A")
        await send_fifo(client, queue, f"b{n}", "B")
    one = await receive(client, queue, max=2)
    assert [m["body"] for m in one] == ["a0", "a1"]
    # Group A is in flight; B is free.
    other = await receive(client, queue, max=10)
    assert [m["body"] for m in other] == ["b0", "b1", "b2"]
    await ack(client, queue, *one)
    (last,) = await receive(client, queue, max=10)
    assert last["body"] == "a2"


async def test_one_receive_takes_whole_groups_in_order(client: httpx.AsyncClient) -> None:
    queue = await fifo_queue(client)
    for group in "ABC":
        for n in range(2):
            await send_fifo(client, queue, f"{group}{n}", group)
    got = await receive(client, queue, max=10)
    assert [m["body"] for m in got] == ["A0", "A1", "B0", "B1", "C0", "C1"]


async def test_a_released_message_comes_back_first_in_its_group(
    client: httpx.AsyncClient,
) -> None:
    queue = await fifo_queue(client)
    for n in range(3):
        await send_fifo(client, queue, f"m{n}", "G")
    (m0, m1) = await receive(client, queue, max=2)
    await ack(client, queue, m0)
    released = await client.patch(
        f"/v1/queues/{queue}/messages/{m1['receipt_handle']}/visibility", json={"timeout": 0}
    )
    assert released.status_code == 200, released.text
    again = await receive(client, queue, max=10)
    assert [m["body"] for m in again] == ["m1", "m2"]
    assert again[0]["receive_count"] == 2


async def test_an_expired_lease_comes_back_first_and_revokes_the_old_holder(
    client: httpx.AsyncClient,
) -> None:
    queue = await fifo_queue(client, visibility_timeout=1)
    for n in range(3):
        await send_fifo(client, queue, f"m{n}", "G")
    old = await receive(client, queue, max=3)
    assert [m["body"] for m in old] == ["m0", "m1", "m2"]
    # After the lease ends, a receive of one takes the group's head again...
    (head,) = await receive(client, queue, max=1, wait=5)
    assert head["body"] == "m0"
    # ...and the old holder of the messages it left behind cannot revive them.
    revived = await client.patch(
        f"/v1/queues/{queue}/messages/{old[2]['receipt_handle']}/visibility",
        json={"timeout": 60},
    )
    assert revived.status_code == 409, revived.text
    assert await receive(client, queue, max=10) == []
    await ack(client, queue, head)
    assert [m["body"] for m in await receive(client, queue, max=10)] == ["m1", "m2"]


async def test_deduplication_answers_the_first_message_and_stores_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await fifo_queue(client)
    first = await send_fifo(client, queue, "x", "G", dedup="d-1")
    again = await send_fifo(client, queue, "x changed", "G", dedup="d-1")
    other = await send_fifo(client, queue, "y", "G", dedup="d-2")
    assert again["message_id"] == first["message_id"]
    assert again["sequence_number"] == first["sequence_number"]
    assert int(other["sequence_number"]) > int(first["sequence_number"])
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 2
    bodies = [m["body"] for m in await receive(client, queue, max=10)]
    assert bodies == ["x", "y"]


async def test_a_batch_with_one_deduplication_id_twice_stores_it_once(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await fifo_queue(client)
    response = await client.post(f"/v1/queues/{queue}/messages", json={"messages": [
        {"body": "a", "group": "G", "deduplication_id": "same"},
        {"body": "b", "group": "G", "deduplication_id": "same"},
        {"body": "c", "group": "G", "deduplication_id": "other"},
    ]})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert results[0]["message_id"] == results[1]["message_id"] != results[2]["message_id"]
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 2


async def test_content_based_deduplication_uses_the_body(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await fifo_queue(client, content_based_deduplication=True)
    payload = {"body": "same body", "group": "G"}
    one = await client.post(f"/v1/queues/{queue}/messages", json=payload)
    two = await client.post(f"/v1/queues/{queue}/messages", json=payload)
    assert one.status_code == two.status_code == 201, two.text
    assert one.json()["message_id"] == two.json()["message_id"]
    (message,) = await receive(client, queue)
    import hashlib
    assert message["deduplication_id"] == hashlib.sha256(b"same body").hexdigest()


async def test_deduplication_scope_message_group(client: httpx.AsyncClient) -> None:
    queue = await fifo_queue(client, deduplication_scope="message_group")
    a = await send_fifo(client, queue, "a", "A", dedup="d")
    b = await send_fifo(client, queue, "b", "B", dedup="d")
    assert a["message_id"] != b["message_id"]


async def test_an_expired_deduplication_id_is_accepted_again(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await fifo_queue(client)
    first = await send_fifo(client, queue, "x", "G", dedup="d")
    await db.execute("UPDATE leaseq.message_deduplication SET expires_at = now() - interval '1 s'")
    second = await send_fifo(client, queue, "x", "G", dedup="d")
    assert second["message_id"] != first["message_id"]
    assert await db.fetchval("SELECT count(*) FROM leaseq.messages") == 2


async def test_what_a_fifo_send_refuses(client: httpx.AsyncClient) -> None:
    queue = await fifo_queue(client)
    url = f"/v1/queues/{queue}/messages"
    no_group = await client.post(url, json={"body": "x", "deduplication_id": "d"})
    assert no_group.status_code == 422, no_group.text
    assert no_group.json()["code"] == "validation_error"
    assert "group" in no_group.json()["detail"]
    no_dedup = await client.post(url, json={"body": "x", "group": "G"})
    assert no_dedup.status_code == 422, no_dedup.text
    assert "deduplication_id" in no_dedup.json()["detail"]
    delayed = await client.post(
        url, json={"body": "x", "group": "G", "deduplication_id": "d", "delay": 5}
    )
    assert delayed.status_code == 422, delayed.text
    assert "delay" in delayed.json()["detail"]
    bad_group = await client.post(
        url, json={"body": "x", "group": "no spaces", "deduplication_id": "d"}
    )
    assert bad_group.status_code == 422, bad_group.text


async def test_a_standard_queue_refuses_fifo_fields(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "plain")
    # A group names the message's tenant there (fair queues); a deduplication id
    # is FIFO's alone.
    sent = await client.post(
        f"/v1/queues/{queue}/messages", json={"body": "x", "deduplication_id": "d"}
    )
    assert sent.status_code == 422, sent.text
    patched = await client.patch(
        f"/v1/queues/{queue}", json={"deduplication_scope": "message_group"}
    )
    assert patched.status_code == 422, patched.text
    assert "FIFO" in patched.json()["detail"]
    # Its own values given back as they read are no change.
    same = await client.patch(f"/v1/queues/{queue}", json={"deduplication_scope": "queue"})
    assert same.status_code == 200, same.text


async def test_per_message_group_throughput_needs_the_message_group_scope(
    client: httpx.AsyncClient,
) -> None:
    def refused_by_the_rule(response: httpx.Response) -> None:
        assert response.status_code == 422, response.text
        assert response.json()["code"] == "validation_error"
        assert "per_message_group_id" in response.json()["detail"]
        assert "message_group" in response.json()["detail"]

    for scope in ({}, {"deduplication_scope": "queue"}):
        refused_by_the_rule(await client.post("/v1/queues", json={
            "name": "fast.fifo", "fifo": True, "fifo_throughput_limit": "per_message_group_id",
            **scope,
        }))
    assert (await client.get("/v1/queues/fast.fifo")).status_code == 404
    # A PATCH is judged with the queue's other values.
    queue = await fifo_queue(client)
    url = f"/v1/queues/{queue}"
    refused_by_the_rule(
        await client.patch(url, json={"fifo_throughput_limit": "per_message_group_id"})
    )
    for change in ({"deduplication_scope": "message_group"},
                   {"fifo_throughput_limit": "per_message_group_id"}):
        patched = await client.patch(url, json=change)
        assert patched.status_code == 200, patched.text
    refused_by_the_rule(await client.patch(url, json={"deduplication_scope": "queue"}))
    other = await client.patch(url, json={"visibility_timeout": 60})
    assert other.status_code == 200, other.text
    attributes = other.json()["attributes"]
    assert (attributes["deduplication_scope"], attributes["fifo_throughput_limit"]) == (
        "message_group", "per_message_group_id")


async def test_fifo_is_fixed_and_named_by_its_suffix(client: httpx.AsyncClient) -> None:
    no_suffix = await client.post("/v1/queues", json={"name": "orders", "fifo": True})
    assert no_suffix.status_code == 422, no_suffix.text
    suffix_only = await client.post("/v1/queues", json={"name": "orders.fifo"})
    assert suffix_only.status_code == 422, suffix_only.text
    queue = await fifo_queue(client)
    changed = await client.patch(f"/v1/queues/{queue}", json={"fifo": False})
    assert changed.status_code == 422, changed.text
    detail = (await client.get(f"/v1/queues/{queue}")).json()
    assert detail["attributes"]["fifo"] is True
    assert detail["attributes"]["deduplication_scope"] == "queue"


async def test_dead_letter_queues_keep_their_type(client: httpx.AsyncClient) -> None:
    await make_queue(client, "plain-dlq")
    await fifo_queue(client, "fifo-dlq.fifo")
    wrong = await client.post("/v1/queues", json={
        "name": "a.fifo", "fifo": True, "dead_letter_queue": "plain-dlq", "max_receive_count": 2,
    })
    assert wrong.status_code == 400, wrong.text
    assert wrong.json()["code"] == "invalid_redrive_policy"
    wrong = await client.post("/v1/queues", json={
        "name": "b", "dead_letter_queue": "fifo-dlq.fifo", "max_receive_count": 2,
    })
    assert wrong.status_code == 400, wrong.text
    right = await client.post("/v1/queues", json={
        "name": "c.fifo", "fifo": True, "dead_letter_queue": "fifo-dlq.fifo",
        "max_receive_count": 2,
    })
    assert right.status_code == 201, right.text


async def test_dead_lettering_keeps_the_group_moving(client: httpx.AsyncClient) -> None:
    await fifo_queue(client, "dlq.fifo")
    queue = await fifo_queue(
        client, "src.fifo", dead_letter_queue="dlq.fifo", max_receive_count=1
    )
    for n in range(3):
        await send_fifo(client, queue, f"m{n}", "G")
    (m0,) = await receive(client, queue, max=1)
    released = await client.post(f"/v1/queues/{queue}/messages/{m0['receipt_handle']}/release")
    assert released.status_code == 200, released.text
    # m0 has had its one receive: the next claim moves it and goes on with m1.
    got = await receive(client, queue, max=10)
    assert [m["body"] for m in got] == ["m1", "m2"]
    (dead,) = await receive(client, "dlq.fifo", max=10)
    assert dead["body"] == "m0" and dead["group"] == "G"


async def test_an_emptied_group_leaves_no_turn_due(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await fifo_queue(client)
    await send_fifo(client, queue, "x", "G")
    got = await receive(client, queue)
    await ack(client, queue, *got)
    # The acknowledgement's turn is read by the claim that finds the group
    # empty, which gives it none; the turn at the lease's end stays to come.
    assert await receive(client, queue) == []
    assert await db.fetchval("SELECT count(*) FROM leaseq.turns WHERE at <= now()") == 0
    await send_fifo(client, queue, "y", "G")
    assert [m["body"] for m in await receive(client, queue)] == ["y"]


async def test_purge_leaves_no_group_stuck(client: httpx.AsyncClient) -> None:
    queue = await fifo_queue(client)
    await send_fifo(client, queue, "x", "G")
    await receive(client, queue)
    purged = await client.post(f"/v1/queues/{queue}/purge")
    assert purged.status_code == 200, purged.text
    await send_fifo(client, queue, "y", "G")
    assert [m["body"] for m in await receive(client, queue)] == ["y"]


async def test_a_long_poll_wakes_when_an_acknowledgement_frees_the_group(
    client: httpx.AsyncClient,
) -> None:
    import asyncio

    queue = await fifo_queue(client, visibility_timeout=600)
    await send_fifo(client, queue, "m0", "G")
    await send_fifo(client, queue, "m1", "G")
    (m0,) = await receive(client, queue, max=1)
    waiting = asyncio.create_task(receive(client, queue, max=1, wait=20))
    await parked(client, queue)  # it found the group in flight
    await ack(client, queue, m0)
    async with asyncio.timeout(10):
        (m1,) = await waiting
    assert m1["body"] == "m1"


async def test_a_receive_attempt_retried_answers_the_same_messages(
    app_factory: Any,
) -> None:
    # The attempt id is an engine parameter (the SQS door's ReceiveRequestAttemptId).
    client = await app_factory()
    queue = await fifo_queue(client)
    for n in range(3):
        await send_fifo(client, queue, f"m{n}", "G")
    await send_fifo(client, queue, "other", "H")
    service = client.app.state.service  # type: ignore[attr-defined]
    first = await service.receive(queue, max_messages=3, attempt_id="try-1")
    again = await service.receive(queue, max_messages=3, attempt_id="try-1")
    assert [m.body for m in first] == ["m0", "m1", "m2"]
    assert [m.receipt_handle for m in again] == [m.receipt_handle for m in first]
    # Once one of them is acknowledged, a retry answers those still held.
    await ack(client, queue, {"receipt_handle": first[0].receipt_handle})
    held = await service.receive(queue, max_messages=3, attempt_id="try-1")
    assert [m.body for m in held] == ["m1", "m2"]
    # Another attempt id is another receive.
    (other,) = await service.receive(queue, max_messages=3, attempt_id="try-2")
    assert other.body == "other"


async def test_a_fifo_dead_letter_queue_redrives_to_the_end_of_each_group(
    client: httpx.AsyncClient,
) -> None:
    await fifo_queue(client, "dlq.fifo")
    queue = await fifo_queue(
        client, "src.fifo", dead_letter_queue="dlq.fifo", max_receive_count=1
    )
    first = await send_fifo(client, queue, "m0", "G")
    (m0,) = await receive(client, queue)
    await client.post(f"/v1/queues/{queue}/messages/{m0['receipt_handle']}/release")
    later = await send_fifo(client, queue, "m1", "G")
    (m1,) = await receive(client, queue)  # m0 went to the dead-letter queue
    assert m1["body"] == "m1"
    await ack(client, queue, m1)
    started = await client.post("/v1/queues/dlq.fifo/redrive", json={})
    assert started.status_code == 202, started.text
    task = started.json()["task_id"]

    async def completed() -> bool:
        answer = await client.get(f"/v1/redrive-tasks/{task}")
        return bool(answer.json()["status"] == "completed")

    await eventually(completed)
    (back,) = await receive(client, queue)
    assert back["body"] == "m0" and back["group"] == "G" and back["receive_count"] == 1
    assert int(back["sequence_number"]) > int(later["sequence_number"]) > int(
        first["sequence_number"]
    )


async def test_a_standard_dead_letter_queue_cannot_be_redriven_into_a_fifo_queue(
    client: httpx.AsyncClient,
) -> None:
    await make_queue(client, "plain-dlq")
    await fifo_queue(client)
    refused = await client.post(
        "/v1/queues/plain-dlq/redrive", json={"destination": "orders.fifo"}
    )
    assert refused.status_code == 422, refused.text


async def test_a_rest_receive_retried_with_its_attempt_id_answers_the_same_messages(
    client: httpx.AsyncClient,
) -> None:
    queue = await fifo_queue(client)
    for n in range(3):
        await send_fifo(client, queue, f"m{n}", "G")
    await send_fifo(client, queue, "other", "H")
    url = f"/v1/queues/{queue}/receive"
    first = await receive(client, queue, max=3, attempt_id="try-1")
    assert [m["body"] for m in first] == ["m0", "m1", "m2"]
    # Retried, on GET or on POST: the same messages, the same receipt handles.
    again = await receive(client, queue, max=3, attempt_id="try-1")
    posted = await client.post(url, json={"max": 3, "attempt_id": "try-1"})
    assert posted.status_code == 200, posted.text
    for retried in (again, posted.json()["messages"]):
        assert [m["receipt_handle"] for m in retried] == [m["receipt_handle"] for m in first]
    # Another attempt id is another receive: group G is in flight, so H's message.
    (other,) = await receive(client, queue, max=3, attempt_id="try-2")
    assert other["body"] == "other"
    assert await receive(client, queue, max=3, attempt_id="try-3") == []
    # A POST settles first: acknowledged, m0 is no longer answered by the retry.
    settled = await client.post(url, json={
        "max": 3, "attempt_id": "try-1", "delete": [first[0]["receipt_handle"]],
    })
    assert settled.status_code == 200, settled.text
    assert settled.json()["deleted"] == [{"ok": True}]
    assert [m["body"] for m in settled.json()["messages"]] == ["m1", "m2"]
    # Checked as SQS checks ReceiveRequestAttemptId; before anything is settled.
    for bad in ("", "x" * 129, "no spaces", "é"):
        refused = await client.get(url, params={"attempt_id": bad})
        assert refused.status_code == 422, refused.text
        assert refused.json()["code"] == "validation_error"
        assert "attempt_id" in refused.json()["detail"]
    refused = await client.post(url, json={
        "attempt_id": "no spaces", "delete": [first[1]["receipt_handle"]],
    })
    assert refused.status_code == 422, refused.text
    assert [m["body"] for m in await receive(client, queue, max=3, attempt_id="try-1")] == [
        "m1", "m2"]
    assert await receive(client, queue, attempt_id="!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") == []


async def test_a_standard_queue_ignores_the_attempt_id(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "plain")
    for n in range(2):
        sent = await client.post(f"/v1/queues/{queue}/messages", json={"body": f"m{n}"})
        assert sent.status_code == 201, sent.text
    (first,) = await receive(client, queue, attempt_id="same")
    (second,) = await receive(client, queue, attempt_id="same")
    assert first["message_id"] != second["message_id"]
    # Not checked either, as SQS.
    posted = await client.post(f"/v1/queues/{queue}/receive", json={"attempt_id": "no spaces"})
    assert posted.status_code == 200, posted.text


async def test_expired_deduplication_ids_and_attempts_are_swept(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    queue = await fifo_queue(client)
    for n in range(5):
        await send_fifo(client, queue, f"m{n}", "G")
    service = client.app.state.service  # type: ignore[attr-defined]
    assert await service.receive(queue, max_messages=2, attempt_id="a")
    await db.execute(
        "UPDATE leaseq.message_deduplication SET expires_at = now() - interval '1 s' "
        "WHERE deduplication_id IN ('m0', 'm1')"
    )
    await db.execute("UPDATE leaseq.receive_attempts SET expires_at = now() - interval '1 s'")
    sweep = DeduplicationSweep(client.app.state.db)  # type: ignore[attr-defined]
    assert await sweep.once(batch=1) == 2
    left = await db.fetch("SELECT deduplication_id FROM leaseq.message_deduplication ORDER BY 1")
    assert [r[0] for r in left] == ["m2", "m3", "m4"]
    assert await db.fetchval("SELECT count(*) FROM leaseq.receive_attempts") == 0


async def test_a_fifo_queues_delay_applies_to_the_messages_already_waiting(
    client: httpx.AsyncClient,
) -> None:
    queue = await fifo_queue(client, delay=600)
    await send_fifo(client, queue, "m0", "G")
    assert await receive(client, queue) == []
    stats = (await client.get(f"/v1/queues/{queue}")).json()["stats"]
    assert (stats["visible"], stats["delayed"]) == (0, 1)
    # As SQS has it for FIFO queues: a change of the delay is retroactive.
    patched = await client.patch(f"/v1/queues/{queue}", json={"delay": 0})
    assert patched.status_code == 200, patched.text
    (message,) = await receive(client, queue)
    assert message["body"] == "m0"


async def test_a_fifo_claim_given_back_frees_its_group_uncounted(
    client: httpx.AsyncClient,
) -> None:
    from app.queue import grouped, grouped_fifo

    queue = await fifo_queue(client)
    await send_fifo(client, queue, "m0", "G")
    await send_fifo(client, queue, "m1", "G")
    service = client.app.state.service  # type: ignore[attr-defined]
    found = service.queues.cached(queue) or await service.queues.find(queue)
    db = client.app.state.db  # type: ignore[attr-defined]
    statement, params = grouped_fifo.CLAIM_FIFO.query, grouped_fifo.fifo_claim_params(
        found, 30, [grouped.Take(2)]
    )
    rows = [r for r in await db.fetch(statement, params) if r["id"] is not None]
    assert len(rows) == 2
    assert await receive(client, queue) == []  # the group is taken
    undo = grouped.give_back(found, grouped.claims_of(found.id, rows))
    assert undo is not None
    await db.fetch(*undo)
    again = await receive(client, queue, max=10)
    assert [(m["body"], m["receive_count"]) for m in again] == [("m0", 1), ("m1", 1)]
