"""In-flight leases heartbeating through the batch endpoint, as load beside the cycle."""

from __future__ import annotations

import asyncio
import threading
import time

from bench._harness import Http

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
        async def go() -> None:
            http = await Http.open(self.port)
            await http.request("POST", "/v1/queues", {"name": self.queue})
            for start in range(0, self.count, 100):
                batch = [{"body": "held"}] * min(100, self.count - start)
                await http.request(
                    "POST", f"/v1/queues/{self.queue}/messages", {"messages": batch}
                )
            while len(self.handles) < self.count:
                _, got = await http.request(
                    "GET", f"/v1/queues/{self.queue}/receive?max=10&visibility_timeout={LEASE}"
                )
                self.handles += [m["receipt_handle"] for m in got["messages"]]
            http.close()

        asyncio.run(go())

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
