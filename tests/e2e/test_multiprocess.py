"""Several service processes on one database: a waiter in one process wakes for
a send through another (the wake-up crosses only through PostgreSQL)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from processes import ServiceProcesses, wait_until

pytestmark = pytest.mark.e2e


def parked_count(metrics: str) -> int:
    for line in metrics.splitlines():
        if line.startswith("leaseq_waiting_receivers "):
            return int(float(line.split()[1]))
    raise AssertionError("no leaseq_waiting_receivers in /metrics")


def test_a_send_through_one_process_wakes_a_waiter_in_another(
    services: ServiceProcesses, database_url: str, tmp_path: Path
) -> None:
    one = services.start(tmp_path / "one", database_url=database_url)
    two = services.start(tmp_path / "two", database_url=database_url)
    one.wait_healthy()
    two.wait_healthy()
    result: dict[str, Any] = {}

    with one.client() as first, two.client() as second:
        assert first.post("/v1/queues", json={"name": "shared"}).status_code == 201

        def wait_for_message() -> None:
            start = time.monotonic()
            response = first.get("/v1/queues/shared/receive", params={"wait": 20})
            result["elapsed"] = time.monotonic() - start
            result["messages"] = response.json()["messages"]

        waiter = threading.Thread(target=wait_for_message)
        waiter.start()
        deadline = time.monotonic() + 10
        while parked_count(first.get("/metrics").text) < 1:
            assert time.monotonic() < deadline, "the receive never started waiting"
            time.sleep(0.01)
        sent = second.post("/v1/queues/shared/messages", json={"body": "across"})
        assert sent.status_code == 201
        waiter.join(timeout=30)
    assert [m["body"] for m in result["messages"]] == ["across"]
    assert result["elapsed"] < 10  # woken, not timed out at 20 s


def test_uvicorn_workers_serve_and_wake_each_other(
    services: ServiceProcesses, database_url: str, tmp_path: Path
) -> None:
    service = services.start(tmp_path / "w", database_url=database_url,
                             extra_args=("--workers", "2"))
    service.wait_healthy()
    results: list[list[dict[str, Any]]] = []
    with service.client() as client:
        assert client.post("/v1/queues", json={"name": "w"}).status_code == 201

        def receive() -> None:
            with service.client() as own:
                got = own.get("/v1/queues/w/receive", params={"wait": 20, "max": 1})
                results.append(got.json()["messages"])

        # Four waiters spread over the two worker processes by the kernel.
        threads = [threading.Thread(target=receive) for _ in range(4)]
        for thread in threads:
            thread.start()
        start = time.monotonic()
        deadline = start + 10
        # Whichever worker answers /metrics, some receiver there is waiting.
        while parked_count(client.get("/metrics").text) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        batch = [{"body": str(i)} for i in range(4)]
        for entry in batch:
            assert client.post("/v1/queues/w/messages", json=entry).status_code == 201
        for thread in threads:
            thread.join(timeout=30)
    # max=1 each: four messages, four receivers, one each, none timed out.
    assert sorted(m["body"] for got in results for m in got) == ["0", "1", "2", "3"]
    assert time.monotonic() - start < 15


def healthz_count(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith('leaseq_http_requests_total{method="GET",route="/healthz",'
                           'status="200"}'):
            return float(line.split()[-1])
    raise AssertionError(f"no count of /healthz in /metrics:\n{metrics}")


def test_uvicorn_workers_answer_one_set_of_metrics(
    services: ServiceProcesses, database_url: str, tmp_path: Path
) -> None:
    service = services.start(tmp_path / "m", database_url=database_url,
                             extra_args=("--workers", "2"))
    service.wait_healthy()
    with service.client() as client:
        before = healthz_count(client.get("/metrics").text)
        for _ in range(30):
            assert client.get("/healthz").status_code == 200
        # A request is counted just after its answer is sent: the last one may
        # land a moment after the client has read it.
        wait_until(lambda: healthz_count(client.get("/metrics").text) == before + 30,
                   timeout=10, what="the last /healthz counted")
    # New connections each time: the kernel spreads them over both workers, and
    # each answers the sum of both processes' counts, not its own (which would
    # look like resets to Prometheus).
    seen = set()
    for _ in range(8):
        with service.client() as fresh:
            seen.add(healthz_count(fresh.get("/metrics").text))
    assert seen == {before + 30}
    assert service.stop() == 0, service.log()
