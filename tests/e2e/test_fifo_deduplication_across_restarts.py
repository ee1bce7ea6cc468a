"""FIFO deduplication under real processes: it survives a `kill -9` of the service
(the window is in PostgreSQL), and holds between two service processes sending the
same deduplication ids at once."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from processes import ServiceProcesses, count_messages, create_fifo_queue

pytestmark = pytest.mark.e2e


# -- deduplication ------------------------------------------------------------------


def send_one(client: httpx.Client, queue: str, body: str, group: str,
             dedup: str) -> dict[str, Any]:
    response = client.post(f"/v1/queues/{queue}/messages",
                           json={"body": body, "group": group, "deduplication_id": dedup})
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


def test_deduplication_holds_across_a_kill_9_of_the_service(
    database_url: str, services: ServiceProcesses, tmp_path: Path
) -> None:
    data_dir = tmp_path / "svc"
    first = services.start(data_dir, database_url=database_url)
    first.wait_healthy()
    queue = "restart.fifo"
    create_fifo_queue(first, queue)
    original: dict[str, dict[str, Any]] = {}
    with first.client() as client:
        for n in range(20):
            original[f"d-{n}"] = send_one(client, queue, f"first {n}", f"g{n % 3}", f"d-{n}")
        response = client.post(f"/v1/queues/{queue}/messages", json={"messages": [
            {"body": f"first {n}", "group": f"g{n % 3}", "deduplication_id": f"d-{n}"}
            for n in range(20, 30)
        ]})
        assert response.status_code == 200, response.text
        for n, result in zip(range(20, 30), response.json()["results"], strict=True):
            assert result["ok"], result
            original[f"d-{n}"] = result
    first.kill()  # kill -9: whatever it kept in memory is gone

    second = services.start(data_dir, database_url=database_url)
    second.wait_healthy()
    with second.client() as client:
        for n in range(20):
            again = send_one(client, queue, f"second {n}", f"g{n % 3}", f"d-{n}")
            assert again["message_id"] == original[f"d-{n}"]["message_id"], n
            assert again["sequence_number"] == original[f"d-{n}"]["sequence_number"], n
        response = client.post(f"/v1/queues/{queue}/messages", json={"messages": [
            {"body": f"second {n}", "group": f"g{n % 3}", "deduplication_id": f"d-{n}"}
            for n in range(20, 30)
        ]})
        assert response.status_code == 200, response.text
        for n, result in zip(range(20, 30), response.json()["results"], strict=True):
            assert result["message_id"] == original[f"d-{n}"]["message_id"], n
        assert count_messages(database_url, queue) == 30
        fresh = send_one(client, queue, "new", "g0", "d-new")
        assert fresh["message_id"] not in {r["message_id"] for r in original.values()}
        assert int(fresh["sequence_number"]) > max(
            int(r["sequence_number"]) for r in original.values())
        received: list[dict[str, Any]] = []
        while batch := client.get(f"/v1/queues/{queue}/receive",
                                  params={"max": 10, "wait": 0}).json()["messages"]:
            received.extend(batch)
            assert client.post(f"/v1/queues/{queue}/messages/delete", json={
                "receipt_handles": [m["receipt_handle"] for m in batch]}).json()["failed"] == 0
    assert sorted(m["body"] for m in received) == sorted(
        [f"first {n}" for n in range(30)] + ["new"])


def test_deduplication_holds_between_two_services_sending_at_once(
    database_url: str, services: ServiceProcesses, tmp_path: Path
) -> None:
    one = services.start(tmp_path / "one", database_url=database_url)
    two = services.start(tmp_path / "two", database_url=database_url)
    one.wait_healthy()
    two.wait_healthy()
    queue = "shared.fifo"
    create_fifo_queue(one, queue)
    ids = [f"dup-{n}" for n in range(200)]

    def entry(dedup: str) -> dict[str, str]:
        n = int(dedup.removeprefix("dup-"))
        return {"body": f"body {n}", "group": f"g{n % 7}", "deduplication_id": dedup}

    async def go() -> list[tuple[str, dict[str, Any]]]:
        answers: list[tuple[str, dict[str, Any]]] = []
        gate = asyncio.Semaphore(48)
        async with (httpx.AsyncClient(base_url=one.url, timeout=30) as a,
                    httpx.AsyncClient(base_url=two.url, timeout=30) as b):
            async def post(client: httpx.AsyncClient, payload: dict[str, Any]) -> None:
                async with gate:
                    response = await client.post(f"/v1/queues/{queue}/messages", json=payload)
                if "messages" in payload:
                    assert response.status_code == 200, response.text
                    for e, r in zip(payload["messages"], response.json()["results"],
                                    strict=True):
                        assert r["ok"], r
                        answers.append((e["deduplication_id"], r))
                else:
                    assert response.status_code == 201, response.text
                    answers.append((payload["deduplication_id"], response.json()))

            # Each id twice through each service singly, and once more through
            # each in a batch (in opposite orders), the copies of an id close
            # enough together to be in flight at once.
            calls = []
            for start in range(0, len(ids), 10):
                chunk = [entry(d) for d in ids[start : start + 10]]
                calls += [post(c, e) for e in chunk for c in (a, b, a, b)]
                calls += [post(a, {"messages": chunk}),
                          post(b, {"messages": list(reversed(chunk))})]
            await asyncio.gather(*calls)
        return answers

    answers = asyncio.run(go())
    assert len(answers) == 6 * len(ids)
    by_id: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for dedup, result in answers:
        by_id[dedup].add((result["message_id"], result["sequence_number"]))
    several = {d: s for d, s in by_id.items() if len(s) != 1}
    assert not several, f"{len(several)} ids answered with several messages: " + str(
        list(several.items())[:3])
    assert len({s for (s,) in by_id.values()}) == len(ids)
    assert count_messages(database_url, queue) == len(ids)

    with one.client() as client:
        received: list[dict[str, Any]] = []
        while batch := client.get(f"/v1/queues/{queue}/receive",
                                  params={"max": 10, "wait": 0}).json()["messages"]:
            received.extend(batch)
            assert client.post(f"/v1/queues/{queue}/messages/delete", json={
                "receipt_handles": [m["receipt_handle"] for m in batch]}).json()["failed"] == 0
    assert sorted(m["deduplication_id"] for m in received) == sorted(ids)
    assert {m["message_id"] for m in received} == {mid for ((mid, _),) in by_id.values()}
