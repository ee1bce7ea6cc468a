"""Crashes and stops of the real `leaseq serve` with its embedded PostgreSQL.

Invariant 5: a message that POST answered 2xx for survives a `kill -9` of the
service, with the embedded PostgreSQL left running or killed as well, and the
next `leaseq serve` on the same data directory needs no operator.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from processes import (
    Service,
    ServiceProcesses,
    is_running,
    postgres_processes,
    postmaster_pid,
    wait_until,
)

pytestmark = pytest.mark.e2e

LEASE = 3600  # long enough that nothing is handed out twice while draining
BATCH = 5


def create_queue(service: Service, name: str) -> None:
    with service.client() as client:
        response = client.post("/v1/queues", json={"name": name})
        assert response.status_code == 201, response.text


def drain(service: Service, queue: str, *, timeout: float = 30.0) -> list[str]:
    """Receives until the queue answers empty; the ids in the order received."""
    received: list[str] = []
    deadline = time.monotonic() + timeout
    with service.client() as client:
        while True:
            assert time.monotonic() < deadline, f"queue not drained after {timeout}s"
            response = client.get(
                f"/v1/queues/{queue}/receive",
                params={"max": 10, "wait": 0, "visibility_timeout": LEASE},
            )
            assert response.status_code == 200, response.text
            messages = response.json()["messages"]
            if not messages:
                return received
            received.extend(m["message_id"] for m in messages)


class Senders:
    """Threads that send as fast as they can and record what was acknowledged."""

    def __init__(self, service: Service, queue: str, threads: int) -> None:
        self.service = service
        self.queue = queue
        self.acknowledged: set[str] = set()
        self.unanswered = 0  # messages whose request got no response (may exist or not)
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(n,), name=f"sender-{n}", daemon=True)
            for n in range(threads)
        ]

    def __enter__(self) -> Senders:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def count(self) -> int:
        with self._lock:
            return len(self.acknowledged)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in self._threads), "a sender did not stop"

    def _run(self, n: int) -> None:
        try:
            with self.service.client(timeout=10.0) as client:
                i = 0
                while not self._stop.is_set():
                    i += 1
                    self._send(client, n, i)
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.errors.append(exc)

    def _send(self, client: httpx.Client, n: int, i: int) -> None:
        batch = n % 2 == 1  # odd threads send batches, even ones single messages
        url = f"/v1/queues/{self.queue}/messages"
        payload: dict[str, Any] = (
            {"messages": [{"body": f"{n}-{i}-{k}"} for k in range(BATCH)]}
            if batch
            else {"body": f"{n}-{i}"}
        )
        try:
            response = client.post(url, json=payload)
        except httpx.TransportError:
            with self._lock:
                self.unanswered += BATCH if batch else 1
            time.sleep(0.01)  # the service is gone: do not spin
            return
        if batch:
            assert response.status_code == 200, response.text
            ids = [r["message_id"] for r in response.json()["results"] if r["ok"]]
        else:
            assert response.status_code == 201, response.text
            ids = [response.json()["message_id"]]
        with self._lock:
            self.acknowledged.update(ids)


def server_tree_is_single(data_dir: Path) -> bool:
    """Every postgres of the data directory is the postmaster or one of its children."""
    pid = postmaster_pid(data_dir)
    procs = postgres_processes(data_dir)
    return pid is not None and all(p.pid == pid or p.ppid() == pid for p in procs)


@pytest.mark.parametrize(
    "also_kill",
    [
        pytest.param("nothing", id="postgres-left-running"),
        pytest.param("postmaster", id="postmaster-killed"),
        pytest.param("all-postgres", id="postmaster-and-children-killed"),
    ],
)
def test_kill_9_under_load_loses_no_acknowledged_message(
    services: ServiceProcesses, tmp_path: Path, also_kill: str
) -> None:
    data_dir = tmp_path / "data"
    first = services.start(data_dir)
    first.wait_healthy()
    create_queue(first, "load")
    pid = postmaster_pid(data_dir)
    assert pid is not None and is_running(pid)

    with Senders(first, "load", threads=6) as senders:
        # Mid-load: the senders are still going when the service dies.
        wait_until(
            lambda: senders.count() >= 300 or bool(senders.errors),
            timeout=30,
            what="300 acknowledged sends",
        )
        first.kill()
        if also_kill != "nothing":
            psutil.Process(pid).kill()
        if also_kill == "all-postgres":
            # The orphaned children too: nothing is left to finish any work.
            for proc in postgres_processes(data_dir):
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
    assert not senders.errors, senders.errors
    acknowledged = senders.acknowledged
    if also_kill == "nothing":
        assert is_running(pid), "the embedded postmaster was meant to survive the service"
    else:
        wait_until(lambda: not is_running(pid), timeout=10, what="the postmaster to die")

    second = services.start(data_dir)
    second.wait_healthy()
    assert server_tree_is_single(data_dir), "more than one server runs in the data directory"

    received = drain(second, "load")
    assert len(received) == len(set(received)), "a message was handed out twice"
    missing = acknowledged - set(received)
    assert len(missing) == 0, (
        f"{len(missing)} of {len(acknowledged)} acknowledged messages lost, "
        f"e.g. {sorted(missing)[:3]}"
    )
    # Anything beyond the acknowledged ones came from requests that got no answer.
    assert len(received) <= len(acknowledged) + senders.unanswered

    # The restarted service owns the server now, adopted or not: a clean stop ends it.
    assert second.stop(signal.SIGTERM) == 0, second.log()
    assert not postgres_processes(data_dir), "a clean stop left PostgreSQL running"


@pytest.mark.parametrize(
    ("first_signal", "second_signal"),
    [(signal.SIGTERM, signal.SIGINT), (signal.SIGINT, signal.SIGTERM)],
    ids=["SIGTERM-then-SIGINT", "SIGINT-then-SIGTERM"],
)
def test_clean_stop_exits_0_and_stops_postgres(
    services: ServiceProcesses, tmp_path: Path, first_signal: int, second_signal: int
) -> None:
    data_dir = tmp_path / "data"
    # A grace longer than the long poll's wait: only its answer at the signal
    # lets the stop finish before the wait would have.
    first = services.start(data_dir, env={"LEASEQ_SHUTDOWN_GRACE_SECONDS": "60"})
    first.wait_healthy()
    create_queue(first, "jobs")
    create_queue(first, "idle")
    with first.client() as client:
        sent = client.post("/v1/queues/jobs/messages", json={"body": "survives"})
        assert sent.status_code == 201, sent.text
    pid = postmaster_pid(data_dir)
    assert pid is not None and is_running(pid)

    # A parked long poll must not hold the shutdown up (it waits up to 20 s).
    poll_done = threading.Event()
    answers: list[httpx.Response] = []

    def long_poll() -> None:
        try:
            with first.client(timeout=30.0) as client:
                answers.append(client.get("/v1/queues/idle/receive", params={"wait": 20}))
        except httpx.HTTPError:
            pass
        finally:
            poll_done.set()

    poller = threading.Thread(target=long_poll, daemon=True)
    poller.start()
    with first.client() as client:
        wait_until(lambda: _waiting_receivers(client) == 1, timeout=10,
                   what="the long poll to park")

    started = time.monotonic()
    code = first.stop(first_signal, timeout=15)
    assert code == 0, first.log()
    assert time.monotonic() - started < 15
    assert not is_running(pid), "the postmaster outlived a clean stop"
    assert not postgres_processes(data_dir)
    assert postmaster_pid(data_dir) is None, "postmaster.pid left behind"
    assert poll_done.wait(timeout=5)
    poller.join(timeout=5)
    # Answered, empty, when the signal came: not cut off when the grace ran out.
    assert [(a.status_code, a.json()["messages"]) for a in answers] == [(200, [])]

    # A start after a clean stop works and finds the data.
    second = services.start(data_dir)
    second.wait_healthy()
    with second.client() as client:
        response = client.get("/v1/queues/jobs/receive", params={"wait": 0})
        assert response.status_code == 200, response.text
        assert [m["body"] for m in response.json()["messages"]] == ["survives"]
    assert second.stop(second_signal, timeout=15) == 0, second.log()
    assert not postgres_processes(data_dir)


def test_workers_answer_their_parked_long_polls_at_sigterm(
    services: ServiceProcesses, tmp_path: Path
) -> None:
    """--workers N: each worker process closes its own wait hub on the signal."""
    service = services.start(tmp_path / "data", extra_args=("--workers", "2"),
                             env={"LEASEQ_SHUTDOWN_GRACE_SECONDS": "60"})
    service.wait_healthy()
    create_queue(service, "idle")
    answers: list[httpx.Response] = []

    def long_poll() -> None:
        with service.client(timeout=30.0) as client:
            answers.append(client.get("/v1/queues/idle/receive", params={"wait": 20}))

    pollers = [threading.Thread(target=long_poll, daemon=True) for _ in range(4)]
    for poller in pollers:
        poller.start()
    with service.client() as client:
        wait_until(lambda: _waiting_receivers(client) == 4, timeout=10,
                   what="the long polls to park")
    started = time.monotonic()
    assert service.stop(signal.SIGTERM, timeout=15) == 0, service.log()
    assert time.monotonic() - started < 15
    for poller in pollers:
        poller.join(timeout=5)
    assert sorted((a.status_code, len(a.json()["messages"])) for a in answers) == [(200, 0)] * 4


def test_second_service_on_same_data_dir_fails_fast_and_leaves_first_alone(
    services: ServiceProcesses, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    first = services.start(data_dir)
    first.wait_healthy()
    create_queue(first, "jobs")
    pid = postmaster_pid(data_dir)
    assert pid is not None

    second = services.start(data_dir)
    code = second.wait_exit(timeout=20)
    assert code != 0
    log = second.full_log()
    assert "is in use by another leaseq process" in log, log
    assert "Traceback" not in log, log

    # The first service and its server are untouched and still work end to end.
    assert first.proc.poll() is None
    assert postmaster_pid(data_dir) == pid and is_running(pid)
    with first.client() as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        sent = client.post("/v1/queues/jobs/messages", json={"body": "after"})
        assert sent.status_code == 201, sent.text
        received = client.get("/v1/queues/jobs/receive", params={"wait": 0})
        assert received.status_code == 200, received.text
        assert [m["body"] for m in received.json()["messages"]] == ["after"]
    assert first.stop() == 0, first.log()
    assert not postgres_processes(data_dir)


def _waiting_receivers(client: httpx.Client) -> int:
    """The parked long polls of the service, as its /metrics says."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("leaseq_waiting_receivers "):
            return int(float(line.split()[1]))
    raise AssertionError("no leaseq_waiting_receivers in /metrics")
