"""REST clients of leaseq: `Client` (blocking) and `AsyncClient` (asyncio).

Both build their requests with the same functions (`calls`), so the two can only
differ in how they wait. Every method raises from the `leaseq.errors` tree:
`Unreachable` when the service did not answer, an `ApiError` subclass chosen by
the problem's `code` when it answered with an error.

    with Client("http://127.0.0.1:8000") as client:
        client.create_queue("emails", visibility_timeout=30)
        client.send("emails", '{"to": "ada@example.com"}')
        for message in client.receive("emails", max=10, wait=20):
            ...
            client.delete("emails", message.receipt_handle)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import httpx

from leaseq.batching import SendBatcher
from leaseq.calls import Call, calls, read_answer
from leaseq.errors import ApiError, Unreachable
from leaseq.models import (
    Lease,
    Message,
    OutgoingMessage,
    PeekPage,
    Queue,
    QueuePage,
    RedriveTask,
    Released,
    Sent,
    Settled,
)

DEFAULT_URL = "http://127.0.0.1:8000"

T = TypeVar("T")


def default_url() -> str:
    """`LEASEQ_URL`, else http://127.0.0.1:8000."""
    return os.environ.get("LEASEQ_URL") or DEFAULT_URL


def auth_headers(api_key: str | None, headers: dict[str, str] | None) -> dict[str, str]:
    """`headers` with the API key (`api_key`, else `LEASEQ_API_KEY`) as a bearer token."""
    key = api_key or os.environ.get("LEASEQ_API_KEY")
    out = dict(headers or {})
    if key:
        out.setdefault("Authorization", f"Bearer {key}")
    return out


# -- the clients --------------------------------------------------------------------


class _Base:
    def __init__(self, url: str | None, timeout: float) -> None:
        self.url = (url or default_url()).rstrip("/")
        self.timeout = timeout


class Client(_Base):
    """A blocking client. Thread-safe: one instance can serve several threads."""

    def __init__(
        self,
        url: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        headers: dict[str, str] | None = None,
        api_key: str | None = None,
    ) -> None:
        """`api_key`: `<key id>.<secret>` (default: `LEASEQ_API_KEY`, if set)."""
        super().__init__(url, timeout)
        self._http = httpx.Client(
            base_url=self.url, timeout=timeout, transport=transport,
            headers=auth_headers(api_key, headers),
        )

    def _run(self, call: Call[T], request_timeout: float | None = None) -> T:
        try:
            response = self._http.request(
                call.method, call.path, params=call.params, json=call.json,
                timeout=request_timeout or call.timeout or self.timeout,
            )
        except httpx.TransportError as exc:
            raise Unreachable(f"{call.method} {call.path}: {exc!r}") from exc
        return read_answer(call, response)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def create_queue(self, name: str, **attributes: Any) -> Queue:
        """Create a queue (or return the existing one with the same attributes):
        `visibility_timeout=30`, `retry_backoff={"initial": 5, "max": 300}`, ...
        A FIFO queue (its name ends in ".fifo"): `fifo=True`, and optionally
        `content_based_deduplication=True`, `deduplication_scope="message_group"`,
        `fifo_throughput_limit="per_message_group_id"`."""
        return self._run(calls.create_queue(name, attributes))

    def get_queue(self, name: str) -> Queue:
        """Attributes and live `stats` of a queue."""
        return self._run(calls.get_queue(name))

    def list_queues(
        self, *, prefix: str | None = None, after: str | None = None, limit: int | None = None
    ) -> QueuePage:
        """Queues by name, a page at a time (`next_after`)."""
        return self._run(calls.list_queues(prefix, after, limit))

    def update_queue(self, name: str, **changes: Any) -> Queue:
        """Change attributes; `None` removes a policy (`retry_backoff=None`). A FIFO
        queue's `content_based_deduplication`, `deduplication_scope` and
        `fifo_throughput_limit` can change; `fifo` cannot."""
        return self._run(calls.update_queue(name, changes))

    def peek(
        self, queue: str, *, state: str | None = None, limit: int | None = None,
        after: str | None = None, body_chars: int | None = None,
    ) -> PeekPage:
        """Messages without claiming them (operators): `visible`, `in_flight`, `delayed`."""
        return self._run(calls.peek(queue, state, limit, after, body_chars))

    def dead_letter_sources(self, queue: str) -> list[str]:
        """The queues whose redrive policy names this one."""
        return self._run(calls.dead_letter_sources(queue))

    def start_redrive(
        self, queue: str, *, destination: str | None = None, max_per_second: int | None = None
    ) -> RedriveTask:
        """Move a dead-letter queue's messages back (to their sources, or `destination`)."""
        return self._run(calls.start_redrive(queue, destination, max_per_second))

    def list_redrives(self, queue: str) -> list[RedriveTask]:
        return self._run(calls.list_redrives(queue))

    def get_redrive(self, task_id: str) -> RedriveTask:
        return self._run(calls.get_redrive(task_id))

    def cancel_redrive(self, task_id: str) -> RedriveTask:
        return self._run(calls.cancel_redrive(task_id))

    def overview(self, prefix: str | None = None) -> list[dict[str, Any]]:
        """Every queue the key may read, as the dashboard shows it: visible, in
        flight, delayed, oldest age, its messages in dead-letter queues
        (`dead_letter_sources` of a dead-letter queue), and sent and acknowledged
        per second (`leaseq top`). Needs `read` on the queues."""
        return self._run(calls.overview(prefix))

    def delete_queue(self, name: str) -> None:
        self._run(calls.delete_queue(name))

    def purge(self, name: str) -> int:
        return self._run(calls.purge(name))

    def send(
        self, queue: str, body: str, *, delay: int | None = None,
        attributes: dict[str, str] | None = None, group: str | None = None,
        deduplication_id: str | None = None,
    ) -> Sent:
        """Send one message (answered once it is committed). FIFO queues: `group` is
        required, `deduplication_id` too unless the queue has content-based
        deduplication, and `delay` is refused; the `Sent` has a `sequence_number`.
        Standard queues: `group` names the message's tenant (fair queues)."""
        return self._run(calls.send(queue, body, delay, attributes, group, deduplication_id))

    def send_batch(
        self, queue: str, messages: Iterable[OutgoingMessage | str]
    ) -> list[Sent | ApiError]:
        """One result per entry, in order: a `Sent`, or the entry's error (not raised).
        On a FIFO queue give `OutgoingMessage`s with their `group` (and
        `deduplication_id`); one group's entries keep their order."""
        return self._run(calls.send_batch(queue, messages))

    def receive(
        self, queue: str, *, max: int = 1, visibility_timeout: int | None = None,
        wait: int | None = None, attempt_id: str | None = None,
    ) -> list[Message]:
        """Claim up to `max` messages, waiting up to `wait` seconds for the first.
        The lease starts when the service claims: measure it from before this call.
        FIFO queues: a receive retried with the same `attempt_id` within five
        minutes answers the same messages while in flight (standard queues ignore it)."""
        return self._run(
            calls.receive(queue, max, visibility_timeout, wait, self.timeout, attempt_id)
        )

    def receive_settling(
        self, queue: str, *, delete: Sequence[str] = (),
        extend: Sequence[tuple[str, int]] = (), max: int = 1,
        visibility_timeout: int | None = None, wait: int | None = None,
        attempt_id: str | None = None,
    ) -> Settled:
        """Acknowledge `delete` and extend `extend` ((handle, timeout) pairs), then
        receive as `receive` does: one request. Each entry has its own result."""
        return self._run(calls.receive_settling(
            queue, delete, extend, max, visibility_timeout, wait, self.timeout, attempt_id
        ))

    def extend(self, queue: str, handle: str, timeout: int, *,
               request_timeout: float | None = None) -> Lease:
        """Heartbeat: the lease ends `timeout` seconds from now. `LeaseLost` when gone."""
        return self._run(calls.extend(queue, handle, timeout), request_timeout)

    def release(self, queue: str, handle: str, delay: int | None = None) -> Released:
        """A failed attempt: give the message back (`POST .../release`), visible
        again after `delay` seconds (0-43200); without one, after the queue's retry
        ladder's delay for its receive count, or at once when the queue has none.
        The answer says which delay was applied. `LeaseLost` when the claim is gone."""
        return self._run(calls.release(queue, handle, delay))

    def delete(self, queue: str, handle: str) -> None:
        """Acknowledge: deletes the message while this handle holds it, else `LeaseLost`."""
        self._run(calls.delete(queue, handle))

    def checkpoint(
        self, queue: str, handle: str, cursor: Any, *, timeout: int | None = None
    ) -> Lease:
        """Record a cursor (returned by the next receive) and renew the lease: by
        `timeout` seconds from now (0-43200), else by the queue's visibility_timeout."""
        return self._run(calls.checkpoint(queue, handle, cursor, timeout))

    def extend_batch(
        self, queue: str, entries: Sequence[tuple[str, int]]
    ) -> list[Lease | ApiError]:
        """Many (handle, timeout) at once; one result per entry, errors not raised."""
        return self._run(calls.extend_batch(queue, entries))

    def delete_batch(self, queue: str, handles: Sequence[str]) -> list[ApiError | None]:
        """Acknowledge many handles at once; `None` per success, errors not raised."""
        return self._run(calls.delete_batch(queue, handles))


class AsyncClient(_Base):
    """The asyncio client: the same methods as `Client`, awaited."""

    def __init__(
        self,
        url: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: dict[str, str] | None = None,
        limits: httpx.Limits | None = None,
        api_key: str | None = None,
    ) -> None:
        """`api_key`: `<key id>.<secret>` (default: `LEASEQ_API_KEY`, if set)."""
        super().__init__(url, timeout)
        self._http = httpx.AsyncClient(
            base_url=self.url, timeout=timeout, transport=transport,
            headers=auth_headers(api_key, headers),
            limits=limits or httpx.Limits(),
        )

    async def _run(self, call: Call[T], request_timeout: float | None = None) -> T:
        try:
            response = await self._http.request(
                call.method, call.path, params=call.params, json=call.json,
                timeout=request_timeout or call.timeout or self.timeout,
            )
        except httpx.TransportError as exc:
            raise Unreachable(f"{call.method} {call.path}: {exc!r}") from exc
        return read_answer(call, response)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def create_queue(self, name: str, **attributes: Any) -> Queue:
        """Create a queue (or return the existing one with the same attributes):
        `visibility_timeout=30`, `retry_backoff={"initial": 5, "max": 300}`, ...
        A FIFO queue (its name ends in ".fifo"): `fifo=True`, and optionally
        `content_based_deduplication=True`, `deduplication_scope="message_group"`,
        `fifo_throughput_limit="per_message_group_id"`."""
        return await self._run(calls.create_queue(name, attributes))

    async def get_queue(self, name: str) -> Queue:
        """Attributes and live `stats` of a queue."""
        return await self._run(calls.get_queue(name))

    async def list_queues(
        self, *, prefix: str | None = None, after: str | None = None, limit: int | None = None
    ) -> QueuePage:
        """Queues by name, a page at a time (`next_after`)."""
        return await self._run(calls.list_queues(prefix, after, limit))

    async def update_queue(self, name: str, **changes: Any) -> Queue:
        """Change attributes; `None` removes a policy (`retry_backoff=None`). A FIFO
        queue's `content_based_deduplication`, `deduplication_scope` and
        `fifo_throughput_limit` can change; `fifo` cannot."""
        return await self._run(calls.update_queue(name, changes))

    async def peek(
        self, queue: str, *, state: str | None = None, limit: int | None = None,
        after: str | None = None, body_chars: int | None = None,
    ) -> PeekPage:
        """Messages without claiming them (operators): `visible`, `in_flight`, `delayed`."""
        return await self._run(calls.peek(queue, state, limit, after, body_chars))

    async def dead_letter_sources(self, queue: str) -> list[str]:
        """The queues whose redrive policy names this one."""
        return await self._run(calls.dead_letter_sources(queue))

    async def start_redrive(
        self, queue: str, *, destination: str | None = None, max_per_second: int | None = None
    ) -> RedriveTask:
        """Move a dead-letter queue's messages back (to their sources, or `destination`)."""
        return await self._run(calls.start_redrive(queue, destination, max_per_second))

    async def list_redrives(self, queue: str) -> list[RedriveTask]:
        return await self._run(calls.list_redrives(queue))

    async def get_redrive(self, task_id: str) -> RedriveTask:
        return await self._run(calls.get_redrive(task_id))

    async def cancel_redrive(self, task_id: str) -> RedriveTask:
        return await self._run(calls.cancel_redrive(task_id))

    async def overview(self, prefix: str | None = None) -> list[dict[str, Any]]:
        """As Client.overview."""
        return await self._run(calls.overview(prefix))

    async def delete_queue(self, name: str) -> None:
        await self._run(calls.delete_queue(name))

    async def purge(self, name: str) -> int:
        return await self._run(calls.purge(name))

    async def send(
        self, queue: str, body: str, *, delay: int | None = None,
        attributes: dict[str, str] | None = None, group: str | None = None,
        deduplication_id: str | None = None,
    ) -> Sent:
        """Send one message (answered once it is committed). FIFO queues: `group` is
        required, `deduplication_id` too unless the queue has content-based
        deduplication, and `delay` is refused; the `Sent` has a `sequence_number`.
        Standard queues: `group` names the message's tenant (fair queues)."""
        return await self._run(calls.send(queue, body, delay, attributes, group, deduplication_id))

    async def send_batch(
        self, queue: str, messages: Iterable[OutgoingMessage | str]
    ) -> list[Sent | ApiError]:
        """One result per entry, in order: a `Sent`, or the entry's error (not raised).
        On a FIFO queue give `OutgoingMessage`s with their `group` (and
        `deduplication_id`); one group's entries keep their order."""
        return await self._run(calls.send_batch(queue, messages))

    def batcher(
        self, *, max_wait: float = 0.005, max_batch: int = 10
    ) -> SendBatcher:
        """Send buffering (opt-in): `await batcher.send(queue, body)` is coalesced
        with the sends around it into batch requests, each waiting at most
        `max_wait` seconds. Close it (`async with`) to send what is left."""
        return SendBatcher(self, max_wait=max_wait, max_batch=max_batch)

    async def receive(
        self, queue: str, *, max: int = 1, visibility_timeout: int | None = None,
        wait: int | None = None, attempt_id: str | None = None,
    ) -> list[Message]:
        """Claim up to `max` messages, waiting up to `wait` seconds for the first.
        The lease starts when the service claims: measure it from before this call.
        FIFO queues: a receive retried with the same `attempt_id` within five
        minutes answers the same messages while in flight (standard queues ignore it)."""
        return await self._run(
            calls.receive(queue, max, visibility_timeout, wait, self.timeout, attempt_id)
        )

    async def receive_settling(
        self, queue: str, *, delete: Sequence[str] = (),
        extend: Sequence[tuple[str, int]] = (), max: int = 1,
        visibility_timeout: int | None = None, wait: int | None = None,
        attempt_id: str | None = None,
    ) -> Settled:
        """Acknowledge `delete` and extend `extend` ((handle, timeout) pairs), then
        receive as `receive` does: one request. Each entry has its own result."""
        return await self._run(calls.receive_settling(
            queue, delete, extend, max, visibility_timeout, wait, self.timeout, attempt_id
        ))

    async def extend(
        self,
        queue: str,
        handle: str,
        timeout: int,  # noqa: ASYNC109 - the lease's new length, the API's own name
        *,
        request_timeout: float | None = None,
    ) -> Lease:
        """Heartbeat: the lease ends `timeout` seconds from now. `LeaseLost` when gone."""
        return await self._run(calls.extend(queue, handle, timeout), request_timeout)

    async def release(self, queue: str, handle: str, delay: int | None = None) -> Released:
        """A failed attempt: give the message back (`POST .../release`), visible
        again after `delay` seconds (0-43200); without one, after the queue's retry
        ladder's delay for its receive count, or at once when the queue has none.
        The answer says which delay was applied. `LeaseLost` when the claim is gone."""
        return await self._run(calls.release(queue, handle, delay))

    async def delete(self, queue: str, handle: str) -> None:
        """Acknowledge: deletes the message while this handle holds it, else `LeaseLost`."""
        await self._run(calls.delete(queue, handle))

    async def checkpoint(
        self,
        queue: str,
        handle: str,
        cursor: Any,
        *,
        timeout: int | None = None,  # noqa: ASYNC109 - the lease's new length, the API's own name
    ) -> Lease:
        """Record a cursor (returned by the next receive) and renew the lease: by
        `timeout` seconds from now (0-43200), else by the queue's visibility_timeout."""
        return await self._run(calls.checkpoint(queue, handle, cursor, timeout))

    async def extend_batch(
        self, queue: str, entries: Sequence[tuple[str, int]]
    ) -> list[Lease | ApiError]:
        """Many (handle, timeout) at once; one result per entry, errors not raised."""
        return await self._run(calls.extend_batch(queue, entries))

    async def delete_batch(self, queue: str, handles: Sequence[str]) -> list[ApiError | None]:
        """Acknowledge many handles at once; `None` per success, errors not raised."""
        return await self._run(calls.delete_batch(queue, handles))
