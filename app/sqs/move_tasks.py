"""SQS message move tasks: the dead-letter redrive of the engine (app/queue/redrive.py)
in SQS's shapes, with SQS's errors and their words (as AWS answers them).

A task handle is SQS's: base64 of `{"taskId": ..., "sourceArn": ...}`. A cancel
reads both: an unknown source, then an unknown task (or one of another source),
is refused as SQS refuses it. The engine's cancel is immediate (the runner stops
before its next batch), so a task is never seen CANCELLING, only CANCELLED."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from app.errors import QueueNotFound, RedriveInProgress, TaskNotFound
from app.queue import limits
from app.queue.models import RedriveTask
from app.sqs.context import Context, is_fifo_name, param_ranged, param_required, param_str
from app.sqs.errors import SqsError

_STATUS = {"running": "RUNNING", "completed": "COMPLETED", "cancelled": "CANCELLED",
           "failed": "FAILED"}
MAX_PER_SECOND = 500  # SQS's range of MaxNumberOfMessagesPerSecond: 1 to 500
LIST_MAX = 10  # ListMessageMoveTasks: the most recent 10 at most, 1 by default


def _not_found(parameter: str) -> SqsError:
    return SqsError(
        "ResourceNotFoundException",
        f"The resource that you specified for the {parameter} parameter doesn't exist.",
    )


def _no_task() -> SqsError:
    return SqsError("ResourceNotFoundException", "Task does not exist.")


def _bad_handle() -> SqsError:
    return SqsError("InvalidParameterValue", "Value for parameter TaskHandle is invalid.")


def _arn_parts(arn: str) -> list[str] | None:
    """arn:<partition>:<service>:<region>:<account-id>:<resource-id>, split; None
    for anything not of that form."""
    parts = arn.split(":")
    if len(parts) != 6 or parts[0] != "arn" or not all(parts[1:3]) or not parts[5]:
        return None
    return parts


def _queue_of_arn(ctx: Context, arn: str, parameter: str) -> str:
    """The queue an ARN names. Not an ARN at all: SQS's format error; an ARN of
    anything but one of this account's queues in this region names nothing that
    exists."""
    parts = _arn_parts(arn)
    if parts is None:
        raise SqsError(
            "InvalidParameterValue",
            f"You must use this format to specify the {parameter}: "
            f"arn:<partition>:<service>:<region>:<account-id>:<resource-id>",
        )
    if (parts[2] != "sqs" or parts[3] != ctx.region or parts[4] != ctx.account
            or not limits.is_queue_name(parts[5])):
        raise _not_found(parameter)
    return parts[5]


async def _dead_letter_queue(ctx: Context, source: str) -> None:
    """SQS moves only out of a dead-letter queue: one that some queue's redrive
    policy names (the default destination is each message's source queue)."""
    try:
        sources = await ctx.service.queues.dead_letter_sources(source)
    except QueueNotFound as exc:
        raise _not_found("SourceArn") from exc
    if not sources:
        raise SqsError("InvalidParameterValue",
                       "Source queue must be configured as a Dead Letter Queue.")


async def _check_destination(ctx: Context, source: str, destination: str) -> None:
    if destination == source:
        raise SqsError("InvalidParameterValue",
                       "Source queue arn and destination queue arn cannot be the same.")
    try:
        await ctx.service.queues.get_queue(destination)
    except QueueNotFound as exc:
        raise _not_found("DestinationArn") from exc
    if is_fifo_name(destination) != is_fifo_name(source):
        raise SqsError("InvalidParameterValue",
                       "The source queue and destination queue must be of the same queue type.")


async def start_message_move_task(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    source = _queue_of_arn(ctx, param_required(params, "SourceArn"), "SourceArn")
    ctx.needs.require(ctx.principal, "queue", [source])
    destination_arn = param_str(params, "DestinationArn")
    destination = (
        None if destination_arn is None
        else _queue_of_arn(ctx, destination_arn, "DestinationArn")
    )
    rate = param_ranged(params, "MaxNumberOfMessagesPerSecond", 1, MAX_PER_SECOND)
    if destination is not None:
        # Before looking it up: whether a queue beyond the key's scopes exists
        # is not the key's to learn.
        ctx.needs.require(ctx.principal, "redrive_targets", [destination])
    await _dead_letter_queue(ctx, source)
    if destination is not None:
        await _check_destination(ctx, source, destination)
    elif not ctx.principal.anonymous:
        into = await ctx.redrives.reached_by(source, None)
        ctx.needs.require_unnamed(ctx.principal, "redrive_targets", into)
    try:
        task = await ctx.redrives.start(source, destination, rate)
    except RedriveInProgress as exc:
        raise SqsError(
            "InvalidParameterValue",
            "There is already a task running. Only one active task is allowed for a source "
            "queue arn at a given time.",
        ) from exc
    except QueueNotFound as exc:  # deleted since the checks above
        raise _not_found("SourceArn" if destination is None else "DestinationArn") from exc
    return {"TaskHandle": _task_handle(task.task_id, ctx.arn(source))}


async def list_message_move_tasks(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    source = _queue_of_arn(ctx, param_required(params, "SourceArn"), "SourceArn")
    ctx.needs.require(ctx.principal, "queue", [source])
    limit = param_ranged(params, "MaxResults", 1, LIST_MAX) or 1
    try:
        tasks = await ctx.redrives.list(source, limit)
    except QueueNotFound as exc:
        raise _not_found("SourceArn") from exc
    return {"Results": [_entry(ctx, task) for task in tasks]}


def _entry(ctx: Context, task: RedriveTask) -> dict[str, Any]:
    """A task as ListMessageMoveTasks shows it: TaskHandle only while it runs;
    DestinationArn and MaxNumberOfMessagesPerSecond only when the start gave them;
    FailureReason only on a failed task."""
    entry: dict[str, Any] = {
        "Status": _STATUS.get(task.status, task.status.upper()),
        "SourceArn": ctx.arn(task.source),
        "ApproximateNumberOfMessagesMoved": task.moved,
        "ApproximateNumberOfMessagesToMove": task.to_move_at_start,
        "StartedTimestamp": int(task.created_at.timestamp() * 1000),
    }
    if task.status == "running":
        entry["TaskHandle"] = _task_handle(task.task_id, ctx.arn(task.source))
    if task.destination is not None:
        entry["DestinationArn"] = ctx.arn(task.destination)
    if task.max_per_second is not None:
        entry["MaxNumberOfMessagesPerSecond"] = task.max_per_second
    if task.status == "failed" and task.failure:
        entry["FailureReason"] = task.failure
    return entry


async def cancel_message_move_task(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    task_id, source_arn = _read_handle(param_required(params, "TaskHandle"))
    source = _queue_of_arn(ctx, source_arn, "SourceArn")
    ctx.needs.require(ctx.principal, "task", [source])
    try:
        await ctx.service.queues.get_queue(source)
    except QueueNotFound as exc:
        raise _not_found("SourceArn") from exc
    try:
        task = await ctx.redrives.get(task_id)
    except TaskNotFound as exc:
        raise _no_task() from exc
    # Only a running task of the handle's own queue can be cancelled (SQS's rule).
    if task.source != source or task.status != "running":
        raise _no_task()
    task = await ctx.redrives.cancel(task_id)
    return {"ApproximateNumberOfMessagesMoved": task.moved}


def _task_handle(task_id: str, source_arn: str) -> str:
    # Compact, as SQS's own handles are.
    raw = json.dumps({"taskId": task_id, "sourceArn": source_arn}, separators=(",", ":")).encode()
    return base64.b64encode(raw).decode()


def _read_handle(handle: str) -> tuple[str, str]:
    """(task id, source ARN) of a task handle; anything else is not a handle."""
    try:
        decoded = json.loads(base64.b64decode(handle.encode(), validate=True))
        task_id, source_arn = decoded["taskId"], decoded["sourceArn"]
    except (ValueError, TypeError, KeyError, RecursionError, binascii.Error) as exc:
        raise _bad_handle() from exc
    # A handle of ours names a task and a queue by ARN: anything else is forged.
    if not isinstance(task_id, str) or not isinstance(source_arn, str) or (
        _arn_parts(source_arn) is None
    ):
        raise _bad_handle()
    return task_id, source_arn
