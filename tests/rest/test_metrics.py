"""/metrics as Prometheus reads it: every queue's depth by state (matching the
API's own counts), dead-letter depth per source, request counts and latencies by
route template and SQS action, bounded labels."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqs_clients import client as sqs_client
from sqs_clients import run
from support import make_queue, receive, send


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition: (name, sorted labels) -> value."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    return samples(response.text)


def per_queue(found: dict[Any, float], name: str, queue: str) -> float:
    return found[(name, (("queue", queue),))]


async def test_queue_gauges_match_the_queue_counts(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "depth")
    for _ in range(3):
        await send(client, queue)
    await send(client, queue, delay=600)
    (held,) = await receive(client, queue, visibility_timeout=60)
    await make_queue(client, "empty")
    found = await scrape(client)
    stats = (await client.get(f"/v1/queues/{queue}")).json()["stats"]
    assert per_queue(found, "leaseq_queue_visible_messages", queue) == stats["visible"] == 2
    assert per_queue(found, "leaseq_queue_in_flight_messages", queue) == stats["in_flight"] == 1
    assert per_queue(found, "leaseq_queue_delayed_messages", queue) == stats["delayed"] == 1
    assert per_queue(found, "leaseq_queue_oldest_visible_age_seconds", queue) > 0
    assert per_queue(found, "leaseq_queue_visible_messages", "empty") == 0
    assert per_queue(found, "leaseq_queue_oldest_visible_age_seconds", "empty") == 0
    assert held["receive_count"] == 1


async def test_dead_letter_depth_is_told_per_source(client: httpx.AsyncClient) -> None:
    dlq = await make_queue(client, "dlq", message_retention=1_209_600)
    for source in ("a", "b"):
        await make_queue(client, source, dead_letter_queue=dlq, max_receive_count=1)
    for source, failing in (("a", 2), ("b", 1)):
        for _ in range(failing):
            await send(client, source)
        assert len(await receive(client, source, max=10, visibility_timeout=0)) == failing
        assert await receive(client, source, max=10) == []  # this claim moves them
    found = await scrape(client)
    dead = {labels: value for (name, labels), value in found.items()
            if name == "leaseq_queue_dead_letter_messages"}
    assert dead == {
        (("dead_letter_queue", "dlq"), ("queue", "a")): 2,
        (("dead_letter_queue", "dlq"), ("queue", "b")): 1,
    }
    assert per_queue(found, "leaseq_queue_visible_messages", "dlq") == 3


async def test_requests_are_counted_by_route_template_and_bounded_labels(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client, "routes")
    await send(client, queue)
    assert (await client.request("BREW", "/v1/queues")).status_code == 405
    assert (await client.get("/no/such/path/chosen-by-a-client")).status_code == 404
    found = await scrape(client)
    route = "/v1/queues/{queue}/messages"
    assert found[("leaseq_http_requests_total",
                  (("method", "POST"), ("route", route), ("status", "201")))] == 1
    assert found[("leaseq_http_request_duration_seconds_count",
                  (("method", "POST"), ("route", route)))] == 1
    labels = {dict(k[1]).get("route") for k in found} | {dict(k[1]).get("method") for k in found}
    assert "BREW" not in labels and "OTHER" in labels
    assert not any("chosen-by-a-client" in str(key) for key in found)
    assert ("process_resident_memory_bytes", ()) in found


async def test_sqs_actions_are_timed_by_name(served: tuple[str, Any]) -> None:
    base, _ = served
    sqs = sqs_client(base, "json")
    url = (await run(sqs.create_queue, QueueName="timed"))["QueueUrl"]
    await run(sqs.send_message, QueueUrl=url, MessageBody="x")
    await run(sqs.send_message, QueueUrl=url, MessageBody="y")
    async with httpx.AsyncClient(base_url=base) as http:
        found = await scrape(http)
    timed = {dict(labels)["action"]: value for (name, labels), value in found.items()
             if name == "leaseq_sqs_request_duration_seconds_count"}
    assert timed == {"CreateQueue": 1, "SendMessage": 2}
    # Not under the door's one route as well.
    assert not any(name == "leaseq_http_request_duration_seconds_count"
                   and dict(labels).get("route") == "/" for (name, labels) in found)


async def test_the_message_cycle_is_counted_per_queue(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "cycle")
    for body in ("a", "b", "c"):
        await send(client, queue, body)
    first, second = await receive(client, queue, max=2, visibility_timeout=60)
    assert (await client.delete(f"/v1/queues/{queue}/messages/{first['receipt_handle']}")
            ).status_code == 204
    # The same acknowledgement again: the claim is gone.
    assert (await client.delete(f"/v1/queues/{queue}/messages/{first['receipt_handle']}")
            ).status_code == 409
    released = await client.post(f"/v1/queues/{queue}/messages/{second['receipt_handle']}"
                                 "/release", json={"delay": 0})
    assert released.status_code == 200, released.text
    short = await receive(client, queue, max=2, visibility_timeout=1)
    assert sorted(m["body"] for m in short) == ["b", "c"]
    # Their leases run out: the long poll wakes when they do and takes them again.
    again = await receive(client, queue, max=2, wait=10, visibility_timeout=60)
    assert sorted(m["body"] for m in again) == ["b", "c"]
    found = await scrape(client)

    def count(name: str) -> float:
        return found.get((name, (("queue", queue),)), 0)

    assert count("leaseq_messages_sent_total") == 3
    assert count("leaseq_messages_deleted_total") == 1
    assert count("leaseq_lease_lost_total") == 1
    assert count("leaseq_messages_released_total") == 1
    assert count("leaseq_messages_received_total") == 6
    # Three first deliveries timed from their sends (a redelivery is none).
    assert count("leaseq_send_to_first_receive_seconds_count") == 3
    # The two taken after their leases ran out; not the released one's
    # earlier redelivery, which its holder gave back.
    assert count("leaseq_redelivered_after_expiry_total") == 2


async def test_empty_receives_and_dead_letters_are_counted(client: httpx.AsyncClient) -> None:
    dlq = await make_queue(client, "dl")
    queue = await make_queue(client, "src", dead_letter_queue=dlq, max_receive_count=1)
    assert await receive(client, queue) == []
    await send(client, queue)
    assert len(await receive(client, queue, visibility_timeout=0)) == 1
    assert await receive(client, queue) == []  # this claim dead-letters it
    found = await scrape(client)
    assert found[("leaseq_empty_receives_total", (("queue", queue),))] == 2
    assert found[("leaseq_dead_lettered_total", (("queue", queue),))] == 1


async def test_handlers_outliving_their_lease_draw_the_lease_advice(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    queue = await make_queue(client, "slow", visibility_timeout=1)
    for start in range(0, 120, 10):
        sent = await client.post(f"/v1/queues/{queue}/messages", json={
            "messages": [{"body": str(n)} for n in range(start, start + 10)]})
        assert sent.status_code == 200 and sent.json()["failed"] == 0
    held = []
    while batch := await receive(client, queue, max=10):
        held.extend(m["receipt_handle"] for m in batch)
    assert len(held) == 120
    # The handlers take longer than the 1 s lease (nobody else claims meanwhile,
    # so their acknowledgements still land).
    await asyncio.sleep(1.3)
    for start in range(0, 120, 10):
        done = await client.post(f"/v1/queues/{queue}/messages/delete",
                                 json={"receipt_handles": held[start:start + 10]})
        assert done.json()["failed"] == 0
    caplog.set_level(logging.WARNING, logger="leaseq.leases")
    found = await scrape(client)
    advice = (await client.get(f"/v1/queues/{queue}")).json()["lease_advice"]
    assert advice["samples"] == 120 and advice["lease_seconds"] == 1
    assert 1.3 <= advice["held_p999_seconds"] < 10
    assert advice["visibility_timeout"] >= advice["held_p999_seconds"] + 5
    assert advice["warnings"] == ["lease_below_p999"]
    assert found[("leaseq_lease_warning", (("queue", queue), ("reason", "lease_below_p999")))] == 1
    assert found[("leaseq_lease_held_seconds_count", (("queue", queue),))] == 120
    assert found[("leaseq_lease_held_p999_seconds", (("queue", queue),))] == pytest.approx(
        advice["held_p999_seconds"])
    (line,) = [r for r in caplog.records if r.name == "leaseq.leases"]
    assert "lease_below_p999" in line.getMessage() and queue in line.getMessage()
    # A queue whose handlers fit their lease: advice without a warning.
    quick = await make_queue(client, "quick")
    await send(client, quick)
    (message,) = await receive(client, quick)
    await client.delete(f"/v1/queues/{quick}/messages/{message['receipt_handle']}")
    advice = (await client.get(f"/v1/queues/{quick}")).json()["lease_advice"]
    assert advice["samples"] == 1 and advice["held_p999_seconds"] is None
    assert advice["warnings"] == []
