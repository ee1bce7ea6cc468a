"""SQS actions on queues: create, find, list, delete, purge, and their
dead-letter sources."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from app.auth.access import dead_letter_queues
from app.auth.scopes import ACTIONS as SCOPE_ACTIONS
from app.errors import QueueAlreadyExists, QueueError
from app.queue import limits
from app.sqs.attributes import (
    ENGINE_NAMES,
    attribute_error,
    check_tags,
    queue_changes,
    wants_fifo,
)
from app.sqs.context import (
    Context,
    is_fifo_name,
    param_ranged,
    param_required,
    param_str,
    param_str_map,
    queue_of,
)
from app.sqs.errors import NO_QUEUE, SqsError

LIST_QUEUES_MAX = 1000


async def create_queue(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = param_required(params, "QueueName")
    given = param_str_map(params, "Attributes")
    fifo = wants_fifo(given)
    if not limits.is_queue_name(name) or is_fifo_name(name) != fifo:
        # SQS's words: a ".fifo" name is refused as any other bad name unless
        # FifoQueue is true.
        raise SqsError(
            "InvalidParameterValue",
            "The name of a FIFO queue can only include alphanumeric characters, hyphens, or "
            "underscores, must end with .fifo suffix and be 1 to 80 in length." if fifo
            else "Can only include alphanumeric characters, hyphens, or underscores. "
            "1 to 80 in length",
        )
    ctx.needs.require(ctx.principal, "queue", [name])
    changes = queue_changes(ctx, given, fifo=fifo, creating=True)
    ctx.needs.require(ctx.principal, "dead_letter_queue", dead_letter_queues(changes))
    tags = param_str_map(params, "tags") or param_str_map(params, "Tags")
    check_tags(*tags, *tags.values())
    try:
        # SQS compares only the attributes given: an existing queue is returned
        # when each of them has the value asked for (a default given explicitly
        # included), whatever the others.
        await ctx.service.queues.create_queue(name, changes, tags, given_only=True)
    except QueueAlreadyExists as exc:
        raise SqsError(
            "QueueNameExists",
            "A queue already exists with the same name and a different value for attribute "
            f"{_differing(given, exc.differing)}",
        ) from exc
    except QueueError as exc:
        raise attribute_error(exc) from exc
    return {"QueueUrl": ctx.queue_url(name)}


def _differing(given: dict[str, str], differing: tuple[str, ...]) -> str:
    """The first attribute given whose value differs from the existing queue's."""
    for attribute in given:
        if set(ENGINE_NAMES.get(attribute, ())) & set(differing):
            return attribute
    # Each difference comes of an attribute given (FifoQueue's is refused before);
    # should none map, the first given.
    return next(iter(given), "")


async def get_queue_url(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = param_required(params, "QueueName")
    owner = param_str(params, "QueueOwnerAWSAccountId")
    if owner not in (None, ctx.account) or not limits.is_queue_name(name):
        raise SqsError("QueueDoesNotExist", NO_QUEUE)
    # Every worker asks for its queue's URL first: any scope on the queue will do.
    if not any(ctx.principal.allows(action, name) for action in SCOPE_ACTIONS):
        ctx.needs.require(ctx.principal, "queue", [name])
    await ctx.service.queues.get_queue(name)
    return {"QueueUrl": ctx.queue_url(name)}


def _token(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode()


def _after(token: str | None) -> str:
    if not token:
        return ""
    try:
        after = base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        after = ""
    if not limits.is_queue_name(after):
        raise SqsError("InvalidParameterValue", "Invalid NextToken.")
    return after


async def list_queues(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    prefix = param_str(params, "QueueNamePrefix") or ""
    limit = param_ranged(params, "MaxResults", 1, LIST_QUEUES_MAX)
    after = _after(param_str(params, "NextToken"))
    # A key sees the queues it may read, and only those are read: NextToken,
    # the page's last name, is never another key's queue.
    action = ctx.needs.on("listed") or "read"
    page = await ctx.service.queues.list_queues(
        prefix=prefix, after=after, limit=(limit or LIST_QUEUES_MAX) + 1,
        patterns=ctx.principal.patterns(action),
    )
    more = len(page) > (limit or LIST_QUEUES_MAX)
    page = page[: limit or LIST_QUEUES_MAX]
    shown = [q for q in page if ctx.principal.allows(action, q.name)]
    # No queue: SQS leaves QueueUrls out (not an empty list).
    result: dict[str, Any] = {"QueueUrls": [ctx.queue_url(q.name) for q in shown]} if shown else {}
    if more and limit is not None:
        result["NextToken"] = _token(page[-1].name)
    return result


async def delete_queue(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    await ctx.service.queues.delete_queue(
        queue_of(ctx, params), lambda name: ctx.principal.allows("read", name)
    )
    return {}


async def purge_queue(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    await ctx.service.queues.purge(queue_of(ctx, params))
    return {}


async def list_dead_letter_source_queues(
    ctx: Context, params: dict[str, Any]
) -> dict[str, Any]:
    name = queue_of(ctx, params)
    limit = param_ranged(params, "MaxResults", 1, LIST_QUEUES_MAX)
    after = _after(param_str(params, "NextToken"))
    # Only the sources the key may read: the others are other keys' queues.
    sources = [s for s in await ctx.service.queues.dead_letter_sources(name)
               if s > after and ctx.principal.allows("read", s)]
    page = sources[: limit or LIST_QUEUES_MAX]
    result: dict[str, Any] = {"queueUrls": [ctx.queue_url(s) for s in page]}
    if limit is not None and len(sources) > len(page):
        result["NextToken"] = _token(page[-1])
    return result
