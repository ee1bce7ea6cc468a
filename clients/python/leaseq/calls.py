"""The REST API's requests, as data: each operation's method, path, body and how to
read its answer (`calls`), shared by `Client` and `AsyncClient` (leaseq/client.py),
which differ only in how they wait."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from leaseq.errors import ApiError, api_error
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

POLL_MARGIN = 10.0
"""Seconds a long poll's read timeout exceeds its `wait`."""

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
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


class calls:
    @staticmethod
    def create_queue(name: str, attributes: dict[str, Any]) -> Call[Queue]:
        return Call("POST", "/v1/queues", _queue, json={"name": name, **attributes})

    @staticmethod
    def get_queue(name: str) -> Call[Queue]:
        return Call("GET", _q(name), _queue)

    @staticmethod
    def list_queues(prefix: str | None, after: str | None, limit: int | None) -> Call[QueuePage]:
        params = {k: v for k, v in (("prefix", prefix), ("after", after), ("limit", limit))
                  if v is not None}
        return Call("GET", "/v1/queues", lambda r: QueuePage.from_json(r.json()), params=params)

    @staticmethod
    def update_queue(name: str, changes: dict[str, Any]) -> Call[Queue]:
        return Call("PATCH", _q(name), _queue, json=changes)

    @staticmethod
    def peek(
        queue: str, state: str | None, limit: int | None, after: str | None,
        body_chars: int | None,
    ) -> Call[PeekPage]:
        params = {k: v for k, v in (("state", state), ("limit", limit), ("after", after),
                                    ("body_chars", body_chars)) if v is not None}
        return Call("GET", f"{_q(queue)}/messages", lambda r: PeekPage.from_json(r.json()),
                     params=params)

    @staticmethod
    def dead_letter_sources(queue: str) -> Call[list[str]]:
        return Call("GET", f"{_q(queue)}/dead-letter-sources",
                     lambda r: [str(n) for n in r.json()["queues"]])

    @staticmethod
    def start_redrive(
        queue: str, destination: str | None, max_per_second: int | None
    ) -> Call[RedriveTask]:
        body = {k: v for k, v in (("destination", destination),
                                  ("max_per_second", max_per_second)) if v is not None}
        return Call("POST", f"{_q(queue)}/redrive", _task, json=body)

    @staticmethod
    def list_redrives(queue: str) -> Call[list[RedriveTask]]:
        return Call("GET", f"{_q(queue)}/redrive",
                     lambda r: [RedriveTask.from_json(t) for t in r.json()["tasks"]])

    @staticmethod
    def get_redrive(task_id: str) -> Call[RedriveTask]:
        return Call("GET", f"/v1/redrive-tasks/{_seg(task_id)}", _task)

    @staticmethod
    def cancel_redrive(task_id: str) -> Call[RedriveTask]:
        return Call("DELETE", f"/v1/redrive-tasks/{_seg(task_id)}", _task)

    @staticmethod
    def overview(prefix: str | None) -> Call[list[dict[str, Any]]]:
        params = {} if prefix is None else {"prefix": prefix}
        return Call("GET", "/ui/api/overview", lambda r: list(r.json()["queues"]),
                     params=params)

    @staticmethod
    def delete_queue(name: str) -> Call[None]:
        return Call("DELETE", _q(name), _none)

    @staticmethod
    def purge(name: str) -> Call[int]:
        return Call("POST", f"{_q(name)}/purge", lambda r: int(r.json()["purged"]))

    @staticmethod
    def send(
        queue: str, body: str, delay: int | None, attributes: dict[str, str] | None,
        group: str | None = None, deduplication_id: str | None = None,
    ) -> Call[Sent]:
        entry = OutgoingMessage(
            body, delay, dict(attributes or {}), group=group, deduplication_id=deduplication_id
        ).to_json()
        return Call("POST", f"{_q(queue)}/messages", lambda r: Sent.from_json(r.json()),
                     json=entry)

    @staticmethod
    def send_batch(
        queue: str, messages: Iterable[OutgoingMessage | str]
    ) -> Call[list[Sent | ApiError]]:
        entries = [
            (m if isinstance(m, OutgoingMessage) else OutgoingMessage(m)).to_json()
            for m in messages
        ]
        return Call("POST", f"{_q(queue)}/messages", _batch(Sent.from_json),
                     json={"messages": entries})

    @staticmethod
    def receive(
        queue: str, max: int, visibility_timeout: int | None, wait: int | None,
        timeout: float, attempt_id: str | None = None,
    ) -> Call[list[Message]]:
        params = receive_options(max, visibility_timeout, wait, attempt_id)
        return Call("GET", f"{_q(queue)}/receive", _messages, params=params,
                     timeout=poll_timeout(wait, timeout))

    @staticmethod
    def receive_settling(
        queue: str, delete: Sequence[str], extend: Sequence[tuple[str, int]], max: int,
        visibility_timeout: int | None, wait: int | None, timeout: float,
        attempt_id: str | None = None,
    ) -> Call[Settled]:
        body = receive_options(max, visibility_timeout, wait, attempt_id)
        body["delete"] = list(delete)
        body["extend"] = [{"receipt_handle": h, "timeout": t} for h, t in extend]
        return Call("POST", f"{_q(queue)}/receive", _settled, json=body,
                     timeout=poll_timeout(wait, timeout))

    @staticmethod
    def extend(queue: str, handle: str, timeout: int) -> Call[Lease]:
        return Call("PATCH", f"{_h(queue, handle)}/visibility", _lease,
                     json={"timeout": timeout})

    @staticmethod
    def release(queue: str, handle: str, delay: int | None) -> Call[Released]:
        # A failed attempt. Without a delay the service applies the queue's
        # retry ladder (`retry_backoff`), and without a ladder releases at once.
        body = {} if delay is None else {"delay": delay}
        return Call("POST", f"{_h(queue, handle)}/release", _released, json=body)

    @staticmethod
    def delete(queue: str, handle: str) -> Call[None]:
        return Call("DELETE", _h(queue, handle), _none)

    @staticmethod
    def checkpoint(
        queue: str, handle: str, cursor: Any, timeout: int | None = None
    ) -> Call[Lease]:
        body: dict[str, Any] = {"cursor": cursor}
        if timeout is not None:
            body["timeout"] = timeout
        return Call("PUT", f"{_h(queue, handle)}/checkpoint", _lease, json=body)

    @staticmethod
    def extend_batch(
        queue: str, entries: Sequence[tuple[str, int]]
    ) -> Call[list[Lease | ApiError]]:
        body = {"entries": [{"receipt_handle": h, "timeout": t} for h, t in entries]}
        return Call("POST", f"{_q(queue)}/messages/visibility", _batch(Lease.from_json),
                     json=body)

    @staticmethod
    def delete_batch(queue: str, handles: Sequence[str]) -> Call[list[ApiError | None]]:
        return Call("POST", f"{_q(queue)}/messages/delete", _batch(lambda _r: None),
                     json={"receipt_handles": list(handles)})


def receive_options(
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


def poll_timeout(wait: int | None, timeout: float) -> float:
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


def read_answer(call: Call[T], response: httpx.Response) -> T:
    _raise_for_problem(response)
    return call.parse(response)
