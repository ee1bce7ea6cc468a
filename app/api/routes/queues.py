"""Queues: create, list, read with live stats, change, delete, purge."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response, status

from app.api.deps import ServiceDep
from app.api.openapi import responses
from app.api.schemas import (
    Purged,
    QueueAttributesIn,
    QueueCreate,
    QueueDetail,
    QueueList,
    QueueOut,
)
from app.auth.access import dead_letter_queues, needs_of_request, scopes
from app.auth.guard import principal_of

router = APIRouter(prefix="/v1/queues", tags=["queues"])

_NAME_CHARS = r"^[A-Za-z0-9_-]*$"


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": QueueOut, "description": "Exists with the same attributes"},
               **responses("invalid_redrive_policy", "queue_already_exists",
                           "validation_error", "database_unavailable")},
    **scopes("admin:name", "send:dead_letter_queue"),
)
async def create_queue(
    body: QueueCreate, service: ServiceDep, request: Request, response: Response
) -> QueueOut:
    changes = body.changes()
    principal, needs = principal_of(request), needs_of_request(request.scope)
    needs.require(principal, "name", [body.name])
    needs.require(principal, "dead_letter_queue", dead_letter_queues(changes))
    queue, created = await service.queues.create_queue(body.name, changes)
    if not created:
        response.status_code = status.HTTP_200_OK
    return QueueOut.of(queue)


@router.get("", responses=responses("validation_error", "database_unavailable"),
            **scopes("read:listed"))
async def list_queues(
    service: ServiceDep,
    request: Request,
    # Only queue-name characters: these go to PostgreSQL as text, and a NUL
    # (`?prefix=%00`) made it raise "invalid byte sequence": a 500.
    prefix: str = Query("", max_length=80, pattern=_NAME_CHARS),
    after: str = Query(
        "", max_length=80, pattern=_NAME_CHARS, description="Last name of the previous page."
    ),
    limit: int = Query(1000, ge=1, le=1000),
) -> QueueList:
    # A key sees the queues it may read, and only those are read: the cursor,
    # the page's last name, is never another key's queue.
    principal, action = principal_of(request), needs_of_request(request.scope).on("listed")
    patterns = principal.patterns(action) if action else []
    queues = await service.queues.list_queues(
        prefix=prefix, after=after, limit=limit, patterns=patterns
    )
    next_after = queues[-1].name if len(queues) == limit else None
    shown = [QueueOut.of(q) for q in queues if action and principal.allows(action, q.name)]
    return QueueList(queues=shown, next_after=next_after)


@router.get("/{queue}", responses=responses("queue_not_found", "database_unavailable"),
            **scopes("read:queue"))
async def get_queue(queue: str, service: ServiceDep, request: Request) -> QueueDetail:
    found, stats = await service.queues.get_queue(queue)
    return QueueDetail.with_stats(found, stats, request.app.state.metrics.advice(queue))


@router.patch("/{queue}", responses=responses("invalid_redrive_policy", "queue_not_found",
                                               "validation_error", "database_unavailable"),
              **scopes("admin:queue", "send:dead_letter_queue"))
async def update_queue(
    queue: str, body: QueueAttributesIn, service: ServiceDep, request: Request
) -> QueueOut:
    changes = body.changes()
    needs_of_request(request.scope).require(
        principal_of(request), "dead_letter_queue", dead_letter_queues(changes))
    return QueueOut.of(await service.queues.update_queue(queue, changes))


@router.delete("/{queue}", status_code=status.HTTP_204_NO_CONTENT,
               responses=responses("queue_not_found", "queue_in_use", "database_unavailable"),
               **scopes("admin:queue"))
async def delete_queue(queue: str, service: ServiceDep, request: Request) -> None:
    principal = principal_of(request)
    await service.queues.delete_queue(queue, lambda name: principal.allows("read", name))


@router.post("/{queue}/purge", responses=responses("queue_not_found", "database_unavailable"),
             **scopes("admin:queue"))
async def purge_queue(queue: str, service: ServiceDep) -> Purged:
    return Purged(purged=await service.queues.purge(queue))
