"""The queues a request reaches besides the one it names, and the scope each needs.

A key is checked against every queue its request can write into or read from,
not only the queue in its path or QueueUrl: a redrive policy sends exhausted
messages into its dead-letter queue, and a redrive moves messages into its
destination (or back into the queues they came from). Each of those queues
needs `send` (which `admin` on it also grants). Both doors call these with the
attribute changes and redrive targets they parsed, before anything is changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.auth.scopes import Principal

Need = tuple[str, str]
"""(action, queue): one scope a request needs."""


def of_attribute_changes(changes: Mapping[str, Any]) -> list[Need]:
    """A queue's new attributes reach its dead-letter queue: `send` there."""
    dead_letter_queue = changes.get("dead_letter_queue")
    return [("send", dead_letter_queue)] if dead_letter_queue else []


def of_redrive(destinations: Iterable[str]) -> list[Need]:
    """A redrive writes into its destination, or into each queue its messages
    came from: `send` on every one."""
    return [("send", queue) for queue in sorted(set(destinations))]


def require_all(principal: Principal, needs: Iterable[Need]) -> None:
    """Forbidden unless the key holds every scope; checks nothing for the open service."""
    for action, queue in needs:
        principal.require(action, queue)
