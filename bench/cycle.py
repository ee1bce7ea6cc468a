"""The message cycle (send -> claim -> conditional delete), two ways, under load.

- raw: the cycle written directly in SQL with asyncpg on leaseq's own table:
  no HTTP, no service, leaseq's schema.
- minimal: the same in SQL on the minimal queue table (bench/minimal.py): the
  database's floor for a queue with leases, and so what leaseq's schema costs.
- rest: the same cycle through leaseq's REST API.
- fifo: the REST cycle on a FIFO queue: each message in one of `groups`
  message groups (each client sends to the next groups in turn), with a
  deduplication id of its own; one batch of a group is in flight at a time.
- worker: the cycle as the workers run it, each acknowledgement riding on the
  next receive (`POST .../receive` with `delete`): two requests a message.
- sqs: the same cycle through the SQS door's JSON protocol, as boto3 sends it
  (SendMessageBatch, ReceiveMessage, DeleteMessageBatch; its headers, an
  access key the open service takes as the sender), from a plain client.
- floor: the service's cheapest route (GET /healthz, no database) at the same
  concurrency: the most requests/s its HTTP stack serves here, and so a ceiling
  for a cycle that takes three requests a message.

Load comes from several generator processes (each runs its share of the
clients), so that one Python process does not measure itself; each reports
the CPU it used, printed beside the figures.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from bench import minimal
from bench._harness import Http, percentile

RAW_SEND = """
INSERT INTO leaseq.messages (queue_id, body, visible_at)
SELECT $1, b, statement_timestamp() FROM unnest($2::text[]) AS b
RETURNING id
"""
RAW_CLAIM = """
UPDATE leaseq.messages
SET visible_at = statement_timestamp() + interval '600 seconds',
    claim_token = gen_random_uuid(), fencing_token = nextval('leaseq.fencing_tokens'),
    receive_count = receive_count + 1, leased = true
WHERE id = ANY(ARRAY(
    SELECT id FROM leaseq.messages
    WHERE queue_id = $1 AND visible_at <= statement_timestamp()
    ORDER BY visible_at LIMIT $2
    FOR UPDATE SKIP LOCKED))
RETURNING id, claim_token
"""
RAW_DELETE = """
DELETE FROM leaseq.messages AS m USING unnest($1::bigint[], $2::uuid[]) AS h(id, token)
WHERE m.id = h.id AND m.claim_token = h.token
RETURNING m.id
"""


@dataclass
class Share:
    """What one generator process did."""

    sent: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    claimed: list[str] = field(default_factory=list)
    claim_seconds: list[float] = field(default_factory=list)
    delete_seconds: list[float] = field(default_factory=list)
    empty_receives: int = 0
    requests: int = 0
    cpu_seconds: float = 0.0


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# The statements of each SQL cycle: send, claim, delete.
STATEMENTS = {
    "raw": (RAW_SEND, RAW_CLAIM, RAW_DELETE),
    "minimal": (minimal.SEND, minimal.CLAIM, minimal.DELETE),
}


async def _raw_client(dsn: str, queue_id: int, batch: int, until: float, share: Share,
                      kind: str = "raw") -> None:
    send, claim, delete = STATEMENTS[kind]
    conn = await asyncpg.connect(dsn)
    try:
        while time.monotonic() < until:
            bodies = [uuid.uuid4().hex for _ in range(batch)]
            ids = await conn.fetch(send, queue_id, bodies)
            share.sent.extend(str(r["id"]) for r in ids)
            start = time.perf_counter()
            claimed = await conn.fetch(claim, queue_id, batch)
            share.claim_seconds.append(time.perf_counter() - start)
            share.claimed.extend(str(r["id"]) for r in claimed)
            if not claimed:
                continue
            start = time.perf_counter()
            deleted = await conn.fetch(
                delete, [r["id"] for r in claimed], [r["claim_token"] for r in claimed]
            )
            share.delete_seconds.append(time.perf_counter() - start)
            share.deleted.extend(str(r["id"]) for r in deleted)
    finally:
        await conn.close()


class _Groups:
    """The entries a client sends: a standard queue's, or a FIFO queue's, each in
    the next of `groups` groups (from a random one on), with a unique
    deduplication id."""

    def __init__(self, groups: int | None) -> None:
        self.groups = groups
        self.next = random.randrange(groups) if groups else 0

    def entry(self) -> dict[str, str]:
        if not self.groups:
            return {"body": "x"}
        group, self.next = self.next, (self.next + 1) % self.groups
        return {"body": "x", "group": f"g{group}", "deduplication_id": uuid.uuid4().hex}

    def entries(self, batch: int) -> list[dict[str, str]]:
        if not self.groups:
            return [{"body": "x"}] * batch
        return [self.entry() for _ in range(batch)]


async def acknowledge(http: Http, base: str, messages: list[dict[str, Any]],
                      batch: int) -> list[str]:
    """Deletes received messages as the clients of `batch` do (one DELETE when
    they receive one message at a time, the batch endpoint otherwise); the ids
    of those deleted."""
    if batch == 1:
        (message,) = messages
        status, _ = await http.request("DELETE", f"{base}/messages/{message['receipt_handle']}")
        return [message["message_id"]] if status == 204 else []
    _, result = await http.request("POST", f"{base}/messages/delete", {
        "receipt_handles": [m["receipt_handle"] for m in messages]})
    return [m["message_id"] for m, r in zip(messages, result["results"], strict=True) if r["ok"]]


async def _rest_client(port: int, queue: str, batch: int, until: float, share: Share,
                       headers: dict[str, str] | None = None,
                       groups: int | None = None) -> None:
    http = await Http.open(port, headers)
    base = f"/v1/queues/{queue}"
    entries = _Groups(groups)
    try:
        while time.monotonic() < until:
            if batch == 1:
                _, sent = await http.request("POST", f"{base}/messages", entries.entry())
                share.sent.append(sent["message_id"])
            else:
                _, sent = await http.request(
                    "POST", f"{base}/messages", {"messages": entries.entries(batch)}
                )
                share.sent.extend(r["message_id"] for r in sent["results"])
            start = time.perf_counter()
            _, got = await http.request(
                "GET", f"{base}/receive?max={batch}&visibility_timeout=600"
            )
            share.claim_seconds.append(time.perf_counter() - start)
            messages = got["messages"]
            share.claimed.extend(m["message_id"] for m in messages)
            if not messages:
                share.empty_receives += 1
                continue
            start = time.perf_counter()
            share.deleted.extend(await acknowledge(http, base, messages, batch))
            share.delete_seconds.append(time.perf_counter() - start)
    finally:
        http.close()


async def _worker_client(port: int, queue: str, batch: int, until: float, share: Share,
                         headers: dict[str, str] | None = None) -> None:
    http = await Http.open(port, headers)
    base = f"/v1/queues/{queue}"
    held: list[dict[str, Any]] = []  # claimed last round, acknowledged by the next receive
    try:
        while True:
            last = time.monotonic() >= until
            if not last:
                _, sent = await http.request(
                    "POST", f"{base}/messages", {"messages": [{"body": "x"}] * batch}
                )
                share.sent.extend(r["message_id"] for r in sent["results"])
            start = time.perf_counter()
            _, got = await http.request("POST", f"{base}/receive", {
                "max": batch, "visibility_timeout": 600, "wait": 0,
                "delete": [m["receipt_handle"] for m in held],
            })
            share.claim_seconds.append(time.perf_counter() - start)
            share.deleted.extend(
                m["message_id"] for m, r in zip(held, got["deleted"], strict=True) if r["ok"]
            )
            held = got["messages"]
            share.claimed.extend(m["message_id"] for m in held)
            if last:  # what this last receive took stays in the queue, leased: not lost
                return
    finally:
        http.close()


SQS_ACCESS_KEY = "AKIDBENCH"


def _sqs_headers(action: str) -> str:
    """The headers boto3 sends with an SQS JSON request (the signature is not
    checked while no key exists; the access key names the sender)."""
    now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return (
        f"X-Amz-Target: AmazonSQS.{action}\r\n"
        f"X-Amz-Date: {now}\r\n"
        "User-Agent: Boto3/1.34 md/Botocore#1.34 ua/2.0 os/linux lang/python#3.11\r\n"
        f"amz-sdk-invocation-id: {uuid.uuid4()}\r\n"
        "amz-sdk-request: attempt=1\r\n"
        f"Authorization: AWS4-HMAC-SHA256 Credential={SQS_ACCESS_KEY}/{now[:8]}/us-east-1/"
        "sqs/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-target, "
        f"Signature={'0' * 64}\r\n"
    )


async def _sqs(http: Http, action: str, body: dict[str, Any]) -> Any:
    status, data = await http.raw("POST", "/", body, content_type="application/x-amz-json-1.0",
                                  headers=_sqs_headers(action))
    if status != 200:
        raise RuntimeError(f"{action}: {status} {data[:200]!r}")
    return json.loads(data)


async def _sqs_client(port: int, queue_url: str, batch: int, until: float,
                      share: Share) -> None:
    http = await Http.open(port)
    try:
        while time.monotonic() < until:
            sent = await _sqs(http, "SendMessageBatch", {
                "QueueUrl": queue_url,
                "Entries": [{"Id": str(i), "MessageBody": "x"} for i in range(batch)],
            })
            share.sent.extend(r["MessageId"] for r in sent["Successful"])
            start = time.perf_counter()
            got = await _sqs(http, "ReceiveMessage", {
                "QueueUrl": queue_url, "MaxNumberOfMessages": batch, "VisibilityTimeout": 600,
            })
            share.claim_seconds.append(time.perf_counter() - start)
            messages = got.get("Messages", [])
            share.claimed.extend(m["MessageId"] for m in messages)
            if not messages:
                continue
            start = time.perf_counter()
            deleted = await _sqs(http, "DeleteMessageBatch", {
                "QueueUrl": queue_url,
                "Entries": [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                            for i, m in enumerate(messages)],
            })
            by_id = {str(i): m["MessageId"] for i, m in enumerate(messages)}
            share.deleted.extend(by_id[r["Id"]] for r in deleted["Successful"])
            share.delete_seconds.append(time.perf_counter() - start)
    finally:
        http.close()


def sqs_queue_url(port: int, name: str) -> str:
    async def go() -> str:
        http = await Http.open(port)
        try:
            url: str = (await _sqs(http, "GetQueueUrl", {"QueueName": name}))["QueueUrl"]
            return url
        finally:
            http.close()

    return asyncio.run(go())


async def _floor_client(port: int, until: float, share: Share) -> None:
    http = await Http.open(port)
    try:
        while time.monotonic() < until:
            status, _ = await http.raw("GET", "/healthz")
            share.requests += status == 200
    finally:
        http.close()


def _generator(kind: str, target: Any, queue: Any, clients: int, batch: int,
               seconds: float, headers: dict[str, str] | None = None,
               groups: int | None = None) -> Share:
    """One generator process: `clients` concurrent clients for `seconds`."""
    share = Share()
    cpu = _cpu()

    async def main() -> None:
        until = time.monotonic() + seconds
        if kind in STATEMENTS:
            runs = [_raw_client(target, queue, batch, until, share, kind)
                    for _ in range(clients)]
        elif kind == "floor":
            runs = [_floor_client(target, until, share) for _ in range(clients)]
        elif kind == "sqs":
            runs = [_sqs_client(target, queue, batch, until, share) for _ in range(clients)]
        elif kind == "worker":
            runs = [_worker_client(target, queue, batch, until, share, headers)
                    for _ in range(clients)]
        elif kind == "fifo":
            runs = [_rest_client(target, queue, batch, until, share, headers, groups)
                    for _ in range(clients)]
        else:
            runs = [_rest_client(target, queue, batch, until, share, headers)
                    for _ in range(clients)]
        await asyncio.gather(*runs)

    asyncio.run(main())
    share.cpu_seconds = _cpu() - cpu
    return share


@dataclass
class Result:
    kind: str
    clients: int
    batch: int
    seconds: float
    messages_per_second: float
    lost: int
    duplicated: int
    claim_p99_ms: float
    delete_p99_ms: float
    generator_cpu_percent: float
    service_cpu_percent: float | None = None
    database_cpu_percent: float | None = None
    wal_bytes_per_message: float | None = None
    receives: int = 0
    empty_receives: int = 0  # counted by the rest and fifo clients
    claimed: int = 0  # messages the receives took, redeliveries counted
    groups: int | None = None  # the fifo cycle's message groups

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def run(kind: str, target: Any, queue: Any, *, clients: int, batch: int, seconds: float,
        processes: int, remaining: Any, service_cpu: Any = None, database_cpu: Any = None,
        headers: dict[str, str] | None = None, groups: int | None = None,
        wal_bytes: Any = None) -> Result:
    """Runs the cycle with `clients` spread over `processes` generator processes.

    `remaining()` returns the ids still in the queue afterwards (the cycle's
    last sends may be unclaimed: not lost); `service_cpu()` the service's CPU
    seconds so far, if there is a service, and `database_cpu()` PostgreSQL's;
    `headers` go with every REST request (an API key's Authorization);
    `groups` is the fifo cycle's number of message groups; `wal_bytes()` the
    WAL PostgreSQL has written so far.
    """
    processes = max(1, min(processes, clients))
    per = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    cpu_before = service_cpu() if service_cpu else None
    database_before = database_cpu() if database_cpu else None
    wal_before = wal_bytes() if wal_bytes else None
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=processes) as pool:
        futures = [pool.submit(_generator, kind, target, queue, n, batch, seconds, headers,
                               groups)
                   for n in per]
        shares = [f.result() for f in futures]
    wall = time.monotonic() - start
    sent = [m for s in shares for m in s.sent]
    deleted = [m for s in shares for m in s.deleted]
    claimed = [m for s in shares for m in s.claimed]
    left = set(remaining())
    lost = len(set(sent) - set(deleted) - left)
    duplicated = len(claimed) - len(set(claimed))
    service_percent = None
    if service_cpu and cpu_before is not None:
        service_percent = 100 * (service_cpu() - cpu_before) / wall
    database_percent = None
    if database_cpu and database_before is not None:
        database_percent = 100 * (database_cpu() - database_before) / wall
    wal_per_message = None
    if wal_bytes and wal_before is not None:
        wal_per_message = (wal_bytes() - wal_before) / max(len(set(deleted)), 1)
    return Result(
        kind=kind, clients=clients, batch=batch, seconds=seconds,
        messages_per_second=len(set(deleted)) / seconds,
        lost=lost, duplicated=duplicated,
        claim_p99_ms=percentile([t for s in shares for t in s.claim_seconds], 99) * 1000,
        delete_p99_ms=percentile([t for s in shares for t in s.delete_seconds], 99) * 1000,
        generator_cpu_percent=100 * sum(s.cpu_seconds for s in shares) / wall,
        service_cpu_percent=service_percent,
        database_cpu_percent=database_percent,
        wal_bytes_per_message=wal_per_message,
        receives=sum(len(s.claim_seconds) for s in shares),
        empty_receives=sum(s.empty_receives for s in shares),
        claimed=len(claimed),
        groups=groups,
    )


def floor(port: int, *, clients: int, seconds: float, processes: int,
          service_cpu: Any) -> dict[str, float]:
    """Requests/s of GET /healthz with `clients` keep-alive clients."""
    processes = max(1, min(processes, clients))
    per = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    cpu_before = service_cpu()
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=processes) as pool:
        futures = [pool.submit(_generator, "floor", port, None, n, 1, seconds) for n in per]
        shares = [f.result() for f in futures]
    wall = time.monotonic() - start
    return {
        "clients": clients,
        "requests_per_second": sum(s.requests for s in shares) / seconds,
        "generator_cpu_percent": 100 * sum(s.cpu_seconds for s in shares) / wall,
        "service_cpu_percent": 100 * (service_cpu() - cpu_before) / wall,
    }
