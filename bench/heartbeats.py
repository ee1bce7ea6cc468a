"""In-flight leases heartbeating through the batch endpoint, as load beside the cycle."""

from __future__ import annotations

import asyncio
import threading
import time

from bench._harness import Http, call

LEASE = 30
"""Seconds of each lease; every lease is extended every LEASE/3 seconds."""


class Heartbeats:
    """N in-flight leases, each extended every LEASE/3 seconds by the batch
    heartbeat endpoint (100 handles a request), spread evenly over the period."""

    def __init__(self, port: int, count: int, queue: str = "heartbeats") -> None:
        self.port = port
        self.count = count
        self.queue = queue
        self.handles: list[str] = []
        self.beats = 0
        self.failed = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def prepare(self) -> None:
        self.handles = in_flight(self.port, self.queue, self.count, LEASE)

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._beat()), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    async def _beat(self) -> None:
        http = await Http.open(self.port)
        chunks = [self.handles[i:i + 100] for i in range(0, len(self.handles), 100)]
        interval = (LEASE / 3) / max(len(chunks), 1)
        next_at = time.monotonic()
        while not self._stop.is_set():
            for chunk in chunks:
                if self._stop.is_set():
                    break
                _, result = await http.request(
                    "POST", f"/v1/queues/{self.queue}/messages/visibility",
                    {"entries": [{"receipt_handle": h, "timeout": LEASE} for h in chunk]},
                )
                self.beats += result["succeeded"]
                self.failed += result["failed"]
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        http.close()


def in_flight(port: int, queue: str, leases: int, visibility_timeout: int) -> list[str]:
    """`leases` messages sent to a new queue (100 a request) and received with
    `visibility_timeout`: their receipt handles."""
    call(port, "POST", "/v1/queues", {"name": queue})
    handles: list[str] = []

    async def send() -> None:
        http = await Http.open(port)
        try:
            for start in range(0, leases, 100):
                batch = [{"body": "held"}] * min(100, leases - start)
                status, _ = await http.request("POST", f"/v1/queues/{queue}/messages",
                                               {"messages": batch})
                if status not in (200, 201):
                    raise RuntimeError(f"send: {status}")
        finally:
            http.close()

    async def receive(deadline: float) -> None:
        http = await Http.open(port)
        try:
            while len(handles) < leases:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"received {len(handles)} of {leases} leases")
                _, got = await http.request("GET", f"/v1/queues/{queue}/receive?max=10"
                                                   f"&visibility_timeout={visibility_timeout}")
                handles.extend(m["receipt_handle"] for m in got["messages"])
        finally:
            http.close()

    async def go() -> None:
        await send()
        deadline = time.monotonic() + 120
        await asyncio.gather(*(receive(deadline) for _ in range(4)))

    asyncio.run(go())
    return handles
