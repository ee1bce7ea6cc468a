"""The message cycle's grouped statements: what each array statement of
queries.sql takes from a group of requests, and how its rows go back to them.

GroupCommit (group_commit.py) runs these; the message operations (service.py)
submit their items to them. Every function here is pure: items in, parameters
out; rows in, shares out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol, TypeVar

from app.db.connector import Row
from app.db.queries import Query
from app.queue.group_commit import Grouped, Statement
from app.queue.models import Queue
from app.queue.receipts import Receipt
from app.queue.rows import (
    ChangedRow,
    ClaimColumns,
    DeletedRow,
    MessageColumns,
    SentRow,
)
from app.queue.sql import Q
from app.queue.waiting import Ready

GROUP_ITEMS = 500
"""Most claims, acknowledgements or visibility changes one statement carries."""

GROUP_SEND_BYTES = 4 * 1024 * 1024
"""Most body and attribute bytes one INSERT carries (a larger send runs alone)."""

R = TypeVar("R")


class Outgoing(NamedTuple):
    """A validated message as the INSERT takes it."""

    body: str
    attributes: str
    attribute_types: str | None
    sender_id: str | None
    delay: int
    not_before: datetime | None
    trace_header: str | None = None  # SQS's AWSTraceHeader (NULL for nearly every message)
    tenant: str | None = None  # the message's group on a standard queue (fair queues)


class Change(NamedTuple):
    """A visibility change: the claim it is for, and the new visibility timeout."""

    claim: Receipt
    visibility_timeout: int


class Take(NamedTuple):
    """A receiver's part of a claim: how many messages, and the claims whose
    messages it acknowledges in the same statement."""

    wanted: int
    acks: tuple[Receipt, ...] = ()


Deleted = Mapping[int, float | None]
"""Rows deleted by acknowledgement -> their lease held time in seconds, measured by
the database (None for a claim made before claims were timed)."""


class Claimed(NamedTuple):
    """A receiver's share of a claim, how many messages the statement
    dead-lettered instead (shared by the group: a reason to claim again), and
    the rows of its acknowledgements that were deleted."""

    rows: list[ClaimColumns]
    dead: int
    acked: Deleted = MappingProxyType({})


SendKey = tuple[int, int]  # queue id, retention
ClaimKey = tuple[Queue, int]  # queue, visibility timeout


def claim_params(queue: Queue, visibility_timeout: int, takes: list[Take]) -> dict[str, Any]:
    acks = [ack for take in takes for ack in take.acks]
    return {
        "queue_id": queue.id,
        "visibility_timeout": visibility_timeout,
        "retention": queue.attributes.message_retention,
        "max": sum(take.wanted for take in takes),
        "dead_letter_queue_id": queue.dead_letter_queue_id,
        "max_receive_count": queue.attributes.max_receive_count,
        "ack_ids": [ack.message_row for ack in acks],
        "ack_tokens": [ack.claim_token for ack in acks],
        **queue.floors.params(),
    }


def dead_letter_notice(queue: Queue, dead: int) -> Statement | None:
    """Wakes the dead-letter queue's receivers for what a claim moved there."""
    if not dead or queue.dead_letter_queue_id is None:
        return None
    return notify(Ready(queue.dead_letter_queue_id, dead))


def notify(notice: Ready) -> Statement:
    """The NOTIFY that tells every process's receivers of `notice`."""
    return Q.notify_ready, notice._asdict()


def visibility_notice(queue_id: int, rows: Sequence[ChangedRow]) -> Ready | None:
    """Releases wake receivers now; a lease shortened (rare) sets their timer."""
    ready = sum(1 for row in rows if row["visibility_timeout"] == 0)
    due_in = min(
        (row["visibility_timeout"] for row in rows
         if row["sooner"] and row["visibility_timeout"] > 0),
        default=None,
    )
    if not ready and due_in is None:
        return None
    return Ready(queue_id, ready, due_in)


def send_notice(queue_id: int, rows: Sequence[SentRow]) -> Ready:
    """What send_messages announced (in SQL) of these rows."""
    dues = [float(row["due_in"]) for row in rows]
    return Ready(
        queue_id,
        ready=sum(1 for due in dues if due <= 0),
        due_in=min((due for due in dues if due > 0), default=None),
    )


def in_order(rows: list[R], groups: list[list[Any]]) -> list[list[R]]:
    shares = []
    start = 0
    for group in groups:
        shares.append(rows[start:start + len(group)])
        start += len(group)
    return shares


def _send_params(key: SendKey, flat: list[Outgoing]) -> Mapping[str, Any]:
    queue_id, retention = key
    return {
        "queue_id": queue_id,
        "retention": retention,
        "bodies": [m.body for m in flat],
        "attributes": [m.attributes for m in flat],
        "attribute_types": [m.attribute_types for m in flat],
        "sender_ids": [m.sender_id for m in flat],
        "delays": [m.delay for m in flat],
        "not_befores": [m.not_before for m in flat],
        "trace_headers": [m.trace_header for m in flat],
        "tenants": [m.tenant for m in flat],
    }


class Weighed(Protocol):
    """What a send's weight is counted from (Outgoing, grouped_fifo.FifoOutgoing)."""

    @property
    def body(self) -> str: ...
    @property
    def attributes(self) -> str: ...
    @property
    def trace_header(self) -> str | None: ...


def send_weight(items: Sequence[Weighed]) -> int:
    return sum(len(m.body) + len(m.attributes) + len(m.trace_header or "") + 64 for m in items)


def _send_query(key: SendKey, flat: list[Outgoing]) -> Query[Any]:
    """send_untenanted_messages unless a message names a tenant."""
    tenanted = any(m.tenant is not None for m in flat)
    return Q.send_messages if tenanted else Q.send_untenanted_messages


SEND: Grouped[SendKey, Outgoing, list[SentRow]] = Grouped(
    name="send",
    query=Q.send_messages,
    variant=_send_query,
    params=_send_params,
    share=in_order,
    limit=GROUP_SEND_BYTES,
    weigh=send_weight,
)
"""Durable on return: the INSERT carrying them has committed."""


def _dead(rows: list[Row]) -> int:
    """Messages a claim moved to the dead-letter queue (claim_ready_messages
    moves none, and says nothing)."""
    return int(rows[0].get("dead", 0)) if rows else 0


def _claim_share(rows: list[Any], groups: list[list[Take]]) -> list[Claimed]:
    dead = _dead(rows)
    acked = dict(zip(rows[0].get("acked", ()), rows[0].get("acked_held", ()), strict=True)
                 ) if rows else {}
    # First come, first served, in the claim's (fencing token) order.
    claimed = sorted((row for row in rows if row["id"] is not None),
                     key=lambda row: row["fencing_token"])
    shares = []
    for (take,) in groups:
        mine = {ack.message_row: acked[ack.message_row] for ack in take.acks
                if ack.message_row in acked}
        shares.append(Claimed(claimed[:take.wanted], dead, mine))
        claimed = claimed[take.wanted:]
    return shares


def give_back(queue: Queue, claims: Sequence[Receipt]) -> Statement | None:
    """Undoes `claims`, which reached no receiver (the queue kind's give_back: a
    FIFO queue's frees their groups too)."""
    if not claims:
        return None
    return queue.kind.give_back, {
        "queue_id": queue.id,
        "ids": [claim.message_row for claim in claims],
        "tokens": [claim.claim_token for claim in claims],
    }


def claims_of(queue_id: int, rows: Sequence[MessageColumns]) -> list[Receipt]:
    """The claims of claimed rows."""
    return [Receipt(queue_id, row["id"], row["claim_token"]) for row in rows]


def _claim_query(key: ClaimKey, takes: list[Take]) -> Query[Any]:
    """claim_ready_messages when nothing rides on the claim and nothing can die;
    each from the waiting range alone unless this claim reports the floors."""
    queue = key[0]
    report = queue.floors.report_due()
    if queue.attributes.max_receive_count is None and not any(take.acks for take in takes):
        return Q.claim_ready_messages if report else Q.claim_ready_waiting_messages
    return Q.claim_messages if report else Q.claim_waiting_messages


def _learn_floors(key: ClaimKey, takes: list[Take], rows: list[Any]) -> None:
    queue, visibility_timeout = key
    short = sum(1 for row in rows if row["id"] is not None) < sum(take.wanted for take in takes)
    queue.floors.learn(rows[0] if rows else None, full_next=short or visibility_timeout == 0)


CLAIM: Grouped[ClaimKey, Take, Claimed] = Grouped(
    name="claim",
    query=Q.claim_messages,
    params=lambda key, takes: claim_params(key[0], key[1], takes),
    share=_claim_share,
    limit=GROUP_ITEMS,
    weigh=lambda takes: sum(take.wanted + len(take.acks) for take in takes),
    rows=lambda take: (ack.message_row for ack in take.acks),
    then=lambda key, rows: dead_letter_notice(key[0], _dead(rows)),
    undo=lambda key, share: give_back(key[0], claims_of(key[0].id, share.rows)),
    variant=_claim_query,
    seen=_learn_floors,
)


def _fair_claim_params(key: ClaimKey, takes: list[Take]) -> dict[str, Any]:
    """claim_params, and the tenants this process counts noisy itself
    (app/queue/tally.py) until the fairness round has judged them."""
    queue = key[0]
    noisy = queue.tally.noisy(queue.id, queue.attributes.fairness)
    return {
        **claim_params(queue, key[1], takes),
        "noisy_tenants": list(noisy),
        "noisy_in_flight": list(noisy.values()),
    }


def _fair_claim_seen(key: ClaimKey, takes: list[Take], rows: list[Any]) -> None:
    """The floor of the queue's turns; what the claim handed out, and the
    processing time of what it acknowledged (app/queue/tally.py)."""
    queue = key[0]
    if not rows:
        return
    queue.floors.learn(rows[0], full_next=True)
    queue.tally.add(queue.id, zip(rows[0]["acked_tenants"], rows[0]["acked_held"], strict=True))
    queue.tally.handed_out(queue.id, (row["tenant"] for row in rows if row["id"] is not None))


CLAIM_FAIR: Grouped[ClaimKey, Take, Claimed] = Grouped(
    name="claim_fair",
    query=Q.claim_fair_messages,
    params=_fair_claim_params,
    share=_claim_share,
    limit=GROUP_ITEMS,
    weigh=CLAIM.weigh,
    rows=CLAIM.rows,
    then=CLAIM.then,
    undo=CLAIM.undo,
    seen=_fair_claim_seen,
)
"""A fair queue's claim (quiet tenants first): one statement whatever rides on it."""


def _delete_share(rows: list[DeletedRow], groups: list[list[Receipt]]) -> list[Deleted]:
    deleted = {row["id"]: row["held"] for row in rows}
    return [
        {h.message_row: deleted[h.message_row] for h in group if h.message_row in deleted}
        for group in groups
    ]


DELETE: Grouped[Queue, Receipt, Deleted] = Grouped(
    name="delete",
    query=Q.delete_messages,
    params=lambda queue, flat: {
        "queue_id": queue.id,
        "ids": [h.message_row for h in flat],
        "tokens": [h.claim_token for h in flat],
    },
    share=_delete_share,
    limit=GROUP_ITEMS,
    rows=lambda h: (h.message_row,),
)
"""The rows deleted, of those asked for."""

DELETE_FAIR: Grouped[Queue, Receipt, Deleted] = Grouped(
    name="delete_fair",
    query=Q.delete_fair_messages,
    params=DELETE.params,
    share=_delete_share,
    limit=GROUP_ITEMS,
    rows=DELETE.rows,
    seen=lambda queue, flat, rows: queue.tally.add(
        queue.id, ((row["tenant"], row["held"]) for row in rows)),
)
"""DELETE on a fair queue: each message's processing time summed for its tenant."""


def _change_share(
    rows: list[ChangedRow], groups: list[list[Change]]
) -> list[dict[int, ChangedRow]]:
    changed = {row["id"]: row for row in rows}
    return [
        {c.claim.message_row: changed[c.claim.message_row] for c in group
         if c.claim.message_row in changed}
        for group in groups
    ]


def _change_notice(queue_id: int, rows: list[ChangedRow]) -> Statement | None:
    notice = visibility_notice(queue_id, rows)
    return None if notice is None else notify(notice)


CHANGE: Grouped[int, Change, dict[int, ChangedRow]] = Grouped(
    name="change_visibility",
    query=Q.change_visibility,
    params=lambda queue_id, flat: {
        "queue_id": queue_id,
        "ids": [c.claim.message_row for c in flat],
        "tokens": [c.claim.claim_token for c in flat],
        "visibility_timeouts": [c.visibility_timeout for c in flat],
    },
    share=_change_share,
    limit=GROUP_ITEMS,
    rows=lambda c: (c.claim.message_row,),
    then=_change_notice,
    budgeted=True,
)
"""Row -> its changed row, for the rows whose claim held."""

CHANGE_FAIR: Grouped[int, Change, dict[int, ChangedRow]] = Grouped(
    name="change_fair_visibility",
    query=Q.change_fair_visibility,
    params=CHANGE.params,
    share=_change_share,
    limit=GROUP_ITEMS,
    rows=CHANGE.rows,
    then=_change_notice,
    budgeted=True,
)
"""CHANGE on a fair queue: a release or shorter lease lowers its tenant's bound."""
