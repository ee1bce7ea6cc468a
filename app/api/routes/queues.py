"""Queues: create, list, read with live stats, change, delete, purge."""

from __future__ import annotations

from fastapi import APIRouter, Query, Response, status

from app.api.deps import ServiceDep
from app.api.problems import responses
from app.api.schemas import (
    Purged,
    QueueAttributesIn,
    QueueCreate,
    QueueDetail,
    QueueList,
    QueueOut,
)

router = APIRouter(prefix="/v1/queues", tags=["queues"])

_NAME_CHARS = r"^[A-Za-z0-9_-]*$"


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": QueueOut, "description": "Exists with the same attributes"},
               **responses(409, 422, 503)},
)
async def create_queue(body: QueueCreate, service: ServiceDep, response: Response) -> QueueOut:
    queue, created = await service.create_queue(body.name, body.changes())
    if not created:
        response.status_code = status.HTTP_200_OK
    return QueueOut.of(queue)


@router.get("", responses=responses(422, 503))
async def list_queues(
    service: ServiceDep,
    # Only queue-name characters: these go to PostgreSQL as text, and a NUL
    # (`?prefix=%00`) made it raise "invalid byte sequence": a 500.
    prefix: str = Query("", max_length=80, pattern=_NAME_CHARS),
    after: str = Query(
        "", max_length=80, pattern=_NAME_CHARS, description="Last name of the previous page."
    ),
    limit: int = Query(1000, ge=1, le=1000),
) -> QueueList:
    queues = await service.list_queues(prefix=prefix, after=after, limit=limit)
    next_after = queues[-1].name if len(queues) == limit else None
    return QueueList(queues=[QueueOut.of(q) for q in queues], next_after=next_after)


@router.get("/{queue}", responses=responses(404, 503))
async def get_queue(queue: str, service: ServiceDep) -> QueueDetail:
    found, stats = await service.get_queue(queue)
    return QueueDetail.with_stats(found, stats)


@router.patch("/{queue}", responses=responses(404, 422, 503))
async def update_queue(queue: str, body: QueueAttributesIn, service: ServiceDep) -> QueueOut:
    return QueueOut.of(await service.update_queue(queue, body.changes()))


@router.delete("/{queue}", status_code=status.HTTP_204_NO_CONTENT,
               responses=responses(404, 503))
async def delete_queue(queue: str, service: ServiceDep) -> None:
    await service.delete_queue(queue)


@router.post("/{queue}/purge", responses=responses(404, 503))
async def purge_queue(queue: str, service: ServiceDep) -> Purged:
    return Purged(purged=await service.purge(queue))
