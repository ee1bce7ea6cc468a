"""Dead-letter queues: their sources, and redrive tasks that move messages back."""

from __future__ import annotations

from fastapi import APIRouter, Request, status

from app.api.deps import ServiceDep
from app.api.openapi import responses
from app.api.schemas import DeadLetterSourcesOut, RedriveIn, RedriveTaskList, RedriveTaskOut
from app.auth.access import needs_of_request, scopes
from app.auth.guard import principal_of
from app.queue.redrive import Redrives

router = APIRouter(tags=["dead-letter queues"])


def _redrives(request: Request) -> Redrives:
    redrives: Redrives = request.app.state.redrives
    return redrives


@router.get("/v1/queues/{queue}/dead-letter-sources", operation_id="list_dead_letter_sources",
            responses=responses("queue_not_found", "database_unavailable"), **scopes("read:queue"))
async def dead_letter_sources(
    queue: str, service: ServiceDep, request: Request
) -> DeadLetterSourcesOut:
    """Queues whose redrive policy names this queue: those the key may read."""
    principal = principal_of(request)
    sources = await service.queues.dead_letter_sources(queue)
    return DeadLetterSourcesOut(queues=[s for s in sources if principal.allows("read", s)])


@router.post(
    "/v1/queues/{queue}/redrive",
    status_code=status.HTTP_202_ACCEPTED,
    responses=responses("queue_not_found", "redrive_in_progress", "validation_error",
                        "database_unavailable"),
    **scopes("admin:queue", "send:redrive_targets"),
)
async def start_redrive(
    queue: str, request: Request, body: RedriveIn | None = None
) -> RedriveTaskOut:
    """Move this dead-letter queue's messages back to the queues they came from (or to
    `destination`), optionally at most `max_per_second`. Redriven messages start with a
    receive count of 0. 409 `redrive_in_progress` if one is running."""
    body = body or RedriveIn()
    redrives = _redrives(request)
    principal = principal_of(request)
    if not principal.anonymous:
        into = await redrives.reached_by(queue, body.destination)
        needs = needs_of_request(request.scope)
        if body.destination is None:
            needs.require_unnamed(principal, "redrive_targets", into)
        else:
            needs.require(principal, "redrive_targets", into)
    task = await redrives.start(queue, body.destination, body.max_per_second)
    return RedriveTaskOut.of(task)


@router.get("/v1/queues/{queue}/redrive",
            responses=responses("queue_not_found", "database_unavailable"), **scopes("read:queue"))
async def list_redrives(queue: str, request: Request) -> RedriveTaskList:
    """This dead-letter queue's redrive tasks, newest first."""
    tasks = await _redrives(request).list(queue)
    return RedriveTaskList(tasks=[RedriveTaskOut.of(t) for t in tasks])


@router.get("/v1/redrive-tasks/{task_id}",
            responses=responses("task_not_found", "database_unavailable"), **scopes("read:task"))
async def get_redrive(task_id: str, request: Request) -> RedriveTaskOut:
    """A task's progress: `moved`, `remaining` (counted live), `status`."""
    task = await _redrives(request).get(task_id)
    needs_of_request(request.scope).require(principal_of(request), "task", [task.source])
    return RedriveTaskOut.of(task)


@router.delete("/v1/redrive-tasks/{task_id}",
               responses=responses("task_not_found", "database_unavailable"),
               **scopes("admin:task"))
async def cancel_redrive(task_id: str, request: Request) -> RedriveTaskOut:
    """Stop a running task; what it moved stays moved."""
    task = await _redrives(request).get(task_id)
    needs_of_request(request.scope).require(principal_of(request), "task", [task.source])
    return RedriveTaskOut.of(await _redrives(request).cancel(task_id))
