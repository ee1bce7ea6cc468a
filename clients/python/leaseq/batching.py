"""Send buffering: concurrent `send` calls of one process coalesced into batch
requests, as the AWS SDK's batch manager does for SQS.

A send waits at most `max_wait` seconds for others to the same queue; a batch
goes as soon as it holds `max_batch` messages (or `max_bytes` of bodies). Each
caller still gets its own `Sent` or its own error, raised as `send` raises it.
Opt-in (`AsyncClient.batcher()`): a lone send pays up to `max_wait` of latency.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from leaseq.errors import ApiError, ClientError
from leaseq.models import OutgoingMessage, Sent

MAX_BATCH = 10
"""The service's default batch limit (LEASEQ_MAX_BATCH), and SQS's."""

MAX_BATCH_BYTES = 1024 * 1024
"""Body and attribute bytes one batch carries at most (a larger message goes alone)."""


class BatchClient(Protocol):
    """What a `SendBatcher` needs of its client (`AsyncClient` is one). The client
    module makes batchers (`AsyncClient.batcher()`), so this module names no
    client: the dependency goes one way."""

    async def send_batch(
        self, queue: str, messages: Sequence[OutgoingMessage]
    ) -> list[Sent | ApiError]: ...


class _Pending:
    __slots__ = ("entries", "size", "timer")

    def __init__(self) -> None:
        self.entries: list[tuple[OutgoingMessage, asyncio.Future[Sent]]] = []
        self.size = 0
        self.timer: asyncio.TimerHandle | None = None


class SendBatcher:
    """Buffers sends per queue; `await close()` (or `async with`) sends what is left."""

    def __init__(
        self,
        client: BatchClient,
        *,
        max_wait: float = 0.005,
        max_batch: int = MAX_BATCH,
        max_bytes: int = MAX_BATCH_BYTES,
    ) -> None:
        if max_wait < 0 or max_batch < 1 or max_bytes < 1:
            raise ValueError("max_wait must be >= 0, max_batch and max_bytes >= 1")
        self._client = client
        self._max_wait = max_wait
        self._max_batch = max_batch
        self._max_bytes = max_bytes
        self._pending: dict[str, _Pending] = {}
        self._flights: set[asyncio.Task[None]] = set()
        self.requests = 0
        """Batch requests sent so far (with `sent`, how well sends were coalesced)."""
        self.sent = 0

    @property
    def buffered(self) -> int:
        """Messages waiting for their batch to go."""
        return sum(len(p.entries) for p in self._pending.values())

    async def send(
        self, queue: str, body: str, *, delay: int | None = None,
        attributes: dict[str, str] | None = None, group: str | None = None,
        deduplication_id: str | None = None,
    ) -> Sent:
        """As `AsyncClient.send`, in a batch with the sends around it. On a FIFO
        queue, concurrent sends to one group are ordered only within the batch
        they share: await a send before the next to keep their order."""
        message = OutgoingMessage(
            body, delay=delay, attributes=dict(attributes or {}), group=group,
            deduplication_id=deduplication_id,
        )
        size = len(body.encode()) + sum(
            len(k.encode()) + len(v.encode()) for k, v in message.attributes.items()
        )
        pending = self._pending.get(queue)
        if pending is not None and pending.size + size > self._max_bytes:
            self._flush(queue)
            pending = None
        if pending is None:
            pending = self._pending[queue] = _Pending()
            pending.timer = asyncio.get_running_loop().call_later(
                self._max_wait, self._flush, queue
            )
        sent: asyncio.Future[Sent] = asyncio.get_running_loop().create_future()
        pending.entries.append((message, sent))
        pending.size += size
        if len(pending.entries) >= self._max_batch:
            self._flush(queue)
        return await sent

    def _flush(self, queue: str) -> None:
        pending = self._pending.pop(queue, None)
        if pending is None:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        task = asyncio.get_running_loop().create_task(self._send(queue, pending.entries))
        self._flights.add(task)
        task.add_done_callback(self._flights.discard)

    async def _send(
        self, queue: str, entries: list[tuple[OutgoingMessage, asyncio.Future[Sent]]]
    ) -> None:
        # A caller that stopped waiting (cancelled) while its message was
        # buffered sends nothing, as a plain send cancelled before it went.
        entries = [(message, sent) for message, sent in entries if not sent.done()]
        if not entries:
            return
        self.requests += 1
        try:
            results = await self._client.send_batch(queue, [message for message, _ in entries])
        except asyncio.CancelledError:
            for _, sent in entries:
                sent.cancel()
            raise
        except Exception as exc:  # the whole request failed: every caller hears it
            for _, sent in entries:
                if not sent.done():
                    sent.set_exception(exc)
            return
        for (_, sent), result in zip(entries, results, strict=False):
            if sent.done():
                continue
            if isinstance(result, ApiError):
                sent.set_exception(result)
            else:
                self.sent += 1
                sent.set_result(result)
        for _, sent in entries[len(results):]:
            if not sent.done():
                sent.set_exception(ClientError("the service answered fewer results than sent"))

    async def close(self) -> None:
        """Sends what is buffered now and waits for every batch in flight."""
        for queue in list(self._pending):
            self._flush(queue)
        if self._flights:
            await asyncio.gather(*self._flights, return_exceptions=True)

    async def __aenter__(self) -> SendBatcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
