"""The action table: every SQS action, mapped to its handler and to what it
touches (its declaration: the scopes it needs, app/auth/access.py). The
handlers work on the JSON protocol's shapes (a Query request is turned into
them first, app/sqs/protocol.py) and call QueueService and Redrives;
they validate SQS's request shapes only (names, types, batch rules): every queue
rule is the engine's. They live by concern: queues.py, attributes.py (attributes,
tags, permissions), messages.py, move_tasks.py; context.py reads parameters."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from app.auth.access import Needs
from app.sqs.attributes import (
    get_queue_attributes,
    list_queue_tags,
    set_queue_attributes,
    tag_queue,
    untag_queue,
)
from app.sqs.context import Context
from app.sqs.messages import (
    change_message_visibility,
    change_message_visibility_batch,
    delete_message,
    delete_message_batch,
    receive_message,
    send_message,
    send_message_batch,
)
from app.sqs.move_tasks import (
    cancel_message_move_task,
    list_message_move_tasks,
    start_message_move_task,
)
from app.sqs.permissions import add_permission, remove_permission
from app.sqs.queues import (
    create_queue,
    delete_queue,
    get_queue_url,
    list_dead_letter_source_queues,
    list_queues,
    purge_queue,
)

__all__ = ["ACTIONS", "NEEDS", "READ_ONLY", "Action", "Context"]

Action = Callable[[Context, dict[str, Any]], Awaitable[dict[str, Any]]]

ACTIONS: dict[str, Action] = {
    "CreateQueue": create_queue,
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "DeleteQueue": delete_queue,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "PurgeQueue": purge_queue,
    "TagQueue": tag_queue,
    "UntagQueue": untag_queue,
    "ListQueueTags": list_queue_tags,
    "ListDeadLetterSourceQueues": list_dead_letter_source_queues,
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message,
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
    "StartMessageMoveTask": start_message_move_task,
    "ListMessageMoveTasks": list_message_move_tasks,
    "CancelMessageMoveTask": cancel_message_move_task,
    "AddPermission": add_permission,
    "RemovePermission": remove_permission,
}

# What each action touches and the scope it needs there (app/auth/access.py):
# `queue` is the queue its QueueUrl (CreateQueue: its QueueName; a move task:
# its SourceArn) names.
NEEDS: dict[str, Needs] = {action: Needs.parse(texts) for action, texts in {
    "CreateQueue": ["admin:queue", "send:dead_letter_queue"],
    "GetQueueUrl": ["read:queue"],  # or any other scope on it: every worker asks first
    "ListQueues": ["read:listed"],
    "DeleteQueue": ["admin:queue"],
    "GetQueueAttributes": ["read:queue"],
    "SetQueueAttributes": ["admin:queue", "send:dead_letter_queue"],
    "PurgeQueue": ["admin:queue"],
    "TagQueue": ["admin:queue"],
    "UntagQueue": ["admin:queue"],
    "ListQueueTags": ["read:queue"],
    "ListDeadLetterSourceQueues": ["read:queue"],
    "SendMessage": ["send:queue"],
    "SendMessageBatch": ["send:queue"],
    "ReceiveMessage": ["receive:queue"],
    "DeleteMessage": ["receive:queue"],
    "DeleteMessageBatch": ["receive:queue"],
    "ChangeMessageVisibility": ["receive:queue"],
    "ChangeMessageVisibilityBatch": ["receive:queue"],
    "StartMessageMoveTask": ["admin:queue", "send:redrive_targets"],
    "ListMessageMoveTasks": ["read:queue"],
    "CancelMessageMoveTask": ["admin:task"],
    "AddPermission": ["admin:queue"],
    "RemovePermission": ["admin:queue"],
}.items()}
assert NEEDS.keys() == ACTIONS.keys()

# The actions that change nothing. Others (ReceiveMessage too: it takes a
# lease) are refused over a GET whose signature is not in its URL
# (app/sqs/routes.py; docs/decisions.md).
READ_ONLY = frozenset({
    "GetQueueUrl", "ListQueues", "GetQueueAttributes", "ListQueueTags",
    "ListDeadLetterSourceQueues", "ListMessageMoveTasks",
})
assert READ_ONLY <= ACTIONS.keys()
