"""Messages: send, receive (long poll), heartbeat/release, acknowledge, checkpoint."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request, Response, status

from app.api.bounded_json import BoundedJsonRoute
from app.api.deps import ServiceDep, check_batch, service_of, settings_of
from app.api.problems import entry_error, responses
from app.api.schemas import (
    BatchResults,
    CheckpointIn,
    DeleteBatchIn,
    LeaseOut,
    MessageBatchIn,
    MessageIn,
    PeekedOut,
    PeekOut,
    ReceivedOut,
    ReceiveIn,
    ReceiveOut,
    ReleasedOut,
    ReleaseIn,
    SendIn,
    SentOut,
    SettledOut,
    VisibilityBatchIn,
    VisibilityIn,
)
from app.asgi.disconnect import client_gone
from app.queue import limits
from app.queue.models import EntryError, Lease, OutgoingMessage

router = APIRouter(
    prefix="/v1/queues/{queue}", tags=["messages"], route_class=BoundedJsonRoute
)


@router.post(
    "/messages",
    status_code=status.HTTP_201_CREATED,
    operation_id="send_message",
    responses={200: {"model": BatchResults, "description": "Batch: one result per entry"},
               **responses("queue_not_found", "message_too_large", "validation_error",
                           "database_unavailable")},
)
async def send(
    queue: str,
    body: SendIn,
    request: Request,
    response: Response,
) -> SentOut | BatchResults:
    """Send one message (201) or a batch `{"messages": [...]}` (200, per-entry results).
    Answers only after the commit."""
    service = service_of(request)
    settings = settings_of(request)
    entries = body.messages if isinstance(body, MessageBatchIn) else [body]
    check_batch(len(entries), settings)
    results = await service.send(
        queue,
        [
            OutgoingMessage(
                body=e.body, attributes=e.attributes, delay=e.delay, not_before=e.not_before
            )
            for e in entries
        ],
    )
    if isinstance(body, MessageIn):
        (result,) = results
        if isinstance(result, EntryError):
            raise result.error
        return SentOut(message_id=result.message_id, sent_at=result.sent_at)
    response.status_code = status.HTTP_200_OK
    return BatchResults.of(
        [
            entry_error(r.error) if isinstance(r, EntryError)
            else {"ok": True, "message_id": r.message_id, "sent_at": r.sent_at}
            for r in results
        ]
    )


@router.get("/receive", operation_id="receive_messages",
            responses=responses("queue_not_found", "validation_error",
                                "database_unavailable", "overloaded"))
async def receive(
    queue: str,
    request: Request,
    max_messages: int = Query(1, alias="max", ge=limits.RECEIVE_MAX[0], le=limits.RECEIVE_MAX[1]),
    visibility_timeout: int | None = Query(
        None, ge=limits.VISIBILITY_TIMEOUT[0], le=limits.VISIBILITY_TIMEOUT[1]
    ),
    wait: int | None = Query(
        None, ge=limits.RECEIVE_WAIT[0], le=limits.RECEIVE_WAIT[1],
        description="Seconds to wait for a message; default the queue's receive_wait.",
    ),
) -> ReceiveOut:
    """Claim up to `max` messages. With `wait`, returns as soon as one is available."""
    service = service_of(request)
    async with client_gone(request) as gone:
        received = await service.receive(
            queue, max_messages=max_messages, visibility_timeout=visibility_timeout,
            wait=wait, gone=gone,
        )
    return ReceiveOut(messages=[ReceivedOut.of(m) for m in received])


@router.post("/receive", operation_id="receive_and_settle",
             responses=responses("queue_not_found", "validation_error",
                                 "database_unavailable", "overloaded"))
async def receive_and_settle(queue: str, body: ReceiveIn, request: Request) -> SettledOut:
    """Acknowledge (`delete`) and extend (`extend`) held messages, then claim up to
    `max`, as `GET …/receive` does. The acknowledgements and extensions are applied
    (and committed) first; each reports its own result, and a `lease_lost` entry
    never fails the receive. Retried after a failure, an acknowledgement already
    applied answers `lease_lost`."""
    service = service_of(request)
    settings = settings_of(request)
    check_batch(len(body.delete), settings)
    check_batch(len(body.extend), settings)
    deleted, extended = await service.settle(
        queue, body.delete, [(e.receipt_handle, e.timeout) for e in body.extend]
    )
    async with client_gone(request) as gone:
        received = await service.receive(
            queue, max_messages=body.max, visibility_timeout=body.visibility_timeout,
            wait=body.wait, gone=gone,
        )
    return SettledOut(
        messages=[ReceivedOut.of(m) for m in received],
        deleted=_deleted(deleted),
        extended=_extended(extended),
    )


def _deleted(results: list[EntryError | None]) -> list[dict[str, Any]]:
    return [entry_error(r.error) if isinstance(r, EntryError) else {"ok": True} for r in results]


def _extended(results: list[Lease | EntryError]) -> list[dict[str, Any]]:
    return [
        entry_error(r.error) if isinstance(r, EntryError) else {
            "ok": True, "lease_seconds": r.visibility_timeout,
            "lease_expires_at": r.lease_expires_at,
        }
        for r in results
    ]


def _lease_or_raise(result: Lease | EntryError) -> LeaseOut:
    if isinstance(result, EntryError):
        raise result.error
    return LeaseOut.of(result)


@router.patch("/messages/{receipt_handle}/visibility",
              responses=responses("invalid_receipt_handle", "queue_not_found", "lease_lost",
                                  "validation_error", "database_unavailable", "overloaded"))
async def change_visibility(
    queue: str, receipt_handle: str, body: VisibilityIn, request: Request
) -> LeaseOut:
    """Heartbeat: the lease ends `timeout` seconds from now, by the database clock.
    `timeout: 0` releases the message at once. 409 `lease_lost` when the claim is gone."""
    service = service_of(request)
    (result,) = await service.change_visibility(queue, [(receipt_handle, body.timeout)])
    return _lease_or_raise(result)


@router.post("/messages/visibility",
             responses=responses("queue_not_found", "validation_error",
                                 "database_unavailable", "overloaded"))
async def change_visibility_batch(
    queue: str, body: VisibilityBatchIn, request: Request
) -> BatchResults:
    """Heartbeat or release many claims at once; one result per entry."""
    service = service_of(request)
    settings = settings_of(request)
    check_batch(len(body.entries), settings)
    results = await service.change_visibility(
        queue, [(e.receipt_handle, e.timeout) for e in body.entries]
    )
    return BatchResults.of(_extended(results))


@router.delete(
    "/messages/{receipt_handle}",
    status_code=status.HTTP_204_NO_CONTENT,
    operation_id="delete_message",
    responses=responses("invalid_receipt_handle", "queue_not_found", "lease_lost",
                        "database_unavailable"),
)
async def delete(queue: str, receipt_handle: str, request: Request) -> None:
    """Acknowledge: deletes the message only while this handle's claim holds it."""
    service = service_of(request)
    (result,) = await service.delete(queue, [receipt_handle])
    if isinstance(result, EntryError):
        raise result.error


@router.post("/messages/delete", operation_id="delete_message_batch",
             responses=responses("queue_not_found", "validation_error",
                                 "database_unavailable"))
async def delete_batch(
    queue: str, body: DeleteBatchIn, request: Request
) -> BatchResults:
    """Acknowledge many claims at once; one result per handle."""
    service = service_of(request)
    settings = settings_of(request)
    check_batch(len(body.receipt_handles), settings)
    results = await service.delete(queue, body.receipt_handles)
    return BatchResults.of(_deleted(results))


@router.post("/messages/{receipt_handle}/release", operation_id="release_message",
             responses=responses("invalid_receipt_handle", "queue_not_found", "lease_lost",
                                 "validation_error", "database_unavailable"))
async def release(
    queue: str, receipt_handle: str, request: Request, body: ReleaseIn | None = None
) -> ReleasedOut:
    """A failed attempt: the message is visible again after `delay` seconds, else after
    the queue's retry ladder's delay for its receive count, else at once.
    409 `lease_lost` when the claim is gone."""
    service = service_of(request)
    released = await service.release(queue, receipt_handle, None if body is None else body.delay)
    return ReleasedOut(delay_seconds=released.delay_seconds, visible_at=released.visible_at)


@router.get("/messages", operation_id="peek_messages",
            responses=responses("queue_not_found", "validation_error",
                                "database_unavailable"))
async def peek(
    queue: str,
    service: ServiceDep,
    state: Literal["visible", "in_flight", "delayed"] | None = None,
    limit: int = Query(100, ge=1, le=1000),
    after: str | None = Query(None, max_length=20, pattern=r"^[0-9]+$",
                              description="`next_after` of the previous page."),
    # The engine refuses limit * body_chars over 10 MiB (PEEK_MAX_CHARS in
    # app/queue/service.py) with 422; the default page stays far below that.
    body_chars: int = Query(1024, ge=0, le=1_048_576,
                            description="Bodies are cut to this many characters; "
                            "`limit` * `body_chars` is at most 10485760."),
) -> PeekOut:
    """List messages without claiming them (for operators): by state, paged."""
    found = await service.peek(
        queue, state=state, limit=limit, after=after, body_chars=body_chars
    )
    return PeekOut(
        messages=[PeekedOut.of(m) for m in found],
        next_after=found[-1].cursor if len(found) == limit else None,
    )


@router.put("/messages/{receipt_handle}/checkpoint", operation_id="checkpoint_message",
            responses=responses("invalid_receipt_handle", "queue_not_found", "lease_lost",
                                "validation_error", "database_unavailable"))
async def checkpoint(
    queue: str, receipt_handle: str, body: CheckpointIn, request: Request
) -> LeaseOut:
    """Record a cursor for a long job and renew the lease (by `timeout`, default the
    queue's visibility timeout). The next receive of the message returns the cursor."""
    service = service_of(request)
    return _lease_or_raise(
        await service.checkpoint(queue, receipt_handle, body.cursor, body.timeout)
    )


