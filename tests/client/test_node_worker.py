"""The Node.js worker (clients/node) against the real service: it processes,
heartbeats, checkpoints and acknowledges, releases a failure through the release
endpoint, and a 409 on a heartbeat aborts its handler.

Runs `node` from PATH (Node 20+); skipped only when there is none.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from processes import service_env
from support import wait_until

from leaseq import AsyncClient

NODE = shutil.which("node")
TESTS = Path(__file__).resolve().parents[1]
WORKER = TESTS.parent / "clients" / "node" / "bin" / "leaseq-worker.js"
HANDLER = TESTS / "worker_handlers" / "node_handler.mjs"

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(NODE is None, reason="node is not installed")]


class NodeWorker:
    def __init__(self, proc: asyncio.subprocess.Process, log: Path, events: Path) -> None:
        self.proc = proc
        self.log_path = log
        self.events_path = events

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def said(self, pattern: str) -> bool:
        return re.search(pattern, self.log(), re.MULTILINE) is not None

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        lines = self.events_path.read_text().splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
        return [e for e in events if kind is None or e["kind"] == kind]

    async def stop(self) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            return await self.proc.wait()


@pytest.fixture
async def node_worker(
    served: tuple[str, Any], tmp_path: Path
) -> AsyncIterator[Any]:
    started: list[NodeWorker] = []

    async def start(queue: str, *options: str) -> NodeWorker:
        assert NODE is not None
        log = tmp_path / f"node-{len(started)}.log"
        events = tmp_path / f"node-{len(started)}.jsonl"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                NODE, str(WORKER), "--url", served[0], "--queue", queue, "--wait", "20",
                *options, str(HANDLER),
                env=service_env() | {"LEASEQ_TEST_EVENTS": str(events)},
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
            )
        worker = NodeWorker(proc, log, events)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.proc.returncode is None:
            worker.proc.kill()
            await worker.proc.wait()


async def is_empty(api: AsyncClient, queue: str) -> bool:
    stats = (await api.get_queue(queue)).stats
    return stats is not None and stats.visible == stats.in_flight == stats.delayed == 0


async def wait_empty(api: AsyncClient, queue: str, seconds: float) -> None:
    async with asyncio.timeout(seconds):
        while not await is_empty(api, queue):  # noqa: ASYNC110 - the state is the service's
            await asyncio.sleep(0.05)


async def test_the_node_worker_heartbeats_checkpoints_and_acknowledges(
    api: AsyncClient, node_worker: Any
) -> None:
    await api.create_queue("node", visibility_timeout=1)
    long = await api.send("node", json.dumps({"steps": 12, "step": 0.2}))  # 2.4 leases
    flaky = await api.send(
        "node", json.dumps({"steps": 3, "step": 0.1, "checkpoint": True, "fail": True})
    )
    worker = await node_worker("node", "--visibility-timeout", "1", "--concurrency", "2")
    await wait_empty(api, "node", 20)

    started = worker.events("started")
    long_starts = [e for e in started if e["message_id"] == long.message_id]
    flaky_starts = [e for e in started if e["message_id"] == flaky.message_id]
    # the long one lived on heartbeats: never redelivered
    assert [e["receive_count"] for e in long_starts] == [1]
    assert long_starts[0]["detail"]["remaining"] <= 1.0
    # the flaky one failed after its checkpoints, was released and resumed at its cursor
    assert [(e["receive_count"], e["detail"]["start"]) for e in flaky_starts] == [(1, 0), (2, 3)]
    finished = worker.events("finished")
    assert sorted(e["message_id"] for e in finished) == sorted([long.message_id, flaky.message_id])
    for event in finished:  # logged once the service answered, just after the queue emptied
        pattern = rf"\(fencing {event['fencing']}\) acknowledged$"
        await wait_until(lambda pattern=pattern: worker.said(pattern), seconds=5)
    assert worker.said(r"released, visible again in 0s")
    assert await worker.stop() == 0, worker.log()


async def test_a_409_on_a_node_heartbeat_aborts_the_handler(
    api: AsyncClient, node_worker: Any
) -> None:
    await api.create_queue("node409", visibility_timeout=3)
    await api.send("node409", json.dumps({"steps": 100, "step": 0.1}))
    worker = await node_worker("node409", "--lease", "3")  # beats every second
    await wait_until(lambda: bool(worker.events("started")), seconds=20)
    (started,) = worker.events("started")

    # take the message away: release it with the worker's handle, then claim it
    await api.release("node409", started["handle"], 0)
    (mine,) = await api.receive("node409", visibility_timeout=60, wait=0)
    taken = time.monotonic()
    await wait_until(lambda: bool(worker.events("aborted")), seconds=5)
    aborted_after = time.monotonic() - taken
    (aborted,) = worker.events("aborted")
    assert aborted["detail"] == "lease_lost"
    assert aborted_after < 1.0 + 0.5  # the next beat got 409 (one period, plus polling)
    await wait_until(lambda: worker.said("abandoned"), seconds=5)
    assert not worker.said(rf"\(fencing {started['fencing']}\) acknowledged$")
    assert not worker.events("finished")
    await api.delete("node409", mine.receipt_handle)  # our claim was never touched
    assert await worker.stop() == 0, worker.log()


async def test_the_node_worker_releases_through_the_endpoint_and_checkpoints_by_its_lease(
    api: AsyncClient, node_worker: Any
) -> None:
    # The queue's retry ladder holds a released message for 30 s (a visibility
    # change to 0 would not); its visibility_timeout of 0 would end the lease at
    # a checkpoint that did not send the worker's own lease as its timeout.
    ladder = {"initial": 30, "max": 30, "jitter": 0}
    await api.create_queue("nodeladder", visibility_timeout=0, retry_backoff=ladder)
    await api.send(
        "nodeladder", json.dumps({"steps": 3, "step": 0.05, "checkpoint": True, "fail": True})
    )
    worker = await node_worker("nodeladder", "--visibility-timeout", "5")
    await wait_until(lambda: worker.said(r"released, visible again in 30s$"), seconds=20)
    stats = (await api.get_queue("nodeladder")).stats
    assert stats is not None and (stats.visible, stats.in_flight, stats.delayed) == (0, 0, 1)
    assert [e["receive_count"] for e in worker.events("started")] == [1]
    assert not worker.events("aborted")
    assert await worker.stop() == 0, worker.log()


async def test_the_node_client_covers_the_rest_api(served: tuple[str, Any]) -> None:
    assert NODE is not None
    proc = await asyncio.create_subprocess_exec(
        NODE, str(TESTS / "node_client" / "api.mjs"), served[0], env=service_env(),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    result = json.loads(out)
    assert result == {
        "created": "node-api", "sent": result["sent"], "batch": 2, "visible": 3,
        "peeked": ["on", "tw", "th"], "received": ["one", "three", "two"], "extended": 60,
        "extendedBatch": 1, "checkpointed": 45, "released": "number", "deleted": 2,
        "again": "lease_lost", "settled": [["lease_lost"], ["three"], []],
        "listed": ["node-api"], "purged": 1, "sources": [],
        "gone": "queue_not_found",
    }


async def test_a_stop_with_every_slot_busy_cancels_after_the_grace_period(
    api: AsyncClient, node_worker: Any,
) -> None:
    """SIGTERM while the only slot runs a long handler: the receive loop, waiting
    for a free slot, must still end, so that the grace period runs out and the
    handler is cancelled, rather than shutdown waiting for the handler."""
    await api.create_queue("long", visibility_timeout=30)
    await api.send("long", json.dumps({"steps": 600, "step": 1}))
    worker = await node_worker("long", "--concurrency", "1", "--grace", "1")
    await wait_until(lambda: len(worker.events("started")) == 1, seconds=30)
    worker.proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(20):
        assert await worker.proc.wait() == 0, worker.log()
    (aborted,) = worker.events("aborted")
    assert aborted["detail"] == "shutdown", worker.log()
    assert worker.said("cancelling 1 in-flight handlers")
