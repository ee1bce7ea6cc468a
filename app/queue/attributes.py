"""Queue attributes: merging a change into the current set, and checking it.

A change is a mapping of attribute names to values; for the removable ones
(`dead_letter_queue`, `max_receive_count`, `retry_backoff`) a value of None
removes the attribute. Every front door (REST, SQS) goes through here, so a
queue rule is written once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.db.connector import Session
from app.errors import InvalidParameter, InvalidRedrivePolicy
from app.queue import limits
from app.queue.models import Fairness, QueueAttributes, RetryBackoff
from app.queue.sql import Q

NUMERIC: dict[str, tuple[int, int]] = {
    "visibility_timeout": limits.VISIBILITY_TIMEOUT,
    "message_retention": limits.MESSAGE_RETENTION,
    "delay": limits.DELAY,
    "receive_wait": limits.RECEIVE_WAIT,
    "max_message_bytes": limits.MAX_MESSAGE_BYTES,
}
REMOVABLE = ("dead_letter_queue", "max_receive_count", "retry_backoff")
# What only a FIFO queue has; `fifo` itself is fixed when the queue is created.
FIFO_ONLY: dict[str, tuple[Any, ...]] = {
    "content_based_deduplication": (True, False),
    "deduplication_scope": limits.DEDUPLICATION_SCOPES,
    "fifo_throughput_limit": limits.FIFO_THROUGHPUT_LIMITS,
}
# SQS: "the perMessageGroupId value is allowed only when the value for
# DeduplicationScope is messageGroup" (the SQS door answers it in its words).
THROUGHPUT_NEEDS_GROUP_SCOPE = (
    "fifo_throughput_limit per_message_group_id is allowed only when "
    "deduplication_scope is message_group."
)

DEFAULT = QueueAttributes(
    visibility_timeout=limits.DEFAULTS["visibility_timeout"],
    message_retention=limits.DEFAULTS["message_retention"],
    delay=limits.DEFAULTS["delay"],
    receive_wait=limits.DEFAULTS["receive_wait"],
    max_message_bytes=limits.DEFAULTS["max_message_bytes"],
)


def _check_backoff(backoff: RetryBackoff) -> None:
    for field_name, value, (low, high) in (
        ("initial", backoff.initial, limits.RETRY_SECONDS),
        ("multiplier", backoff.multiplier, limits.RETRY_MULTIPLIER),
        ("max", backoff.max, limits.RETRY_SECONDS),
        ("jitter", backoff.jitter, limits.RETRY_JITTER),
    ):
        if not low <= value <= high:
            raise InvalidParameter(
                f"retry_backoff.{field_name} must be between {low} and {high}, got {value}"
            )


def _fair(current: QueueAttributes | None, fifo: bool, fair: bool) -> bool:
    """`fair` as given: true makes a standard queue fair before its first
    message naming a tenant would; a fair queue stays fair."""
    if fair and fifo:
        raise InvalidParameter("fair is for standard queues: a FIFO queue has its own groups.")
    if not fair and current is not None and current.fair:
        raise InvalidParameter(
            "A fair queue stays fair: fair became true with its first message naming a tenant."
        )
    return fair or (current is not None and current.fair)


def _check_fairness(fairness: Fairness) -> None:
    for field_name, share in (
        ("in_flight_share", fairness.in_flight_share),
        ("processing_share", fairness.processing_share),
    ):
        if not limits.FAIR_SHARE[0] < share <= limits.FAIR_SHARE[1]:
            raise InvalidParameter(
                f"fairness.{field_name} must be more than 0 and at most 1, got {share}"
            )
    low, high = limits.FAIR_IN_FLIGHT_MIN
    if not low <= fairness.in_flight_min <= high:
        raise InvalidParameter(
            f"fairness.in_flight_min must be between {low} and {high}, "
            f"got {fairness.in_flight_min}"
        )


def merge(current: QueueAttributes | None, changes: dict[str, Any]) -> QueueAttributes:
    """The attributes after `changes`, checked; `current` None means a new queue."""
    unknown = (
        set(changes) - set(NUMERIC) - set(REMOVABLE) - set(FIFO_ONLY)
        - {"fifo", "fair", "fairness"}
    )
    if unknown:
        raise InvalidParameter(f"unknown queue attributes: {', '.join(sorted(unknown))}")
    fifo = (current or DEFAULT).fifo
    if "fifo" in changes and changes["fifo"] is not None:
        if current is not None and changes["fifo"] != current.fifo:
            raise InvalidParameter(
                "fifo is fixed when a queue is created: create a new queue instead."
            )
        fifo = bool(changes["fifo"])
    for name, allowed in FIFO_ONLY.items():
        value = changes.get(name)
        if value is None:
            continue
        if not fifo and value != getattr(DEFAULT, name):
            # A standard queue's own attributes given back as they read are not a change.
            raise InvalidParameter(f"{name} is for FIFO queues only.")
        if value not in allowed:
            raise InvalidParameter(
                f"{name} must be one of {', '.join(map(str, allowed))}, got {value!r}"
            )
    for name, bounds in NUMERIC.items():
        value = changes.get(name)
        if value is not None and not bounds[0] <= value <= bounds[1]:
            raise InvalidParameter(
                f"{name} must be between {bounds[0]} and {bounds[1]}, got {value}"
            )
    merged = replace(
        current or DEFAULT,
        fifo=fifo,
        **{
            k: v for k, v in changes.items()
            if (k in NUMERIC or k in FIFO_ONLY) and v is not None
        },
    )
    if (
        merged.fifo_throughput_limit == "per_message_group_id"
        and merged.deduplication_scope != "message_group"
        and (current is None or any(
            changes.get(name) is not None
            for name in ("fifo_throughput_limit", "deduplication_scope")
        ))
    ):
        # Judged on the attributes as they are after the change; a change of
        # neither leaves a queue stored before this rule as it was.
        raise InvalidParameter(THROUGHPUT_NEEDS_GROUP_SCOPE)
    if changes.get("fair") is not None:
        merged = replace(merged, fair=_fair(current, fifo, bool(changes["fair"])))
    fairness = changes.get("fairness")
    if fairness is not None:
        if fifo and fairness != DEFAULT.fairness:
            raise InvalidParameter(
                "fairness is for standard queues: a FIFO queue delivers each group in order."
            )
        _check_fairness(fairness)
        merged = replace(merged, fairness=fairness)
    if "retry_backoff" in changes:
        backoff = changes["retry_backoff"]
        if backoff is not None:
            _check_backoff(backoff)
        merged = replace(merged, retry_backoff=backoff)
    if "dead_letter_queue" in changes or "max_receive_count" in changes:
        dead_letter_queue = changes.get("dead_letter_queue", merged.dead_letter_queue) or None
        max_receive_count = changes.get("max_receive_count", merged.max_receive_count)
        if "dead_letter_queue" in changes and dead_letter_queue is None:
            # Removing the dead-letter queue removes the whole policy.
            max_receive_count = changes.get("max_receive_count")
        if max_receive_count is not None and not (
            limits.MAX_RECEIVE_COUNT[0] <= max_receive_count <= limits.MAX_RECEIVE_COUNT[1]
        ):
            raise InvalidParameter(
                f"max_receive_count must be between {limits.MAX_RECEIVE_COUNT[0]} and "
                f"{limits.MAX_RECEIVE_COUNT[1]}, got {max_receive_count}"
            )
        if (dead_letter_queue is None) != (max_receive_count is None):
            raise InvalidRedrivePolicy(
                "A redrive policy needs both dead_letter_queue and max_receive_count."
            )
        merged = replace(
            merged, dead_letter_queue=dead_letter_queue, max_receive_count=max_receive_count
        )
    return merged


REDRIVE_NOT_ALLOWED = "The dead-letter queue's redrive allow policy does not allow this queue."
"""A queue naming a dead-letter queue whose allowed sources leave it out (SQS's
RedriveAllowPolicy; the SQS door answers it in SQS's shape)."""


async def sql_values(
    session: Session, queue_name: str, attributes: QueueAttributes
) -> dict[str, Any]:
    """The columns for `attributes`, the dead-letter queue resolved (and locked
    against deletion until the transaction ends)."""
    dead_letter_queue_id = None
    if attributes.dead_letter_queue is not None:
        if attributes.dead_letter_queue == queue_name:
            raise InvalidRedrivePolicy("A queue cannot be its own dead-letter queue.")
        if not limits.is_queue_name(attributes.dead_letter_queue):
            raise InvalidRedrivePolicy(
                f"Dead-letter queue {attributes.dead_letter_queue!r} does not exist."
            )
        target = await session.fetchrow(
            Q.queue_id_by_name, {"name": attributes.dead_letter_queue}
        )
        if target is None:
            raise InvalidRedrivePolicy(
                f"Dead-letter queue {attributes.dead_letter_queue!r} does not exist."
            )
        if target["fifo"] != attributes.fifo:
            raise InvalidRedrivePolicy(
                "A dead-letter queue must be of the same type as its source: a FIFO "
                "queue's a FIFO queue, a standard queue's a standard one."
            )
        sources = target["redrive_sources"]
        if sources is not None and queue_name not in sources:
            raise InvalidRedrivePolicy(REDRIVE_NOT_ALLOWED)
        dead_letter_queue_id = target["id"]
    backoff = attributes.retry_backoff
    return {
        **{name: getattr(attributes, name) for name in NUMERIC},
        "dead_letter_queue_id": dead_letter_queue_id,
        "max_receive_count": attributes.max_receive_count,
        "retry_initial": backoff.initial if backoff else None,
        "retry_multiplier": backoff.multiplier if backoff else None,
        "retry_max": backoff.max if backoff else None,
        "retry_jitter": backoff.jitter if backoff else None,
        "fifo": attributes.fifo,
        **{name: getattr(attributes, name) for name in FIFO_ONLY},
        "fair_in_flight_share": attributes.fairness.in_flight_share,
        "fair_in_flight_min": attributes.fairness.in_flight_min,
        "fair_processing_share": attributes.fairness.processing_share,
    }
