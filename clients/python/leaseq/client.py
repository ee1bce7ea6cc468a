"""REST clients of leaseq: `Client` (blocking) and `AsyncClient` (asyncio).

Both build their requests with the same functions (`_calls`), so the two can only
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from leaseq.batching import SendBatcher
from leaseq.errors import ApiError, Unreachable, api_error
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
POLL_MARGIN = 10.0
"""Seconds a long poll's read timeout exceeds its `wait`."""

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


# -- requests and how to read their answers ------------------------------------------


@dataclass(frozen=True)
class _Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    json: Any = None
    timeout: float | None = None  # None: the client's own


def _seg(value: str) -> str:
    return quote(value, safe="")


def _q(queue: str) -> str:
    return f"/v1/queues/{_seg(queue)}"


def _h(queue: str, handle: str) -> str:
    return f"{_q(queue)}/messages/{_seg(handle)}"


def _json(response: httpx.Response) -> Any:
    return response.json()


def _none(_response: httpx.Response) -> None:
    return None


def _entry_error(result: dict[str, Any]) -> ApiError:
    return api_error(
        int(result.get("status", 0)), str(result.get("code", "")), str(result.get("detail", ""))
    )


def _batch(parse: Callable[[dict[str, Any]], T]) -> Callable[[httpx.Response], list[T | ApiError]]:
    def read(response: httpx.Response) -> list[T | ApiError]:
        return [
            parse(r) if r.get("ok") else _entry_error(r) for r in response.json()["results"]
        ]

    return read


def _messages(response: httpx.Response) -> list[Message]:
    return [Message.from_json(m) for m in response.json()["messages"]]


def _settled(response: httpx.Response) -> Settled:
    data = response.json()
    return Settled(
        messages=[Message.from_json(m) for m in data["messages"]],
        deleted=[None if r.get("ok") else _entry_error(r) for r in data["deleted"]],
        extended=[Lease.from_json(r) if r.get("ok") else _entry_error(r)
                  for r in data["extended"]],
    )


def _lease(response: httpx.Response) -> Lease:
    return Lease.from_json(response.json())


def _released(response: httpx.Response) -> Released:
    return Released.from_json(response.json())


def _queue(response: httpx.Response) -> Queue:
    return Queue.from_json(response.json())


def _task(response: httpx.Response) -> RedriveTask:
    return RedriveTask.from_json(response.json())


class _calls:
    @staticmethod
    def create_queue(name: str, attributes: dict[str, Any]) -> _Call[Queue]:
        return _Call("POST", "/v1/queues", _queue, json={"name": name, **attributes})

    @staticmethod
    def get_queue(name: str) -> _Call[Queue]:
        return _Call("GET", _q(name), _queue)

    @staticmethod
    def list_queues(prefix: str | None, after: str | None, limit: int | None) -> _Call[QueuePage]:
        params = {k: v for k, v in (("prefix", prefix), ("after", after), ("limit", limit))
                  if v is not None}
        return _Call("GET", "/v1/queues", lambda r: QueuePage.from_json(r.json()), params=params)

    @staticmethod
    def update_queue(name: str, changes: dict[str, Any]) -> _Call[Queue]:
        return _Call("PATCH", _q(name), _queue, json=changes)

    @staticmethod
    def peek(
        queue: str, state: str | None, limit: int | None, after: str | None,
        body_chars: int | None,
    ) -> _Call[PeekPage]:
        params = {k: v for k, v in (("state", state), ("limit", limit), ("after", after),
                                    ("body_chars", body_chars)) if v is not None}
        return _Call("GET", f"{_q(queue)}/messages", lambda r: PeekPage.from_json(r.json()),
                     params=params)

    @staticmethod
    def dead_letter_sources(queue: str) -> _Call[list[str]]:
        return _Call("GET", f"{_q(queue)}/dead-letter-sources",
                     lambda r: [str(n) for n in r.json()["queues"]])

    @staticmethod
    def start_redrive(
        queue: str, destination: str | None, max_per_second: int | None
    ) -> _Call[RedriveTask]:
        body = {k: v for k, v in (("destination", destination),
                                  ("max_per_second", max_per_second)) if v is not None}
        return _Call("POST", f"{_q(queue)}/redrive", _task, json=body)

    @staticmethod
    def list_redrives(queue: str) -> _Call[list[RedriveTask]]:
        return _Call("GET", f"{_q(queue)}/redrive",
                     lambda r: [RedriveTask.from_json(t) for t in r.json()["tasks"]])

    @staticmethod
    def get_redrive(task_id: str) -> _Call[RedriveTask]:
        return _Call("GET", f"/v1/redrive-tasks/{_seg(task_id)}", _task)

    @staticmethod
    def cancel_redrive(task_id: str) -> _Call[RedriveTask]:
        return _Call("DELETE", f"/v1/redrive-tasks/{_seg(task_id)}", _task)

    @staticmethod
    def overview(prefix: str | None) -> _Call[list[dict[str, Any]]]:
        params = {} if prefix is None else {"prefix": prefix}
        return _Call("GET", "/ui/api/overview", lambda r: list(r.json()["queues"]),
                     params=params)

    @staticmethod
    def delete_queue(name: str) -> _Call[None]:
        return _Call("DELETE", _q(name), _none)

    @staticmethod
    def purge(name: str) -> _Call[int]:
        return _Call("POST", f"{_q(name)}/purge", lambda r: int(r.json()["purged"]))

    @staticmethod
    def send(
        queue: str, body: str, delay: int | None, attributes: dict[str, str] | None,
        group: str | None = None, deduplication_id: str | None = None,
    ) -> _Call[Sent]:
        entry = OutgoingMessage(
            body, delay, dict(attributes or {}), group=group, deduplication_id=deduplication_id
        ).to_json()
        return _Call("POST", f"{_q(queue)}/messages", lambda r: Sent.from_json(r.json()),
                     json=entry)

    @staticmethod
    def send_batch(
        queue: str, messages: Iterable[OutgoingMessage | str]
    ) -> _Call[list[Sent | ApiError]]:
        entries = [
            (m if isinstance(m, OutgoingMessage) else OutgoingMessage(m)).to_json()
            for m in messages
        ]
        return _Call("POST", f"{_q(queue)}/messages", _batch(Sent.from_json),
                     json={"messages": entries})

    @staticmethod
    def receive(
        queue: str, max: int, visibility_timeout: int | None, wait: int | None,
        timeout: float, attempt_id: str | None = None,
    ) -> _Call[list[Message]]:
        params = _receive_options(max, visibility_timeout, wait, attempt_id)
        return _Call("GET", f"{_q(queue)}/receive", _messages, params=params,
                     timeout=_poll_timeout(wait, timeout))

    @staticmethod
    def receive_settling(
        queue: str, delete: Sequence[str], extend: Sequence[tuple[str, int]], max: int,
        visibility_timeout: int | None, wait: int | None, timeout: float,
        attempt_id: str | None = None,
    ) -> _Call[Settled]:
        body = _receive_options(max, visibility_timeout, wait, attempt_id)
        body["delete"] = list(delete)
        body["extend"] = [{"receipt_handle": h, "timeout": t} for h, t in extend]
        return _Call("POST", f"{_q(queue)}/receive", _settled, json=body,
                     timeout=_poll_timeout(wait, timeout))

    @staticmethod
    def extend(queue: str, handle: str, timeout: int) -> _Call[Lease]:
        return _Call("PATCH", f"{_h(queue, handle)}/visibility", _lease,
                     json={"timeout": timeout})

    @staticmethod
    def release(queue: str, handle: str, delay: int | None) -> _Call[Released]:
        # A failed attempt. Without a delay the service applies the queue's
        # retry ladder (`retry_backoff`), and without a ladder releases at once.
        body = {} if delay is None else {"delay": delay}
        return _Call("POST", f"{_h(queue, handle)}/release", _released, json=body)

    @staticmethod
    def delete(queue: str, handle: str) -> _Call[None]:
        return _Call("DELETE", _h(queue, handle), _none)

    @staticmethod
    def checkpoint(
        queue: str, handle: str, cursor: Any, timeout: int | None = None
    ) -> _Call[Lease]:
        body: dict[str, Any] = {"cursor": cursor}
        if timeout is not None:
            body["timeout"] = timeout
        return _Call("PUT", f"{_h(queue, handle)}/checkpoint", _lease, json=body)

    @staticmethod
    def extend_batch(
        queue: str, entries: Sequence[tuple[str, int]]
    ) -> _Call[list[Lease | ApiError]]:
        body = {"entries": [{"receipt_handle": h, "timeout": t} for h, t in entries]}
        return _Call("POST", f"{_q(queue)}/messages/visibility", _batch(Lease.from_json),
                     json=body)

    @staticmethod
    def delete_batch(queue: str, handles: Sequence[str]) -> _Call[list[ApiError | None]]:
        return _Call("POST", f"{_q(queue)}/messages/delete", _batch(lambda _r: None),
                     json={"receipt_handles": list(handles)})


def _receive_options(
    max: int, visibility_timeout: int | None, wait: int | None, attempt_id: str | None
) -> dict[str, Any]:
    options: dict[str, Any] = {"max": max}
    if visibility_timeout is not None:
        options["visibility_timeout"] = visibility_timeout
    if wait is not None:
        options["wait"] = wait
    if attempt_id is not None:
        options["attempt_id"] = attempt_id
    return options


def _poll_timeout(wait: int | None, timeout: float) -> float:
    # A long poll answers after up to `wait` seconds (the queue's receive_wait,
    # at most 20, when not given): the read timeout must outlast it.
    return max_(timeout, float(wait if wait is not None else 20) + POLL_MARGIN)


def max_(a: float, b: float) -> float:
    return a if a > b else b


def _raise_for_problem(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        raise api_error(response.status_code, body["code"], str(body.get("detail", "")), body)
    raise ApiError(
        response.status_code, f"http_{response.status_code}", response.text[:300], body
    )


def _read(call: _Call[T], response: httpx.Response) -> T:
    _raise_for_problem(response)
    return call.parse(response)


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

    def _run(self, call: _Call[T], request_timeout: float | None = None) -> T:
        try:
            response = self._http.request(
                call.method, call.path, params=call.params, json=call.json,
                timeout=request_timeout or call.timeout or self.timeout,
            )
        except httpx.TransportError as exc:
            raise Unreachable(f"{call.method} {call.path}: {exc!r}") from exc
        return _read(call, response)

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
        return self._run(_calls.create_queue(name, attributes))

    def get_queue(self, name: str) -> Queue:
        """Attributes and live `stats` of a queue."""
        return self._run(_calls.get_queue(name))

    def list_queues(
        self, *, prefix: str | None = None, after: str | None = None, limit: int | None = None
    ) -> QueuePage:
        """Queues by name, a page at a time (`next_after`)."""
        return self._run(_calls.list_queues(prefix, after, limit))

    def update_queue(self, name: str, **changes: Any) -> Queue:
        """Change attributes; `None` removes a policy (`retry_backoff=None`). A FIFO
        queue's `content_based_deduplication`, `deduplication_scope` and
        `fifo_throughput_limit` can change; `fifo` cannot."""
        return self._run(_calls.update_queue(name, changes))

    def peek(
        self, queue: str, *, state: str | None = None, limit: int | None = None,
        after: str | None = None, body_chars: int | None = None,
    ) -> PeekPage:
        """Messages without claiming them (operators): `visible`, `in_flight`, `delayed`."""
        return self._run(_calls.peek(queue, state, limit, after, body_chars))

    def dead_letter_sources(self, queue: str) -> list[str]:
        """The queues whose redrive policy names this one."""
        return self._run(_calls.dead_letter_sources(queue))

    def start_redrive(
        self, queue: str, *, destination: str | None = None, max_per_second: int | None = None
    ) -> RedriveTask:
        """Move a dead-letter queue's messages back (to their sources, or `destination`)."""
        return self._run(_calls.start_redrive(queue, destination, max_per_second))

    def list_redrives(self, queue: str) -> list[RedriveTask]:
        return self._run(_calls.list_redrives(queue))

    def get_redrive(self, task_id: str) -> RedriveTask:
        return self._run(_calls.get_redrive(task_id))

    def cancel_redrive(self, task_id: str) -> RedriveTask:
        return self._run(_calls.cancel_redrive(task_id))

    def overview(self, prefix: str | None = None) -> list[dict[str, Any]]:
        """Every queue the key may read, as the dashboard shows it: visible, in
        flight, delayed, oldest age, its messages in dead-letter queues
        (`dead_letter_sources` of a dead-letter queue), and sent and acknowledged
        per second (`leaseq top`). Needs `read` on the queues."""
        return self._run(_calls.overview(prefix))

    def delete_queue(self, name: str) -> None:
        self._run(_calls.delete_queue(name))

    def purge(self, name: str) -> int:
        return self._run(_calls.purge(name))

    def send(
        self, queue: str, body: str, *, delay: int | None = None,
        attributes: dict[str, str] | None = None, group: str | None = None,
        deduplication_id: str | None = None,
    ) -> Sent:
        """Send one message (answered once it is committed). FIFO queues: `group` is
        required, `deduplication_id` too unless the queue has content-based
        deduplication, and `delay` is refused; the `Sent` has a `sequence_number`."""
        return self._run(_calls.send(queue, body, delay, attributes, group, deduplication_id))

    def send_batch(
        self, queue: str, messages: Iterable[OutgoingMessage | str]
    ) -> list[Sent | ApiError]:
        """One result per entry, in order: a `Sent`, or the entry's error (not raised).
        On a FIFO queue give `OutgoingMessage`s with their `group` (and
        `deduplication_id`); one group's entries keep their order."""
        return self._run(_calls.send_batch(queue, messages))

    def receive(
        self, queue: str, *, max: int = 1, visibility_timeout: int | None = None,
        wait: int | None = None, attempt_id: str | None = None,
    ) -> list[Message]:
        """Claim up to `max` messages, waiting up to `wait` seconds for the first.
        The lease starts when the service claims: measure it from before this call.
        FIFO queues: a receive retried with the same `attempt_id` within five
        minutes answers the same messages while in flight (standard queues ignore it)."""
        return self._run(
            _calls.receive(queue, max, visibility_timeout, wait, self.timeout, attempt_id)
        )

    def receive_settling(
        self, queue: str, *, delete: Sequence[str] = (),
        extend: Sequence[tuple[str, int]] = (), max: int = 1,
        visibility_timeout: int | None = None, wait: int | None = None,
        attempt_id: str | None = None,
    ) -> Settled:
        """Acknowledge `delete` and extend `extend` ((handle, timeout) pairs), then
        receive as `receive` does: one request. Each entry has its own result."""
        return self._run(_calls.receive_settling(
            queue, delete, extend, max, visibility_timeout, wait, self.timeout, attempt_id
        ))

    def extend(self, queue: str, handle: str, timeout: int, *,
               request_timeout: float | None = None) -> Lease:
        """Heartbeat: the lease ends `timeout` seconds from now. `LeaseLost` when gone."""
        return self._run(_calls.extend(queue, handle, timeout), request_timeout)

    def release(self, queue: str, handle: str, delay: int | None = None) -> Released:
        """A failed attempt: give the message back (`POST .../release`), visible
        again after `delay` seconds (0-43200); without one, after the queue's retry
        ladder's delay for its receive count, or at once when the queue has none.
        The answer says which delay was applied. `LeaseLost` when the claim is gone."""
        return self._run(_calls.release(queue, handle, delay))

    def delete(self, queue: str, handle: str) -> None:
        """Acknowledge: deletes the message while this handle holds it, else `LeaseLost`."""
        self._run(_calls.delete(queue, handle))

    def checkpoint(
        self, queue: str, handle: str, cursor: Any, *, timeout: int | None = None
    ) -> Lease:
        """Record a cursor (returned by the next receive) and renew the lease: by
        `timeout` seconds from now (0-43200), else by the queue's visibility_timeout."""
        return self._run(_calls.checkpoint(queue, handle, cursor, timeout))

    def extend_batch(
        self, queue: str, entries: Sequence[tuple[str, int]]
    ) -> list[Lease | ApiError]:
        """Many (handle, timeout) at once; one result per entry, errors not raised."""
        return self._run(_calls.extend_batch(queue, entries))

    def delete_batch(self, queue: str, handles: Sequence[str]) -> list[ApiError | None]:
        """Acknowledge many handles at once; `None` per success, errors not raised."""
        return self._run(_calls.delete_batch(queue, handles))


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

    async def _run(self, call: _Call[T], request_timeout: float | None = None) -> T:
        try:
            response = await self._http.request(
                call.method, call.path, params=call.params, json=call.json,
                timeout=request_timeout or call.timeout or self.timeout,
            )
        except httpx.TransportError as exc:
            raise Unreachable(f"{call.method} {call.path}: {exc!r}") from exc
        return _read(call, response)

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
        return await self._run(_calls.create_queue(name, attributes))

    async def get_queue(self, name: str) -> Queue:
        """Attributes and live `stats` of a queue."""
        return await self._run(_calls.get_queue(name))

    async def list_queues(
        self, *, prefix: str | None = None, after: str | None = None, limit: int | None = None
    ) -> QueuePage:
        """Queues by name, a page at a time (`next_after`)."""
        return await self._run(_calls.list_queues(prefix, after, limit))

    async def update_queue(self, name: str, **changes: Any) -> Queue:
        """Change attributes; `None` removes a policy (`retry_backoff=None`). A FIFO
        queue's `content_based_deduplication`, `deduplication_scope` and
        `fifo_throughput_limit` can change; `fifo` cannot."""
        return await self._run(_calls.update_queue(name, changes))

    async def peek(
        self, queue: str, *, state: str | None = None, limit: int | None = None,
        after: str | None = None, body_chars: int | None = None,
    ) -> PeekPage:
        """Messages without claiming them (operators): `visible`, `in_flight`, `delayed`."""
        return await self._run(_calls.peek(queue, state, limit, after, body_chars))

    async def dead_letter_sources(self, queue: str) -> list[str]:
        """The queues whose redrive policy names this one."""
        return await self._run(_calls.dead_letter_sources(queue))

    async def start_redrive(
        self, queue: str, *, destination: str | None = None, max_per_second: int | None = None
    ) -> RedriveTask:
        """Move a dead-letter queue's messages back (to their sources, or `destination`)."""
        return await self._run(_calls.start_redrive(queue, destination, max_per_second))

    async def list_redrives(self, queue: str) -> list[RedriveTask]:
        return await self._run(_calls.list_redrives(queue))

    async def get_redrive(self, task_id: str) -> RedriveTask:
        return await self._run(_calls.get_redrive(task_id))

    async def cancel_redrive(self, task_id: str) -> RedriveTask:
        return await self._run(_calls.cancel_redrive(task_id))

    async def overview(self, prefix: str | None = None) -> list[dict[str, Any]]:
        """As Client.overview."""
        return await self._run(_calls.overview(prefix))

    async def delete_queue(self, name: str) -> None:
        await self._run(_calls.delete_queue(name))

    async def purge(self, name: str) -> int:
        return await self._run(_calls.purge(name))

    async def send(
        self, queue: str, body: str, *, delay: int | None = None,
        attributes: dict[str, str] | None = None, group: str | None = None,
        deduplication_id: str | None = None,
    ) -> Sent:
        """Send one message (answered once it is committed). FIFO queues: `group` is
        required, `deduplication_id` too unless the queue has content-based
        deduplication, and `delay` is refused; the `Sent` has a `sequence_number`."""
        return await self._run(_calls.send(queue, body, delay, attributes, group, deduplication_id))

    async def send_batch(
        self, queue: str, messages: Iterable[OutgoingMessage | str]
    ) -> list[Sent | ApiError]:
        """One result per entry, in order: a `Sent`, or the entry's error (not raised).
        On a FIFO queue give `OutgoingMessage`s with their `group` (and
        `deduplication_id`); one group's entries keep their order."""
        return await self._run(_calls.send_batch(queue, messages))

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
            _calls.receive(queue, max, visibility_timeout, wait, self.timeout, attempt_id)
        )

    async def receive_settling(
        self, queue: str, *, delete: Sequence[str] = (),
        extend: Sequence[tuple[str, int]] = (), max: int = 1,
        visibility_timeout: int | None = None, wait: int | None = None,
        attempt_id: str | None = None,
    ) -> Settled:
        """Acknowledge `delete` and extend `extend` ((handle, timeout) pairs), then
        receive as `receive` does: one request. Each entry has its own result."""
        return await self._run(_calls.receive_settling(
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
        return await self._run(_calls.extend(queue, handle, timeout), request_timeout)

    async def release(self, queue: str, handle: str, delay: int | None = None) -> Released:
        """A failed attempt: give the message back (`POST .../release`), visible
        again after `delay` seconds (0-43200); without one, after the queue's retry
        ladder's delay for its receive count, or at once when the queue has none.
        The answer says which delay was applied. `LeaseLost` when the claim is gone."""
        return await self._run(_calls.release(queue, handle, delay))

    async def delete(self, queue: str, handle: str) -> None:
        """Acknowledge: deletes the message while this handle holds it, else `LeaseLost`."""
        await self._run(_calls.delete(queue, handle))

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
        return await self._run(_calls.checkpoint(queue, handle, cursor, timeout))

    async def extend_batch(
        self, queue: str, entries: Sequence[tuple[str, int]]
    ) -> list[Lease | ApiError]:
        """Many (handle, timeout) at once; one result per entry, errors not raised."""
        return await self._run(_calls.extend_batch(queue, entries))

    async def delete_batch(self, queue: str, handles: Sequence[str]) -> list[ApiError | None]:
        """Acknowledge many handles at once; `None` per success, errors not raised."""
        return await self._run(_calls.delete_batch(queue, handles))
