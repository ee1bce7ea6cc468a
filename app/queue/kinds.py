"""The kinds of queue, standard, fair and FIFO, each with its own statements and
rules. A queue's kind is chosen once, when the queue is read (`Queue.kind`);
the engine then asks its queue's kind and never branches on FIFO.

What a FIFO queue does differently, and why it has statements of its own:
its messages are in groups, and a group's messages are delivered one claim at
a time, in order. Its statements therefore keep the groups' turns and heads
beside the messages (queries.sql, "FIFO queues"): a claim reads the groups
whose turn has come from each one's last head, an acknowledgement, release
or lapse gives the group a turn, and a send takes the group's lock,
deduplicates and numbers its messages (docs/state-machine.md, "FIFO queues").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from app.db.connector import Connector
from app.db.queries import Query
from app.queue import grouped, grouped_fifo
from app.queue.group_commit import GroupCommit, Grouped, Statement
from app.queue.models import OutgoingMessage, Queue, QueueAttributes, SentMessage
from app.queue.receipts import Receipt
from app.queue.rows import ChangedRow, FifoClaimRow, FifoSentRow, ReplayedRow, SentRow
from app.queue.sending import fair_outgoing, fifo_outgoing, standard_outgoing
from app.queue.sql import Q
from app.queue.waiting import Ready


@dataclass(frozen=True, slots=True)
class QueueKind:
    name: str
    send: Grouped[tuple[int, int], Any, list[Any]]
    send_key: Callable[[Queue], tuple[int, int]]
    """What one send statement shares besides the queue (the key of its line)."""
    outgoing: Callable[[Queue, OutgoingMessage], Any]
    """A checked message as the kind's send statement takes it."""
    send_notice: Callable[[Queue, list[Any]], Ready]
    """What the send statement announced (in SQL), worked out again for this
    process's receivers while its LISTEN connection is down."""
    sent: Callable[[Any], SentMessage]
    """A send statement's row as its sender's answer."""
    claim: Grouped[grouped.ClaimKey, grouped.Take, grouped.Claimed]
    delete: Grouped[Queue, Receipt, grouped.Deleted]
    change: Grouped[int, grouped.Change, dict[int, ChangedRow]]
    give_back: Query[Any]
    """Undoes claims that reached no receiver (ids, claim tokens)."""
    on_change: Callable[[QueueAttributes, QueueAttributes], tuple[Query[Any], ...]]
    """Run (`queue_id`) in the transaction that changes the queue's attributes
    from the first to the second: what the change makes stale."""
    forget_on_purge: tuple[Query[Any], ...]
    """Run (`queue_id`) before a purge, in its transaction: what the purge
    forgets besides the messages."""
    outlook: Callable[[Queue], Statement]
    """When the next message becomes claimable, and whether one is now."""
    received_fields: Callable[[Any], dict[str, Any]]
    """What a claimed message carries beyond a standard queue's, from the row
    of the kind's claim (or of a replayed receive attempt)."""
    acks_ride_claims: bool
    """Whether a claim's statement may also delete a worker's acknowledgements.
    A FIFO receive settles them first (its claim has no acknowledgement step)."""
    remembers_attempts: bool
    """Whether a receive request attempt id replays what its first try claimed
    (SQS's ReceiveRequestAttemptId; a standard queue ignores it, as SQS does)."""


def _sent(row: SentRow) -> SentMessage:
    return SentMessage(message_id=str(row["message_id"]), sent_at=row["sent_at"])


def _sent_in_sequence(row: FifoSentRow) -> SentMessage:
    return SentMessage(
        message_id=str(row["message_id"]), sent_at=row["sent_at"],
        sequence_number=str(row["sequence_number"]),
    )


def _in_group(row: FifoClaimRow | ReplayedRow) -> dict[str, Any]:
    return {
        "group_id": row["group_id"],
        "sequence_number": str(row["sequence_number"]),
        "deduplication_id": row["deduplication_id"],
    }


STANDARD = QueueKind(
    name="standard",
    send=grouped.SEND,
    send_key=lambda queue: (queue.id, queue.attributes.message_retention),
    outgoing=standard_outgoing,
    send_notice=lambda queue, rows: grouped.send_notice(queue.id, rows),
    sent=_sent,
    claim=grouped.CLAIM,
    delete=grouped.DELETE,
    change=grouped.CHANGE,
    give_back=Q.give_back_claims,
    on_change=lambda old, new: (),
    forget_on_purge=(),
    outlook=lambda queue: (Q.queue_outlook, {
        "queue_id": queue.id, "retention": queue.attributes.message_retention,
        **queue.floors.params(),
    }),
    # A fair queue's message that named no tenant has the tenant '': none.
    received_fields=lambda row: {"group_id": row["tenant"]} if row["tenant"] else {},
    acks_ride_claims=True,
    remembers_attempts=False,
)

FAIR = replace(
    STANDARD,
    name="fair",
    outgoing=fair_outgoing,
    claim=grouped.CLAIM_FAIR,
    delete=grouped.DELETE_FAIR,
    # A fair queue's floors are under its turns, not its messages: the outlook
    # reads the messages from the start.
    outlook=lambda queue: (Q.queue_outlook, {
        "queue_id": queue.id, "retention": queue.attributes.message_retention,
        "ready_floor": None, "lease_floor": None,
    }),
    change=grouped.CHANGE_FAIR,
    give_back=Q.give_back_fair_claims,
    forget_on_purge=(Q.forget_turns,),
)
"""A standard queue whose messages name tenants (`fair`, set by the first such
message): its claims take quiet tenants' messages first (docs/fair-queues.md),
finding the tenants through their turns (`leaseq.turns`), which every
statement that sets a message's deadline inserts: its visibility changes and
give-backs are its own, and a purge forgets the turns first. A message naming
no tenant is stored with the tenant '', its own."""

FIFO = QueueKind(
    name="fifo",
    send=grouped_fifo.SEND_FIFO,
    send_key=lambda queue: (queue.id, queue.attributes.delay),
    outgoing=fifo_outgoing,
    send_notice=lambda queue, rows: grouped_fifo.fifo_send_notice(
        queue.id, queue.attributes.delay, rows
    ),
    sent=_sent_in_sequence,
    claim=grouped_fifo.CLAIM_FIFO,
    delete=grouped_fifo.DELETE_FIFO,
    change=grouped_fifo.CHANGE_FIFO,
    give_back=Q.give_back_fifo_claims,
    on_change=lambda old, new: (
        # Its messages count the delay from their sending: a shorter one may
        # make groups claimable before their turns.
        ((Q.turn_groups_now,) if new.delay < old.delay else ())
        # A claim passes messages past retention when it learns a group's head.
        + ((Q.forget_heads,) if new.message_retention > old.message_retention else ())
    ),
    forget_on_purge=(Q.forget_turns, Q.forget_deduplication),
    outlook=lambda queue: (Q.fifo_outlook, {
        "queue_id": queue.id, "ready_floor": queue.floors.ready,
    }),
    received_fields=_in_group,
    acks_ride_claims=False,
    remembers_attempts=True,
)

KINDS = (STANDARD, FAIR, FIFO)


def kind_of(attributes: QueueAttributes) -> QueueKind:
    if attributes.fifo:
        return FIFO
    return FAIR if attributes.fair else STANDARD


def group_commit(db: Connector) -> GroupCommit:
    """Every kind's message statements, each grouped per queue. Heartbeats may
    hold two fifths of the cached-plan pool (GroupCommit's budget)."""
    statements = list(dict.fromkeys(
        statement for kind in KINDS
        for statement in (kind.send, kind.claim, kind.delete, kind.change)
    ))
    return GroupCommit(db, statements, budget=max(1, db.cached_pool_size * 2 // 5))
