"""SQS message move tasks: the dead-letter redrive of the engine (app/queue/redrive.py)
in SQS's shapes."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from app.errors import QueueNotFound
from app.sqs.context import (
    Context,
    param_ranged,
    param_required,
    param_str,
)
from app.sqs.errors import SqsError

_STATUS = {"running": "RUNNING", "completed": "COMPLETED", "cancelled": "CANCELLED",
           "failed": "FAILED"}


def _task_handle(task_id: str, source_arn: str) -> str:
    raw = json.dumps({"taskId": task_id, "sourceArn": source_arn}).encode()
    return base64.b64encode(raw).decode()


def _task_id(handle: str) -> str:
    try:
        decoded = json.loads(base64.b64decode(handle.encode(), validate=True))
        task_id = decoded["taskId"]
        if not isinstance(task_id, str):
            raise TypeError
    except (ValueError, TypeError, KeyError, binascii.Error) as exc:
        raise SqsError(
            "ResourceNotFoundException", "The resource that you specified does not exist."
        ) from exc
    return task_id


async def start_message_move_task(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    source_arn = param_required(params, "SourceArn")
    source = ctx.name_from_arn(source_arn, "SourceArn")
    ctx.principal.require("admin", source)
    destination_arn = param_str(params, "DestinationArn")
    destination = (
        None if destination_arn is None else ctx.name_from_arn(destination_arn, "DestinationArn")
    )
    rate = param_ranged(params, "MaxNumberOfMessagesPerSecond", 1, 500)
    try:
        task = await ctx.redrives.start(source, destination, rate)
    except QueueNotFound as exc:
        raise SqsError("ResourceNotFoundException", exc.detail) from exc
    return {"TaskHandle": _task_handle(task.task_id, source_arn)}


async def list_message_move_tasks(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    source_arn = param_required(params, "SourceArn")
    source = ctx.name_from_arn(source_arn, "SourceArn")
    ctx.principal.require("read", source)
    limit = param_ranged(params, "MaxResults", 1, 10) or 1
    try:
        tasks = await ctx.redrives.list(source, limit)
    except QueueNotFound as exc:
        raise SqsError("ResourceNotFoundException", exc.detail) from exc
    results = []
    for task in tasks:
        entry: dict[str, Any] = {
            "Status": _STATUS.get(task.status, task.status.upper()),
            "SourceArn": source_arn,
            "ApproximateNumberOfMessagesMoved": task.moved,
            "StartedTimestamp": int(task.created_at.timestamp() * 1000),
        }
        if task.status == "running":
            entry["TaskHandle"] = _task_handle(task.task_id, source_arn)
            entry["ApproximateNumberOfMessagesToMove"] = task.to_move_at_start
        if task.destination is not None:
            entry["DestinationArn"] = ctx.arn(task.destination)
        if task.max_per_second is not None:
            entry["MaxNumberOfMessagesPerSecond"] = task.max_per_second
        if task.failure:
            entry["FailureReason"] = task.failure
        results.append(entry)
    return {"Results": results}


async def cancel_message_move_task(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    task_id = _task_id(param_required(params, "TaskHandle"))
    task = await ctx.redrives.get(task_id)
    ctx.principal.require("admin", task.source)
    if task.status != "running":
        raise SqsError(
            "ResourceNotFoundException", "The task is not running: it cannot be cancelled."
        )
    task = await ctx.redrives.cancel(task_id)
    return {"ApproximateNumberOfMessagesMoved": task.moved}
