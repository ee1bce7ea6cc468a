"""Workers that die, freeze or lose the network, as real processes.

A real `leaseq serve` process (on a database of its own) and `leaseq worker`
processes running the handlers of tests/worker_handlers/faults.py. The handlers
report to an effect store (a SQLite file): what each process started, which
units it did, when it was cancelled, and the one downstream write per message,
fenced by the fencing token so that only the newest claim's write can land.

The service is never in this process: these tests block while they wait, and
the worker they freeze must be the only thing frozen.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from processes import LEASEQ, Service, ServiceProcesses, service_env, wait_until
from sqlalchemy.engine import make_url
from worker_handlers.effects import ENV, EffectStore, Event

pytestmark = pytest.mark.e2e

TESTS = Path(__file__).resolve().parents[1]
STEPS = "worker_handlers.faults:steps"
STEPS_ASYNC = "worker_handlers.faults:steps_async"
BLOCKING = "worker_handlers.faults:blocking"


# -- the service, the workers, the effect store --------------------------------------


@pytest.fixture(scope="module")
async def service_database(server_url: str, template_db: str) -> AsyncIterator[str]:
    name = f"leaseq_wf_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    finally:
        await admin.close()
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        admin = await asyncpg.connect(server_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@pytest.fixture(scope="module")
def service(service_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    workdir = tmp_path_factory.mktemp("worker-faults")
    with ServiceProcesses(workdir) as services:
        started = services.start(workdir / "data", database_url=service_database)
        started.wait_healthy()
        yield started


@pytest.fixture
def store(tmp_path: Path) -> EffectStore:
    return EffectStore(tmp_path / "effects.sqlite").create()


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def said(self, pattern: str) -> bool:
        return re.search(pattern, self.log(), re.MULTILINE) is not None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM (after SIGCONT, should it be stopped) and the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running:\n{self.log()[-3000:]}") from None


class Workers:
    """Starts `leaseq worker` processes; kills what is left on exit."""

    def __init__(self, workdir: Path, service: Service, store: EffectStore) -> None:
        self.workdir = workdir
        self.service = service
        self.store = store
        self.started: list[WorkerProcess] = []

    def start(self, queue: str, handler: str, *options: str, url: str | None = None
              ) -> WorkerProcess:
        log_path = self.workdir / f"worker-{len(self.started)}.log"
        env = service_env() | {ENV: str(self.store.path), "PYTHONUNBUFFERED": "1"}
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [LEASEQ, "worker", "--queue", queue, "--url", url or self.service.url,
                 "--app-dir", str(TESTS), "--wait", "20", *options, handler],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = WorkerProcess(proc, log_path)
        self.started.append(worker)
        wait_until(lambda: worker.said("worker on ") or proc.poll() is not None,
                   timeout=30, what="the worker to start")
        assert proc.poll() is None, worker.log()
        return worker

    def cleanup(self) -> None:
        for worker in self.started:
            if worker.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.pid, signal.SIGCONT)
                    os.killpg(worker.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(timeout=10)


@pytest.fixture
def workers(tmp_path: Path, service: Service, store: EffectStore) -> Iterator[Workers]:
    started = Workers(tmp_path, service, store)
    try:
        yield started
    finally:
        started.cleanup()


_names = iter(range(1_000_000))


def make_queue(service: Service, visibility_timeout: int) -> str:
    name = f"wf{next(_names)}-{uuid.uuid4().hex[:6]}"
    with service.client() as client:
        response = client.post(
            "/v1/queues", json={"name": name, "visibility_timeout": visibility_timeout}
        )
        assert response.status_code == 201, response.text
    return name


def send(service: Service, queue: str, plan: dict[str, Any]) -> str:
    with service.client() as client:
        response = client.post(f"/v1/queues/{queue}/messages", json={"body": json.dumps(plan)})
        assert response.status_code == 201, response.text
        message_id: str = response.json()["message_id"]
        return message_id


def is_empty(service: Service, queue: str) -> bool:
    with service.client() as client:
        stats = client.get(f"/v1/queues/{queue}").json()["stats"]
    return bool(stats["visible"] == stats["in_flight"] == stats["delayed"] == 0)


def receive(service: Service, queue: str, **params: Any) -> list[dict[str, Any]]:
    with service.client() as client:
        response = client.get(f"/v1/queues/{queue}/receive", params=params)
        assert response.status_code == 200, response.text
        messages: list[dict[str, Any]] = response.json()["messages"]
        return messages


def events_of(store: EffectStore, kind: str, worker: WorkerProcess) -> list[Event]:
    return [e for e in store.events(kind) if e.pid == worker.pid]


def one(events: list[Event]) -> Event:
    assert len(events) == 1, events
    return events[0]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    wait_until(condition, timeout=timeout, what=what, interval=0.02)


def acknowledged(worker: WorkerProcess, event: Event) -> bool:
    return worker.said(rf"\(fencing {event.fencing}\) acknowledged$")


# -- the faults ----------------------------------------------------------------------

LEASE = 2
PERIOD = LEASE / 3


def test_a_killed_worker_s_message_is_redelivered_and_completed_once(
    service: Service, workers: Workers, store: EffectStore
) -> None:
    queue = make_queue(service, LEASE)
    message_id = send(service, queue, {"steps": 10, "step": 0.1})
    first = workers.start(queue, STEPS, "--visibility-timeout", str(LEASE))
    wait_for(lambda: bool(store.events("started")), "the first worker to start")
    first.kill()  # SIGKILL: no cleanup, no release, the lease just runs out
    second = workers.start(queue, STEPS, "--visibility-timeout", str(LEASE))
    wait_for(lambda: is_empty(service, queue), "the message to be completed and deleted")

    a = one(events_of(store, "started", first))
    b = one(events_of(store, "started", second))
    assert b.receive_count == 2 and b.fencing > a.fencing
    assert b.at - a.at > LEASE - 0.5  # only once the first lease had run out
    done = one(store.events("finished"))  # completed exactly once, by the second
    assert done.pid == second.pid and done.detail == "True"
    assert store.effects() == [(message_id, b.fencing, second.pid, f"done by fencing {b.fencing}")]
    wait_for(lambda: acknowledged(second, b), "the second worker to log its acknowledgement")
    assert second.terminate() == 0


def test_a_frozen_worker_is_cancelled_when_it_thaws_and_never_acknowledges(
    service: Service, workers: Workers, store: EffectStore
) -> None:
    # SIGSTOP: alive but unable to renew, like a VM pause or a stop-the-world.
    queue = make_queue(service, LEASE)
    message_id = send(service, queue, {"steps": 20, "step": 0.1})
    first = workers.start(queue, STEPS, "--visibility-timeout", str(LEASE))
    wait_for(lambda: bool(events_of(store, "unit", first)), "the first worker to work")
    first.proc.send_signal(signal.SIGSTOP)
    second = workers.start(queue, STEPS, "--visibility-timeout", str(LEASE))
    wait_for(lambda: bool(events_of(store, "finished", second)), "the second worker to finish")
    wait_for(lambda: is_empty(service, queue), "the second worker's acknowledgement")

    thawed = time.monotonic()
    first.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: bool(events_of(store, "cancelled", first)), "the first handler to stop")
    cancelled = one(events_of(store, "cancelled", first))
    # Its lease is past on its monotonic clock (which ran on while it was stopped):
    # the watchdog fires before any beat is sent, well within one period.
    assert cancelled.detail == "lease_expired"
    assert cancelled.at - thawed < PERIOD
    wait_for(lambda: first.said("abandoned"), "the first worker to give the message up")
    a = one(events_of(store, "started", first))
    b = one(events_of(store, "started", second))
    assert not acknowledged(first, a) and not first.said("acknowledgement rejected")
    assert not events_of(store, "finished", first)
    assert store.effects() == [(message_id, b.fencing, second.pid, f"done by fencing {b.fencing}")]
    assert b.fencing > a.fencing
    assert first.terminate() == 0 and second.terminate() == 0


@contextlib.contextmanager
def proxy_to(service: Service) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "worker_handlers" / "proxy.py"), str(service.port)],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_cut_network_cancels_the_handler_before_the_message_is_redelivered(
    service: Service, workers: Workers, store: EffectStore
) -> None:
    queue = make_queue(service, LEASE)
    message_id = send(service, queue, {"steps": 30, "step": 0.1})
    with proxy_to(service) as (proxied, proxy):
        first = workers.start(queue, STEPS_ASYNC, "--visibility-timeout", str(LEASE), url=proxied)
        wait_for(lambda: bool(events_of(store, "unit", first)), "the first worker to work")
        proxy.send_signal(signal.SIGSTOP)  # the path to the service is a black hole now
        cut = time.monotonic()
        second = workers.start(queue, STEPS_ASYNC, "--visibility-timeout", str(LEASE))
        wait_for(lambda: bool(events_of(store, "cancelled", first)), "the first handler to stop")
        wait_for(lambda: is_empty(service, queue), "the second worker to finish")
        proxy.send_signal(signal.SIGCONT)

        cancelled = one(events_of(store, "cancelled", first))
        a = one(events_of(store, "started", first))
        b = one(events_of(store, "started", second))
        assert cancelled.detail == "lease_expired"
        # at the latest one lease after the last beat that got through (before the cut)
        assert cancelled.at - cut <= LEASE + 0.3
        # and before the service could hand the message to anyone else: the local
        # deadline runs from the sending of each request, so it is never late
        assert cancelled.at < b.at
        assert b.receive_count == 2
        assert not events_of(store, "finished", first)
        assert store.effects() == [
            (message_id, b.fencing, second.pid, f"done by fencing {b.fencing}")
        ]
        wait_for(lambda: first.said("abandoned"), "the first worker to give the message up")
        # the queue empties when the service deletes; the worker logs once it is answered
        wait_for(lambda: acknowledged(second, b), "the second worker to log its acknowledgement")
        assert not acknowledged(first, a)
        assert first.terminate() == 0 and second.terminate() == 0


def test_a_handler_ten_leases_long_completes_on_heartbeats_alone(
    service: Service, workers: Workers, store: EffectStore
) -> None:
    queue = make_queue(service, 1)
    message_id = send(service, queue, {"steps": 105, "step": 0.1})  # 10.5 one-second leases
    first = workers.start(queue, STEPS, "--visibility-timeout", "1")
    wait_for(lambda: bool(store.events("started")), "the first worker to start")
    rival = workers.start(queue, STEPS, "--visibility-timeout", "1")  # polls the queue all along
    wait_for(lambda: is_empty(service, queue), "the long job to finish", timeout=40)

    started = one(store.events("started"))  # never redelivered, to anyone
    assert started.pid == first.pid and started.receive_count == 1
    done = one(store.events("finished"))
    assert done.pid == first.pid and done.at - started.at >= 10.5
    assert store.effects() == [(message_id, started.fencing, first.pid,
                                f"done by fencing {started.fencing}")]
    wait_for(lambda: acknowledged(first, started), "the worker to log its acknowledgement")
    assert first.terminate() == 0 and rival.terminate() == 0


def test_a_killed_long_job_resumes_from_its_last_checkpoint(
    service: Service, workers: Workers, store: EffectStore
) -> None:
    queue = make_queue(service, LEASE)
    send(service, queue, {"steps": 20, "step": 0.1, "checkpoint": True})
    first = workers.start(queue, STEPS, "--visibility-timeout", str(LEASE))
    wait_for(
        lambda: any(int(e.detail or 0) >= 6 for e in events_of(store, "checkpointed", first)),
        "six units checkpointed",
    )
    first.kill()
    saved = max(int(e.detail or 0) for e in events_of(store, "checkpointed", first))
    second = workers.start(queue, STEPS, "--visibility-timeout", str(LEASE))
    wait_for(lambda: is_empty(service, queue), "the job to finish")

    resumed = one(events_of(store, "started", second))
    start = int(resumed.detail or 0)
    # from the last checkpoint (or the one saved just before the kill), not from 0
    assert saved <= start <= saved + 1
    assert [int(e.detail or 0) for e in events_of(store, "unit", second)] == list(range(start, 20))
    assert one(store.events("finished")).pid == second.pid
    assert second.terminate() == 0


def test_a_blocked_event_loop_keeps_its_lease_with_the_heartbeat_thread(
    service: Service, workers: Workers, store: EffectStore
) -> None:
    queue = make_queue(service, 1)
    send(service, queue, {"block": 3.5})  # blocks the handler's loop for 3.5 leases
    worker = workers.start(queue, BLOCKING, "--visibility-timeout", "1", "--heartbeat", "thread")
    wait_for(lambda: bool(store.events("started")), "the handler to start")

    def never_visible_until_finished() -> bool:
        # Try to take the message all along: it never becomes visible.
        assert receive(service, queue, wait=0, visibility_timeout=30) == []
        return bool(store.events("finished"))

    wait_for(never_visible_until_finished, "the handler to finish")
    wait_for(lambda: is_empty(service, queue), "the acknowledgement")
    started = one(store.events("started"))
    assert started.receive_count == 1
    wait_for(lambda: acknowledged(worker, started), "the worker to log its acknowledgement")
    assert worker.terminate() == 0


def test_a_blocked_event_loop_loses_its_lease_with_a_same_loop_heartbeat(
    service: Service, workers: Workers, store: EffectStore
) -> None:
    queue = make_queue(service, 1)
    send(service, queue, {"block": 3.5})
    worker = workers.start(queue, BLOCKING, "--visibility-timeout", "1", "--heartbeat", "task")
    wait_for(lambda: bool(store.events("started")), "the handler to start")
    taken: list[dict[str, Any]] = []

    def take() -> bool:
        taken.extend(receive(service, queue, wait=1, visibility_timeout=30))
        return bool(taken)

    # The beat task cannot run while the loop is blocked: the lease lapses.
    wait_for(take, "the message to come back while the handler still runs", timeout=10)
    assert not store.events("finished")
    (mine,) = taken
    assert mine["receive_count"] == 2
    started = one(store.events("started"))
    wait_for(lambda: worker.said("abandoned") or worker.said("acknowledgement rejected"),
             "the worker to find out")
    assert not acknowledged(worker, started)
    # ... but the handler's side effect did happen: only fencing can refuse it
    assert one(store.events("finished")).detail == "True"
    with service.client() as client:
        deleted = client.delete(f"/v1/queues/{queue}/messages/{mine['receipt_handle']}")
        assert deleted.status_code == 204  # our claim was untouched
    assert worker.terminate() == 0


def test_sigterm_lets_the_handler_finish_then_exits(
    service: Service, workers: Workers, store: EffectStore
) -> None:
    queue = make_queue(service, LEASE)
    send(service, queue, {"steps": 10, "step": 0.1})
    worker = workers.start(queue, STEPS, "--visibility-timeout", str(LEASE), "--grace", "20")
    wait_for(lambda: bool(store.events("started")), "the handler to start")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=20) == 0, worker.log()
    started = one(store.events("started"))
    assert one(store.events("finished")).pid == worker.pid
    assert acknowledged(worker, started) and is_empty(service, queue)


def test_sigterm_past_the_grace_period_cancels_and_releases(
    service: Service, workers: Workers, store: EffectStore
) -> None:
    queue = make_queue(service, 30)
    send(service, queue, {"steps": 100, "step": 0.1})
    worker = workers.start(queue, STEPS, "--visibility-timeout", "30", "--grace", "0.5")
    wait_for(lambda: bool(store.events("started")), "the handler to start")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=20) == 0, worker.log()
    assert one(store.events("cancelled")).detail == "shutdown"
    assert worker.said(r"released \(its handler was cancelled\)")
    (back,) = receive(service, queue, wait=0)  # at once, not after the 30 s lease
    assert back["receive_count"] == 2
