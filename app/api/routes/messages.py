"""Messages: send, receive (long poll), heartbeat/release, acknowledge, checkpoint.

The message cycle's routes are declared here, for the OpenAPI document and the
router (a method a path has not answers 405 with `Allow`), and served by their
handlers in app/api/cycle.py on the lean path (app/asgi/lean.py): a declaration's
signature and models are its operation; `@serves` names its one implementation.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, status

from app.api import cycle
from app.api.bounded_json import BoundedJsonRoute
from app.api.deps import ServiceDep
from app.api.message_schemas import (
    BatchResults,
    CheckpointIn,
    DeleteBatchIn,
    LeaseOut,
    PeekedOut,
    PeekOut,
    ReceiveIn,
    ReceiveOut,
    ReceiveQuery,
    ReleasedOut,
    ReleaseIn,
    SendIn,
    SentOut,
    SettledOut,
    VisibilityBatchIn,
    VisibilityIn,
)
from app.api.openapi import responses
from app.asgi.lean import serves
from app.auth.access import scopes

router = APIRouter(
    prefix="/v1/queues/{queue}", tags=["messages"], route_class=BoundedJsonRoute
)


@router.post(
    "/messages",
    status_code=status.HTTP_201_CREATED,
    operation_id="send_message",
    response_model=SentOut,
    responses={200: {"model": BatchResults, "description": "Batch: one result per entry"},
               **responses("queue_not_found", "message_too_large", "validation_error",
                           "database_unavailable")},
    **scopes("send:queue"),
)
@serves(cycle.send)
async def send(queue: str, body: SendIn) -> None:
    """Send one message (201) or a batch `{"messages": [...]}` (200, per-entry results).
    Answers only after the commit."""


@router.get("/receive", operation_id="receive_messages", response_model=ReceiveOut,
            responses=responses("queue_not_found", "validation_error",
                                "database_unavailable", "overloaded"), **scopes("receive:queue"))
@serves(cycle.receive)
async def receive(queue: str, query: Annotated[ReceiveQuery, Query()]) -> None:
    """Claim up to `max` messages. With `wait`, returns as soon as one is available."""


@router.post("/receive", operation_id="receive_and_settle", response_model=SettledOut,
             responses=responses("queue_not_found", "validation_error",
                                 "database_unavailable", "overloaded"), **scopes("receive:queue"))
@serves(cycle.receive_and_settle)
async def receive_and_settle(queue: str, body: ReceiveIn) -> None:
    """Acknowledge (`delete`) and extend (`extend`) held messages, then claim up to
    `max`, as `GET …/receive` does. The acknowledgements and extensions are applied
    (and committed) first; each reports its own result, and a `lease_lost` entry
    never fails the receive. Retried after a failure, an acknowledgement already
    applied answers `lease_lost`."""


@router.patch("/messages/{receipt_handle}/visibility", response_model=LeaseOut,
              responses=responses("invalid_receipt_handle", "queue_not_found", "lease_lost",
                                  "validation_error", "database_unavailable", "overloaded"),
                                  **scopes("receive:queue"))
@serves(cycle.change_visibility)
async def change_visibility(queue: str, receipt_handle: str, body: VisibilityIn) -> None:
    """Heartbeat: the lease ends `timeout` seconds from now, by the database clock.
    `timeout: 0` releases the message at once. 409 `lease_lost` when the claim is gone."""


@router.post("/messages/visibility", response_model=BatchResults,
             responses=responses("queue_not_found", "validation_error",
                                 "database_unavailable", "overloaded"), **scopes("receive:queue"))
@serves(cycle.change_visibility_batch)
async def change_visibility_batch(queue: str, body: VisibilityBatchIn) -> None:
    """Heartbeat or release many claims at once; one result per entry."""


@router.delete(
    "/messages/{receipt_handle}",
    status_code=status.HTTP_204_NO_CONTENT,
    operation_id="delete_message",
    responses=responses("invalid_receipt_handle", "queue_not_found", "lease_lost",
                        "database_unavailable"),
    **scopes("receive:queue"),
)
@serves(cycle.delete)
async def delete(queue: str, receipt_handle: str) -> None:
    """Acknowledge: deletes the message only while this handle's claim holds it."""


@router.post("/messages/delete", operation_id="delete_message_batch",
             response_model=BatchResults,
             responses=responses("queue_not_found", "validation_error",
                                 "database_unavailable"), **scopes("receive:queue"))
@serves(cycle.delete_batch)
async def delete_batch(queue: str, body: DeleteBatchIn) -> None:
    """Acknowledge many claims at once; one result per handle."""


@router.post("/messages/{receipt_handle}/release", operation_id="release_message",
             response_model=ReleasedOut,
             responses=responses("invalid_receipt_handle", "queue_not_found", "lease_lost",
                                 "validation_error", "database_unavailable"),
                                 **scopes("receive:queue"))
@serves(cycle.release)
async def release(queue: str, receipt_handle: str, body: ReleaseIn | None = None) -> None:
    """A failed attempt: the message is visible again after `delay` seconds, else after
    the queue's retry ladder's delay for its receive count, else at once.
    409 `lease_lost` when the claim is gone."""


@router.put("/messages/{receipt_handle}/checkpoint", operation_id="checkpoint_message",
            response_model=LeaseOut,
            responses=responses("invalid_receipt_handle", "queue_not_found", "lease_lost",
                                "validation_error", "database_unavailable"),
                                **scopes("receive:queue"))
@serves(cycle.checkpoint)
async def checkpoint(queue: str, receipt_handle: str, body: CheckpointIn) -> None:
    """Record a cursor for a long job and renew the lease (by `timeout`, default the
    queue's visibility timeout). The next receive of the message returns the cursor."""


@router.get("/messages", operation_id="peek_messages",
            responses=responses("queue_not_found", "validation_error",
                                "database_unavailable"), **scopes("read:queue"))
async def peek(
    queue: str,
    service: ServiceDep,
    state: Literal["visible", "in_flight", "delayed"] | None = None,
    limit: int = Query(100, ge=1, le=1000),
    after: str | None = Query(None, max_length=20, pattern=r"^[0-9]+$",
                              description="`next_after` of the previous page."),
    # The engine refuses limit * body_chars over 10 MiB (PEEK_MAX_CHARS in
    # app/queue/peeking.py) with 422; the default page stays far below that.
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
