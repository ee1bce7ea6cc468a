"""The Node.js worker (clients/node) on FIFO queues, against the real service: each
group's messages are handled one at a time in send order, each only once the one
before it is settled, while groups run concurrently; a failure gives back the
rest of its group, which is redelivered in order.

The handler is written by the test into its temporary directory. Before each
message (but a group's first) it asks the service whether the message handled
before it in its group is still in flight: it must not be.
Runs `node` from PATH (Node 20+); skipped only when there is none.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import shutil
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from processes import service_env

from leaseq import AsyncClient, OutgoingMessage, Sent

NODE = shutil.which("node")
TESTS = Path(__file__).resolve().parents[1]
WORKER = TESTS.parent / "clients" / "node" / "bin" / "leaseq-worker.js"

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(NODE is None, reason="node is not installed")]

HANDLER = r"""
import { appendFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';

const last = new Map(); // group -> the id of the message handled last

async function inFlight() {
  const queue = encodeURIComponent(process.env.LEASEQ_TEST_QUEUE);
  const url = `${process.env.LEASEQ_TEST_URL}/v1/queues/${queue}/messages`
    + '?state=in_flight&limit=1000&body_chars=1';
  const { messages } = await (await fetch(url)).json();
  return new Set(messages.map((m) => m.message_id));
}

export async function handle(message, ctx) {
  const plan = JSON.parse(message.body);
  const start = performance.now();
  const previous = last.get(message.group);
  // (a redelivery of the message handled last is in flight again: its own claim)
  const previousInFlight = previous === undefined || previous === message.message_id
    ? false : (await inFlight()).has(previous);
  if (plan.checkpoint && message.receive_count === 1) await ctx.checkpoint({ done: 1 });
  await sleep(plan.ms, undefined, { signal: ctx.signal });
  const fail = Boolean(plan.fail) && message.receive_count === 1;
  last.set(message.group, message.message_id);
  appendFileSync(process.env.LEASEQ_TEST_EVENTS, JSON.stringify({
    name: plan.name, group: message.group, sequence_number: message.sequence_number,
    deduplication_id: message.deduplication_id, receive_count: message.receive_count,
    fenced: ctx.fencingToken === message.fencing_token, checkpoint: message.checkpoint,
    previous_in_flight: previousInFlight, start, end: performance.now(), fail,
  }) + '\n');
  if (fail) throw new Error('the planned failure');
}
"""


class NodeWorker:
    def __init__(self, proc: asyncio.subprocess.Process, log: Path, events: Path) -> None:
        self.proc = proc
        self.log_path = log
        self.events_path = events

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.log(), re.MULTILINE))

    def runs(self) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        lines = self.events_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    async def stop(self) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            return await self.proc.wait()


StartWorker = Callable[..., Awaitable[NodeWorker]]


@pytest.fixture
async def node_worker(served: tuple[str, Any], tmp_path: Path) -> AsyncIterator[StartWorker]:
    handler = tmp_path / "fifo_handler.mjs"
    handler.write_text(HANDLER)
    started: list[NodeWorker] = []

    async def start(queue: str, *options: str) -> NodeWorker:
        assert NODE is not None
        log = tmp_path / f"node-{len(started)}.log"
        events = tmp_path / f"node-{len(started)}.jsonl"
        env = service_env() | {
            "LEASEQ_TEST_EVENTS": str(events), "LEASEQ_TEST_URL": served[0],
            "LEASEQ_TEST_QUEUE": queue,
        }
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                NODE, str(WORKER), "--url", served[0], "--queue", queue, "--wait", "20",
                *options, str(handler), env=env,
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


async def send_groups(
    api: AsyncClient, queue: str, groups: list[str], per_group: int,
    plan: Callable[[str], dict[str, Any]] = lambda name: {},
) -> dict[str, list[str]]:
    """`per_group` messages to each group, in batches that interleave the groups;
    each group's names in send order."""
    sent: dict[str, list[str]] = {g: [] for g in groups}
    for start in range(0, per_group, 10):
        for group in groups:
            names = [f"{group}-{n:03d}" for n in range(start, min(start + 10, per_group))]
            results = await api.send_batch(queue, [
                OutgoingMessage(json.dumps({"name": name, "ms": 10, **plan(name)}),
                                group=group, deduplication_id=name)
                for name in names
            ])
            assert all(isinstance(r, Sent) and r.sequence_number for r in results), results
            sent[group].extend(names)
    return sent


async def wait_empty(api: AsyncClient, queue: str, seconds: float) -> None:
    async def empty() -> bool:
        stats = (await api.get_queue(queue)).stats
        return stats is not None and stats.visible == stats.in_flight == stats.delayed == 0

    async with asyncio.timeout(seconds):
        while not await empty():  # noqa: ASYNC110 - the state is the service's
            await asyncio.sleep(0.05)


def handled(runs: list[dict[str, Any]], group: str) -> list[tuple[str, int]]:
    return [(r["name"], r["receive_count"]) for r in sorted(runs, key=lambda r: r["start"])
            if r["group"] == group]


def assert_one_at_a_time(runs: list[dict[str, Any]]) -> None:
    ordered = sorted(runs, key=lambda r: r["start"])
    for group in {r["group"] for r in runs}:
        mine = [r for r in ordered if r["group"] == group]
        for before, after in itertools.pairwise(mine):
            assert before["end"] <= after["start"], (before, after)
    assert not [r["name"] for r in runs if r["previous_in_flight"]]


def most_at_once(runs: list[dict[str, Any]]) -> int:
    edges = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs])
    return max(itertools.accumulate(step for _, step in edges))


def groups_overlapped(runs: list[dict[str, Any]]) -> bool:
    return any(
        a["group"] != b["group"] and a["start"] < b["end"] and b["start"] < a["end"]
        for a, b in itertools.combinations(runs, 2)
    )


async def test_the_node_worker_handles_each_group_in_order_and_groups_concurrently(
    api: AsyncClient, node_worker: StartWorker
) -> None:
    await api.create_queue("node-work.fifo", fifo=True, visibility_timeout=30)
    groups = [f"g{n}" for n in range(10)]
    sent = await send_groups(api, "node-work.fifo", groups, 20)
    worker = await node_worker("node-work.fifo", "--concurrency", "8")
    await wait_empty(api, "node-work.fifo", 60)

    runs = worker.runs()
    assert len(runs) == 200, worker.log()
    for group in groups:
        assert handled(runs, group) == [(name, 1) for name in sent[group]], group
        numbers = [int(r["sequence_number"]) for r in sorted(runs, key=lambda r: r["start"])
                   if r["group"] == group]
        assert numbers == sorted(numbers)
    assert all(r["fenced"] and r["deduplication_id"] == r["name"] for r in runs)
    assert_one_at_a_time(runs)
    assert groups_overlapped(runs)
    assert 2 <= most_at_once(runs) <= 8
    assert worker.count(r"is a FIFO queue") == 1
    assert worker.count(r"given back unhandled|released|abandoned") == 0, worker.log()
    assert await worker.stop() == 0, worker.log()


async def test_a_node_failure_gives_back_the_rest_of_its_group_which_comes_again_in_order(
    api: AsyncClient, node_worker: StartWorker
) -> None:
    await api.create_queue("node-fail.fifo", fifo=True, visibility_timeout=30)
    failing = {"checkpoint": True, "fail": True}
    sent = await send_groups(api, "node-fail.fifo", ["A", "B"], 5,
                             plan=lambda name: failing if name == "A-002" else {})
    # All sent before the worker starts: its first receive (of up to 8) holds
    # the five of A, then three of B.
    worker = await node_worker("node-fail.fifo", "--concurrency", "8")
    await wait_empty(api, "node-fail.fifo", 30)

    runs = worker.runs()
    assert handled(runs, "A") == [
        ("A-000", 1), ("A-001", 1), ("A-002", 1), ("A-002", 2), ("A-003", 2), ("A-004", 2),
    ], worker.log()
    assert handled(runs, "B") == [(name, 1) for name in sent["B"]]
    assert_one_at_a_time(runs)
    retried = [r for r in runs if r["name"] == "A-002"]
    assert [r["checkpoint"] for r in retried] == [None, {"done": 1}]
    assert worker.count(r"given back unhandled$") == 2, worker.log()
    assert worker.count(r"released, visible again in 0s$") == 1, worker.log()
    assert await worker.stop() == 0, worker.log()
