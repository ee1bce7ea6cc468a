"""FIFO queues under real processes: consumers killed with SIGKILL mid-message.

16 consumer processes drain 100 groups x 20 messages through a real `leaseq
serve` while some of them are killed holding messages (and replaced). Every
delivery is logged by the consumer that got it (one line, one write, so a killed
process leaves whole lines), and the logs are checked afterwards: every message
acknowledged exactly once, every claim of a group starting at its lowest
unacknowledged message, no later message of a group claimed while an earlier
claim of it still held its lease.

Deduplication across a `kill -9` of the service and between two services:
test_fifo_deduplication_across_restarts.py.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from processes import Service, ServiceProcesses, count_messages, create_fifo_queue, wait_until

pytestmark = pytest.mark.e2e

GROUPS = 100
PER_GROUP = 20
CONSUMERS = 16
LEASE = 2  # seconds: a killed consumer's messages come back soon
SLACK = 0.05  # seconds of clock difference allowed between PostgreSQL and this machine

# A consumer: stdlib only (starts fast, costs little per request). It logs
# each delivery before it processes it, and each acknowledgement's outcome,
# as one os.write of one JSON line to a file opened O_APPEND: what a SIGKILL
# leaves is whole lines. Times are time.monotonic(), one clock for every
# process of the machine. Before each acknowledgement it logs "acking": a
# consumer killed between that line and the outcome's may have deleted the
# message or not. `control/hold` is a request to be killed holding messages:
# the consumer that renames it to its own name first logs "hold", acknowledges
# the first message of its batch if the file says "after-one", and waits to be
# killed (or, for "stall", past its lease, and goes on).
CONSUMER = r'''
import http.client
import json
import os
import random
import sys
import time

port, queue, lease, name, log_path, control = (int(sys.argv[1]), *sys.argv[2:7])
fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def log(**event):
    os.write(fd, (json.dumps(event) + "\n").encode())


class Http:
    def __init__(self):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method, path):
        for attempt in (1, 2):
            try:
                self.conn.request(method, path)
                response = self.conn.getresponse()
                return response.status, response.read()
            except (http.client.RemoteDisconnected, ConnectionError):
                # An idle keep-alive connection closed by the server: once more.
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                if attempt == 2:
                    raise


http_ = Http()
base = f"/v1/queues/{queue}"
batch = 0


def acknowledge(message):
    log(ev="acking", c=name, mid=message["message_id"], t=time.monotonic())
    start = time.monotonic()
    status, data = http_.call("DELETE", f"{base}/messages/{message['receipt_handle']}")
    log(ev="ack", c=name, mid=message["message_id"], ft=message["fencing_token"],
        status=status, a0=start, a1=time.monotonic())
    if status not in (204, 409):
        log(ev="error", c=name, call="DELETE", status=status, body=data[:300].decode())


log(ev="start", c=name, pid=os.getpid())
while not os.path.exists(os.path.join(control, "stop")):
    t0 = time.monotonic()
    status, data = http_.call("GET", f"{base}/receive?max=10&wait=1&visibility_timeout={lease}")
    t1 = time.monotonic()
    if status != 200:
        # Logged, and the test fails on it; going on shows what follows.
        log(ev="error", c=name, call="receive", status=status, body=data[:300].decode())
        time.sleep(0.05)
        continue
    messages = json.loads(data)["messages"]
    if not messages:
        continue
    batch += 1
    for position, m in enumerate(messages):
        group, index = m["body"].split(":")
        log(ev="recv", c=name, b=batch, pos=position, g=group, i=int(index),
            mid=m["message_id"], rc=m["receive_count"], ft=m["fencing_token"],
            seq=m["sequence_number"], grp=m["group"], t0=t0, t1=t1)
    hold = os.path.join(control, "hold")
    mine = os.path.join(control, f"held-by-{name}")
    try:
        os.rename(hold, mine)
    except OSError:
        pass
    else:
        with open(mine) as f:
            mode = f.read().strip()
        if mode not in ("before-any", "after-one", "stall"):
            raise SystemExit(f"unknown hold request {mode!r}")
        if mode == "after-one":
            acknowledge(messages[0])
        log(ev="hold", c=name, mode=mode, b=batch)
        # A stall outlives the lease, then acknowledges what others may have taken.
        time.sleep(float(lease) + 1 if mode == "stall" else 600)
    for m in messages:
        time.sleep(random.uniform(0, 0.003))  # the work
        acknowledge(m)
log(ev="stop", c=name)
'''


# -- consumers ----------------------------------------------------------------------


class Consumers:
    """The consumer processes, their logs, and the kills."""

    def __init__(self, service: Service, queue: str, workdir: Path) -> None:
        self.service = service
        self.queue = queue
        self.workdir = workdir
        self.control = workdir / "control"
        self.control.mkdir()
        self.script = workdir / "consumer.py"
        self.script.write_text(CONSUMER)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.offsets: dict[str, int] = {}
        self.events: list[dict[str, Any]] = []
        self.acked: set[str] = set()  # message ids acknowledged (204)
        self.acking: dict[str, str] = {}  # consumer -> the message it is acknowledging
        self.killed: list[tuple[str, str]] = []  # (consumer, how)
        self.stalled: list[str] = []
        self.started = 0

    def start(self) -> str:
        name = f"c{self.started}"
        self.started += 1
        log = self.workdir / f"{name}.log"
        self.logs[name] = log
        self.offsets[name] = 0
        with (self.workdir / f"{name}.err").open("wb") as err:
            self.procs[name] = subprocess.Popen(
                [sys.executable, str(self.script), str(self.service.port), self.queue,
                 str(LEASE), name, str(log), str(self.control)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            )
        return name

    def read(self) -> None:
        """Takes in the whole lines the consumers have written since the last read."""
        for name, path in self.logs.items():
            data = b""  # nothing yet if the consumer has not started
            with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
                f.seek(self.offsets[name])
                data = f.read()
            if not data:
                continue
            whole = data[: data.rfind(b"\n") + 1]
            self.offsets[name] += len(whole)
            for line in whole.splitlines():
                event = json.loads(line)
                self.events.append(event)
                if event["ev"] == "acking":
                    self.acking[event["c"]] = event["mid"]
                elif event["ev"] == "ack":
                    self.acking.pop(event["c"], None)
                    if event["status"] == 204:
                        self.acked.add(event["mid"])

    def maybe_acked(self) -> set[str]:
        """Messages a killed consumer was acknowledging when it died: deleted or not."""
        killed = {name for name, _ in self.killed}
        return {mid for name, mid in self.acking.items() if name in killed}

    def alive(self) -> list[str]:
        return [name for name, proc in self.procs.items() if proc.poll() is None]

    def check_none_failed(self) -> None:
        for name, proc in self.procs.items():
            code = proc.poll()
            if code not in (None, 0, -signal.SIGKILL):
                err = (self.workdir / f"{name}.err").read_text(errors="replace")
                raise AssertionError(f"consumer {name} exited with {code}:\n{err}")

    def kill(self, name: str, how: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        self.killed.append((name, how))
        self.start()

    def kill_holding(self, mode: str) -> None:
        """Asks the next consumer that receives messages to hold them, then kills
        it (a "stall" it leaves alone)."""
        # Written beside it and renamed into place: a consumer never reads it half made.
        (self.control / "hold.new").write_text(mode)
        (self.control / "hold.new").rename(self.control / "hold")

        def held() -> bool:
            self.check_none_failed()
            return any(self.control.glob("held-by-*"))

        wait_until(held, timeout=20, what="a consumer to take the hold request")
        (mine,) = self.control.glob("held-by-*")
        name = mine.name.removeprefix("held-by-")
        holds = self.holds(name)  # a stalled consumer has held before

        def logged() -> bool:
            self.read()
            return self.holds(name) > holds

        wait_until(logged, timeout=20, what=f"{name} to hold its messages")
        mine.unlink()
        if mode == "stall":
            self.stalled.append(name)
        else:
            self.kill(name, f"holding ({mode})")

    def describe_alive(self) -> str:
        """The consumers still running and the last lines each logged."""
        self.read()
        last: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for event in self.events:
            last[event["c"]].append(event)
        return "; ".join(f"{name}: {last[name][-3:]}" for name in self.alive())

    def holds(self, name: str) -> int:
        return sum(1 for e in self.events if e["ev"] == "hold" and e["c"] == name)

    def stop(self) -> None:
        (self.control / "stop").touch()

    def cleanup(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def send(service: Service, queue: str, indices: range,
         sent: dict[str, tuple[str, int]]) -> None:
    """These indices of every group, index-major in batches of 10 (each group's
    in index order) into `sent`: message id -> (group, index)."""
    entries = [(f"g{g:03d}", i) for i in indices for g in range(GROUPS)]
    with service.client() as client:
        for start in range(0, len(entries), 10):
            chunk = entries[start : start + 10]
            response = client.post(f"/v1/queues/{queue}/messages", json={"messages": [
                {"body": f"{g}:{i}", "group": g, "deduplication_id": f"{g}-{i}"}
                for g, i in chunk
            ]})
            assert response.status_code == 200, response.text
            results = response.json()["results"]
            assert all(r["ok"] for r in results), results
            for (g, i), result in zip(chunk, results, strict=True):
                sent[result["message_id"]] = (g, i)


# -- the checks ---------------------------------------------------------------------


@dataclass
class Claim:
    """What one receive took of one group: consecutive positions of its answer."""

    consumer: str
    batch: int
    group: str
    t0: float  # the receive was sent
    t1: float  # its answer was read
    indices: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


def check_deliveries(
    events: list[dict[str, Any]], sent: dict[str, tuple[str, int]], maybe: set[str]
) -> dict[str, int]:
    """Fails on any violation of at-least-once, exactly-once acknowledgement or
    FIFO order in the consumers' logs; returns the counts."""
    deliveries = [e for e in events if e["ev"] == "recv"]
    acks = [e for e in events if e["ev"] == "ack"]
    problems: list[str] = []

    for d in deliveries:
        if sent.get(d["mid"]) != (d["g"], d["i"]) or d["grp"] != d["g"]:
            problems.append(f"delivery does not match what was sent: {d}")

    # Exactly one successful acknowledgement of every message.
    ok = Counter(a["mid"] for a in acks if a["status"] == 204)
    # (A message whose only acknowledgement a kill cut short was deleted by it:
    # the queue is empty at the end.)
    missing = [mid for mid in sent if ok[mid] == 0 and mid not in maybe]
    twice = [mid for mid, n in ok.items() if n > 1]
    if missing:
        problems.append(f"{len(missing)} messages never acknowledged, e.g. "
                        f"{[sent[m] for m in missing[:5]]}")
    if twice:
        problems.append(f"{len(twice)} messages acknowledged twice, e.g. "
                        f"{[sent[m] for m in twice[:5]]}")
    acked_at = {a["mid"]: a for a in acks if a["status"] == 204}
    # When each message's deletion was asked for: by the acknowledgement that
    # deleted it, else by the one a kill cut short.
    asked = {e["mid"]: e["t"] for e in events if e["ev"] == "acking" and e["mid"] in maybe}
    asked.update((mid, a["a0"]) for mid, a in acked_at.items())

    by_message: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in deliveries:
        by_message[d["mid"]].append(d)
    for mid, ds in by_message.items():
        ds.sort(key=lambda d: d["ft"])
        counts = [d["rc"] for d in ds]
        if counts != sorted(set(counts)):
            problems.append(f"{sent[mid]}: receive counts {counts} by fencing token")
        ack = acked_at.get(mid)
        for d in ds:
            # Deleted is deleted: no claim may begin after the deletion was answered.
            if ack is not None and d["t0"] > ack["a1"]:
                problems.append(f"{sent[mid]} delivered (token {d['ft']}) after it "
                                "was acknowledged")
        if ack is not None:
            # Only the claim that holds a message can delete it: once a later
            # claim of it has been answered, an earlier holder's handle is dead.
            for d in ds:
                if d["ft"] > ack["ft"] and d["t1"] < ack["a0"]:
                    problems.append(f"{sent[mid]}: handle of token {ack['ft']} deleted it "
                                    f"after token {d['ft']} had claimed it")

    # Claims of each group, in claim order.
    claims: dict[tuple[str, int, str], Claim] = {}
    for d in sorted(deliveries, key=lambda d: (d["c"], d["b"], d["pos"])):
        key = (d["c"], d["b"], d["g"])
        claim = claims.setdefault(key, Claim(d["c"], d["b"], d["g"], d["t0"], d["t1"]))
        claim.indices.append(d["i"])
        claim.tokens.append(d["ft"])
    by_group: dict[str, list[Claim]] = defaultdict(list)
    for claim in claims.values():
        by_group[claim.group].append(claim)
    index_of = {mid: i for mid, (_, i) in sent.items()}
    unordered_tokens = 0
    for group, group_claims in sorted(by_group.items()):
        # A group's claims do not overlap in time (one holds the group's row
        # lock while it claims), so their fencing tokens do not interleave; the
        # tokens within one claim's statement need not follow the send order.
        group_claims.sort(key=lambda c: min(c.tokens))
        for before, after in itertools.pairwise(group_claims):
            if max(before.tokens) > min(after.tokens):
                problems.append(f"{group}: fencing tokens of two claims interleave: "
                                f"{before.tokens} and {after.tokens}")
        asked_in_group = {index_of[mid]: t for mid, t in asked.items() if sent[mid][0] == group}
        first_seen: list[int] = []
        for n, claim in enumerate(group_claims):
            unordered_tokens += claim.tokens != sorted(claim.tokens)
            start = claim.indices[0]
            if claim.indices != list(range(start, start + len(claim.indices))):
                problems.append(f"{group}: one claim took {claim.indices}, not consecutive "
                                "messages in send order")
            # It starts at the lowest unacknowledged message: every earlier
            # one's deletion had been asked for before this claim was answered.
            for j in range(start):
                when = asked_in_group.get(j)
                if when is None or when > claim.t1:
                    problems.append(
                        f"{group}: index {start} claimed (tokens {claim.tokens}) while "
                        f"index {j} was not acknowledged"
                        + ("" if when is None else f" (its acknowledgement was sent "
                           f"{when - claim.t1:.3f} s after the claim was answered)"))
                    break
            # Taking again what an earlier claim holds needs that claim's lease
            # to have run out (the consumers never release a message).
            for earlier in group_claims[:n]:
                again = set(earlier.indices) & set(claim.indices)
                if again and claim.t1 < earlier.t0 + LEASE - SLACK:
                    problems.append(
                        f"{group}: indices {sorted(again)} claimed again "
                        f"{claim.t1 - earlier.t0:.3f} s after an earlier claim, within "
                        f"its {LEASE} s lease")
            first_seen.extend(i for i in claim.indices if i not in first_seen)
        if first_seen != sorted(first_seen):
            problems.append(f"{group}: first deliveries in the order {first_seen}")

    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
    return {
        "delivered": len(deliveries),
        "duplicates": len(deliveries) - len(by_message),
        "redelivered messages": sum(1 for ds in by_message.values() if len(ds) > 1),
        "lease lost on ack": sum(1 for a in acks if a["status"] == 409),
        "claims": len(claims),
        "claims with tokens not in send order": unordered_tokens,
    }


def test_fifo_order_and_delivery_survive_consumers_killed_mid_message(
    database_url: str, services: ServiceProcesses, tmp_path: Path
) -> None:
    service = services.start(tmp_path / "svc", database_url=database_url)
    service.wait_healthy()
    queue = "chaos.fifo"
    create_fifo_queue(service, queue, visibility_timeout=LEASE)
    consumers = Consumers(service, queue, tmp_path)
    rng = random.Random(20261201)
    sent: dict[str, tuple[str, int]] = {}
    total = GROUPS * PER_GROUP
    # Half of it waiting (receives take ten of a group), half sent while the
    # consumers run (groups get messages while they are in flight, or empty).
    send(service, queue, range(PER_GROUP // 2), sent)
    failed: list[BaseException] = []

    def send_the_rest() -> None:
        try:
            send(service, queue, range(PER_GROUP // 2, PER_GROUP), sent)
        except BaseException as exc:  # reported by the test, not lost in the thread
            failed.append(exc)

    sender = threading.Thread(target=send_the_rest, daemon=True)
    try:
        for _ in range(CONSUMERS):
            consumers.start()
        sender.start()
        # Kills at points of progress, not of time: most holding messages
        # (before or after acknowledging the first of their batch), the rest
        # wherever the consumer happens to be; and two consumers stalled past
        # their lease, whose groups others take over.
        plan = [(0.05, "before-any"), (0.12, "stall"), (0.20, "after-one"),
                (0.28, "at-random"), (0.36, "before-any"), (0.44, "stall"),
                (0.52, "after-one"), (0.60, "at-random"), (0.68, "before-any"),
                (0.76, "at-random")]
        deadline = time.monotonic() + 60
        for fraction, how in plan:
            def progressed(fraction: float = fraction) -> bool:
                assert not failed, failed
                consumers.read()
                consumers.check_none_failed()
                return len(consumers.acked) >= fraction * total

            wait_until(progressed, timeout=deadline - time.monotonic(),
                       what=f"{fraction:.0%} of the messages acknowledged")
            if how == "at-random":
                consumers.kill(rng.choice(sorted(consumers.alive())), how)
            else:
                consumers.kill_holding(how)

        def drained() -> bool:
            assert not failed, failed
            consumers.read()
            consumers.check_none_failed()
            done = len(consumers.acked | consumers.maybe_acked()) >= total
            return done and count_messages(database_url, queue) == 0

        wait_until(drained, timeout=max(deadline - time.monotonic(), 1),
                   what=f"all {total} messages acknowledged "
                        f"({len(consumers.acked)} so far)")
        sender.join(timeout=10)
        assert len(sent) == total
        consumers.stop()
        try:
            wait_until(lambda: not consumers.alive(), timeout=15, what="the consumers to stop")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {consumers.describe_alive()}") from None
        consumers.check_none_failed()
        consumers.read()
    finally:
        consumers.cleanup()

    with service.client() as client:
        stats = client.get(f"/v1/queues/{queue}").json()["stats"]
        assert stats["visible"] == stats["in_flight"] == stats["delayed"] == 0, stats
        left = client.get(f"/v1/queues/{queue}/receive", params={"max": 10, "wait": 0})
        assert left.json()["messages"] == []
    assert count_messages(database_url, queue) == 0

    counts = check_deliveries(consumers.events, sent, consumers.maybe_acked())
    counts["acknowledged by a consumer killed before it heard so"] = len(
        consumers.maybe_acked() - consumers.acked)
    print(f"\nFIFO chaos: sent {total}, acknowledged {len(consumers.acked)}, "
          + ", ".join(f"{k} {v}" for k, v in counts.items())
          + f", consumers stalled past their lease {len(consumers.stalled)}"
          f", consumers killed {len(consumers.killed)} "
          f"({', '.join(how for _, how in consumers.killed)}), "
          f"consumers started {consumers.started}")
    errors = [e for e in consumers.events if e["ev"] == "error"]
    assert not errors, (
        f"{len(errors)} requests answered with an error, e.g. {errors[:3]}; the service's "
        "last lines:\n" + service.log(40))
    held = [e for e in consumers.events if e["ev"] == "hold"]
    assert len(held) == 7 and len(consumers.stalled) == 2
    assert len(consumers.killed) == len(plan) - 2
    # Each consumer killed holding messages left them to be delivered again.
    assert counts["redelivered messages"] >= len(held), counts
