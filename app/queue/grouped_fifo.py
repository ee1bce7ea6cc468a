"""A FIFO queue's grouped statements: what send_fifo_messages,
claim_fifo_messages and the FIFO settles take from a group of requests, and
how their rows go back to them (the standard ones are in grouped.py, whose
sharing these reuse). Pure, as grouped.py is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from app.queue.group_commit import Grouped
from app.queue.grouped import (
    CHANGE,
    DELETE,
    GROUP_ITEMS,
    GROUP_SEND_BYTES,
    Change,
    Claimed,
    ClaimKey,
    Deleted,
    Take,
    claims_of,
    dead_letter_notice,
    give_back,
    in_order,
    send_weight,
)
from app.queue.models import Queue
from app.queue.receipts import Receipt
from app.queue.rows import ChangedRow, FifoSentRow
from app.queue.sql import Q
from app.queue.waiting import Ready


class FifoOutgoing(NamedTuple):
    """A validated message for a FIFO queue, as send_fifo_messages takes it."""

    body: str
    attributes: str
    attribute_types: str | None
    sender_id: str | None
    group_id: str
    scope: str  # "" when deduplication is per queue, else the group
    deduplication_id: str
    trace_header: str | None = None


FifoSendKey = tuple[int, int]  # queue id, the queue's delay


def _first_of_each(flat: list[FifoOutgoing]) -> tuple[list[FifoOutgoing], list[int]]:
    """The messages a statement sends (the first of each deduplication id: one
    statement may not write one deduplication row twice), and for each message
    the index of the one that stands for it."""
    firsts: dict[tuple[str, str], int] = {}
    unique: list[FifoOutgoing] = []
    index: list[int] = []
    for message in flat:
        key = (message.scope, message.deduplication_id)
        if key not in firsts:
            firsts[key] = len(unique)
            unique.append(message)
        index.append(firsts[key])
    return unique, index


def _fifo_send_params(key: FifoSendKey, flat: list[FifoOutgoing]) -> Mapping[str, Any]:
    queue_id, delay = key
    unique, _ = _first_of_each(flat)
    return {
        "queue_id": queue_id,
        "delay": delay,
        "bodies": [m.body for m in unique],
        "attributes": [m.attributes for m in unique],
        "attribute_types": [m.attribute_types for m in unique],
        "sender_ids": [m.sender_id for m in unique],
        "group_ids": [m.group_id for m in unique],
        "scopes": [m.scope for m in unique],
        "deduplication_ids": [m.deduplication_id for m in unique],
        "trace_headers": [m.trace_header for m in unique],
    }


def _fifo_send_share(
    rows: list[FifoSentRow], groups: list[list[FifoOutgoing]]
) -> list[list[FifoSentRow]]:
    _, index = _first_of_each([m for group in groups for m in group])
    flat_rows = [rows[i] for i in index]
    return in_order(flat_rows, groups)


SEND_FIFO: Grouped[FifoSendKey, FifoOutgoing, list[FifoSentRow]] = Grouped(
    name="send_fifo",
    query=Q.send_fifo_messages,
    params=_fifo_send_params,
    share=_fifo_send_share,
    limit=GROUP_SEND_BYTES,
    weigh=send_weight,
)
"""Durable on return; a row per message: the one stored, or the one its
deduplication id named (`stored` false)."""


def fifo_claim_params(
    queue: Queue, visibility_timeout: int, takes: list[Take]
) -> dict[str, Any]:
    wants = [take.wanted for take in takes]
    return {
        "queue_id": queue.id,
        "visibility_timeout": visibility_timeout,
        "retention": queue.attributes.message_retention,
        "wants": wants,
        # Groups are dealt in turn, so a receiver may take one message from
        # each of as many groups as it wants messages; a few more for groups
        # that turn out not claimable.
        "lock_groups": sum(wants) + 10,
        "dead_letter_queue_id": queue.dead_letter_queue_id,
        "max_receive_count": queue.attributes.max_receive_count,
        "delay": queue.attributes.delay,
        "ready_floor": queue.floors.ready,
    }


def _fifo_claim_share(rows: list[Any], groups: list[list[Take]]) -> list[Claimed]:
    dead = int(rows[0]["dead"])
    claimed = sorted(
        (row for row in rows if row["id"] is not None),
        key=lambda row: (row["group_rank"], row["sequence_number"]),
    )
    return [
        Claimed([row for row in claimed if row["receiver"] == number], dead)
        for number in range(1, len(groups) + 1)
    ]


CLAIM_FIFO: Grouped[ClaimKey, Take, Claimed] = Grouped(
    name="claim_fifo",
    query=Q.claim_fifo_messages,
    params=lambda key, takes: fifo_claim_params(key[0], key[1], takes),
    share=_fifo_claim_share,
    limit=GROUP_ITEMS,
    weigh=lambda takes: sum(take.wanted for take in takes),
    then=lambda key, rows: dead_letter_notice(key[0], int(rows[0]["dead"])),
    undo=lambda key, share: give_back(key[0], claims_of(key[0].id, share.rows)),
    seen=lambda key, takes, rows: key[0].floors.learn(rows[0] if rows else None,
                                                       full_next=True),
)
"""A FIFO claim's takes carry no acknowledgements: they are settled first. It
reads the groups' turns from the queue's floor, as a fair claim does."""

DELETE_FIFO: Grouped[Queue, Receipt, Deleted] = Grouped(
    name="delete_fifo",
    query=Q.delete_fifo_messages,
    params=DELETE.params,
    share=DELETE.share,
    limit=GROUP_ITEMS,
    rows=lambda h: (h.message_row,),
)

CHANGE_FIFO: Grouped[int, Change, dict[int, ChangedRow]] = Grouped(
    name="change_fifo_visibility",
    query=Q.change_fifo_visibility,
    params=CHANGE.params,
    share=CHANGE.share,
    limit=GROUP_ITEMS,
    rows=lambda c: (c.claim.message_row,),
    then=CHANGE.then,
    budgeted=True,
)


def fifo_send_notice(queue_id: int, delay: int, rows: Sequence[FifoSentRow]) -> Ready:
    """What send_fifo_messages announces of these rows, about: the SQL wakes one
    receiver per group that got a message, this one per message stored."""
    stored = sum(1 for row in rows if row["stored"])
    if delay > 0:
        return Ready(queue_id, 0, float(delay) if stored else None)
    return Ready(queue_id, stored)
