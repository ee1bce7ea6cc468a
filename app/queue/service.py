"""The message operations: send, receive (and waiting), visibility, release,
acknowledge and checkpoint; the operators' peek (peeking.py) through it too.

QueueService is what the front doors (REST, SQS) call; they translate its
LeaseqError tree into their own error shapes. Nothing here knows HTTP. It
holds the queue catalog (`service.queues`, catalog.py) and runs its statements
through the connector, the cycle's array statements through group commit.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from app.config import Settings
from app.db.connector import Connector, ConstraintViolation
from app.errors import InvalidReceiptHandle, LeaseLost, Overloaded, QueueNotFound
from app.queue import grouped, limits, peeking
from app.queue.attempts import ReceiveAttempts
from app.queue.catalog import QueueCatalog, check_range
from app.queue.claimed import claimed
from app.queue.events import QueueEvents
from app.queue.group_commit import GroupCommit
from app.queue.grouped import Change, Deleted
from app.queue.models import (
    EntryError,
    Lease,
    OutgoingMessage,
    PeekedMessage,
    Queue,
    ReceivedMessage,
    Released,
    SentMessage,
)
from app.queue.receipts import Receipt, ReceiptSigner
from app.queue.receiving import Gone, Receive, check_receive
from app.queue.rows import ChangedRow, ClaimColumns
from app.queue.sending import accept
from app.queue.settling import Settled, acknowledged, check_settling
from app.queue.sql import Q
from app.queue.waiting import Ready, WaitHub

_log = logging.getLogger(__name__)

_DEAD_LETTER_ROUNDS = 10
"""Most claims one receive repeats while exhausted messages fill its batches."""


class QueueService:
    """Every message operation; the queues themselves are `queues`."""

    def __init__(
        self,
        db: Connector,
        queues: QueueCatalog,
        hub: WaitHub,
        signer: ReceiptSigner,
        *,
        group: GroupCommit,
        events: QueueEvents,
        pool_wait_seconds: float = Settings.model_fields["pool_wait_seconds"].default,
    ) -> None:
        self._db = db
        self.queues = queues
        self._hub = hub
        self._signer = signer
        self._attempts = ReceiveAttempts(db, signer)
        self._background: set[asyncio.Task[Any]] = set()
        self.group = group
        """The message cycle's statements, grouped (kinds.group_commit)."""
        self.events = events
        """Told each operation's outcome (the metrics)."""
        self.pool_wait_seconds = pool_wait_seconds
        """Longest a visibility change waits for its share of the pool (the
        engine's pool timeout bounds every other wait for a connection)."""

    async def ping(self) -> None:
        await self._db.ping()

    # -- plumbing -----------------------------------------------------------

    async def _give_back(self, queue: Queue, claims: list[Receipt]) -> None:
        """Undoes claims that will reach no receiver (their request was cancelled,
        or its client left), so they are visible again at once rather than after
        a whole lease; should that fail, the leases run out instead. The claims a
        grouped statement made for a request cancelled while it ran are given
        back by group commit (`Grouped.undo`), with the same statement."""
        statement = grouped.give_back(queue, claims)
        if statement is None:
            return
        try:
            await self._db.fetch(*statement)
        except Exception:
            _log.warning("could not give back an abandoned claim", exc_info=True)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Runs `work` past the request that asked for it (one being cancelled)."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _notify_here(self, notice: Callable[[], Ready | None]) -> None:
        # The committed NOTIFY reaches this process's listener too; only while
        # that is down must the local receivers be told directly (and only then
        # is the notice worked out: this runs for every send and heartbeat).
        if not self._hub.listening:
            told = notice()
            if told is not None:
                self._hub.announce(told)

    # -- messages -----------------------------------------------------------

    async def send(
        self, name: str, messages: Sequence[OutgoingMessage]
    ) -> list[SentMessage | EntryError]:
        """Send a batch in one transaction; oversized entries fail on their own.

        Returns only after the commit: a SentMessage is durable.
        """
        try:
            return await self._send(name, messages)
        except ConstraintViolation as exc:
            # The queue was deleted (by another process) after it was cached here.
            self.queues.forget(name)
            raise QueueNotFound(f"Queue {name!r} does not exist.") from exc

    async def _send(
        self, name: str, messages: Sequence[OutgoingMessage]
    ) -> list[SentMessage | EntryError]:
        queue = await self.queues.find(name)
        if (not queue.attributes.fair and not queue.attributes.fifo
                and any(message.group_id is not None for message in messages)):
            queue = await self.queues.make_fair(name)
        kind = queue.kind
        results, accepted, outgoing = accept(queue, messages, kind.outgoing)
        if outgoing:
            rows = await self.group.run(kind.send, kind.send_key(queue), outgoing)
            self._notify_here(lambda: kind.send_notice(queue, rows))
            self.events.sent(queue.name, len(rows))
            for index, row in zip(accepted, rows, strict=True):
                results[index] = kind.sent(row)
        return [result for result in results if result is not None]

    async def _claim(
        self, queue: Queue, visibility_timeout: int, count: int
    ) -> list[ReceivedMessage]:
        """Claim up to `count` messages with whoever else claims from this queue
        now (group commit). Under a redrive policy, exhausted candidates are
        dead-lettered by the claim itself, and the claim is repeated to fill the
        batch from what is left."""
        received, _ = await self._claim_acking(queue, visibility_timeout, count, ())
        return received

    async def _claim_acking(
        self,
        queue: Queue,
        visibility_timeout: int,
        count: int,
        acks: tuple[Receipt, ...],
    ) -> tuple[list[ReceivedMessage], Deleted]:
        """_claim, whose first statement also deletes the messages of `acks`
        (conditional on each claim); with the rows it deleted."""
        received: list[ReceivedMessage] = []
        taken: list[Receipt] = []  # claimed by earlier rounds
        acked: dict[int, float | None] = {}
        claim = queue.kind.claim
        assert queue.kind.acks_ride_claims or not acks
        for _ in range(_DEAD_LETTER_ROUNDS):
            take = grouped.Take(count - len(received), acks)
            acks = ()  # only the first round carries them
            try:
                share = await self.group.run(claim, (queue, visibility_timeout), [take])
            except asyncio.CancelledError:
                # This round's share is given back by group commit; the
                # earlier rounds' are this receive's to give back.
                self._in_background(self._give_back(queue, taken))
                raise
            taken.extend(grouped.claims_of(queue.id, share.rows))
            acked.update(share.acked)
            self._tell_claimed(queue, share.rows, share.dead, visibility_timeout)
            received.extend(
                claimed(queue, row, visibility_timeout, self._signer) for row in share.rows
            )
            if share.dead == 0 or len(received) >= count:
                break
        return received, acked

    def _tell_claimed(
        self, queue: Queue, rows: list[ClaimColumns], dead: int, visibility_timeout: int
    ) -> None:
        if rows:
            self.events.received(
                queue.name, len(rows), visibility_timeout, sum(1 for row in rows if row["lapsed"]),
                [(row["first_received_at"] - row["sent_at"]).total_seconds()
                 for row in rows if row["receive_count"] == 1],
            )
        if dead:
            self.events.dead_lettered(queue.name, dead)

    async def receive(
        self,
        name: str,
        *,
        max_messages: int = 1,
        visibility_timeout: int | None = None,
        wait: int | None = None,
        gone: Gone | None = None,
        attempt_id: str | None = None,
    ) -> list[ReceivedMessage]:
        """Claim up to max_messages; with wait > 0, wait for them without a connection.

        `gone` is set when the client has disconnected: then nothing more is
        claimed (a claim for a gone client is a message stuck for a whole lease).
        `attempt_id` comes checked by the door (each refuses a bad one in its
        own words, before anything else of the request is done).
        """
        check_receive(max_messages, visibility_timeout, wait)
        if attempt_id is not None:
            received = await self._attempt(
                name, attempt_id, max_messages=max_messages,
                visibility_timeout=visibility_timeout, wait=wait, gone=gone,
            )
        else:
            receive = Receive(
                self._db, self.queues, self._hub, self._claim, name,
                max_messages=max_messages, visibility_timeout=visibility_timeout, wait=wait,
                gone=gone,
            )
            received = await receive.run()
        if received and gone is not None and gone.is_set():
            # The client went while the claim's statement ran.
            queue = await self.queues.find(name)
            await self._give_back(
                queue, [m.claim for m in received]
            )
            return []
        if not received:
            self.events.empty_receive(name)
        return received

    async def _attempt(
        self,
        name: str,
        attempt_id: str,
        *,
        max_messages: int,
        visibility_timeout: int | None,
        wait: int | None,
        gone: Gone | None,
    ) -> list[ReceivedMessage]:
        """A receive with a receive request attempt id (attempts.py): replayed,
        or claimed anew and remembered. A standard queue ignores the id (as SQS)."""
        queue = await self.queues.find(name)
        receive = Receive(
            self._db, self.queues, self._hub, self._claim, name,
            max_messages=max_messages, visibility_timeout=visibility_timeout, wait=wait,
            gone=gone,
        )
        if not queue.kind.remembers_attempts:
            return await receive.run()
        replayed = await self._attempts.replay(queue, attempt_id)
        if replayed:
            return replayed
        received = await receive.run()
        await self._attempts.record(queue, attempt_id, received)
        return received

    async def settle(
        self, name: str, delete: Sequence[str], extend: Sequence[tuple[str, int]]
    ) -> tuple[list[EntryError | None], list[Lease | EntryError]]:
        """What a worker finished (`delete`) and what it still holds (`extend`:
        handle, visibility timeout), applied together as a receive brings them:
        each through its grouped statement, both at once. One result per entry."""
        check_settling(delete, extend)
        if not extend:  # the common case: no task to run both at once
            return (await self.delete(name, delete) if delete else []), []
        if not delete:
            return [], await self.change_visibility(name, extend)
        deleted, extended = await asyncio.gather(
            self.delete(name, delete), self.change_visibility(name, extend)
        )
        return deleted, extended

    async def settle_and_receive(
        self,
        name: str,
        delete: Sequence[str],
        extend: Sequence[tuple[str, int]],
        *,
        max_messages: int = 1,
        visibility_timeout: int | None = None,
        wait: int | None = None,
        gone: Gone | None = None,
    ) -> Settled:
        """A worker's receive: settle (see above), then receive, the
        acknowledgements and extensions applied and committed before the claim;
        for a short poll of a known queue that extends nothing, by the claim's
        own statement: the acknowledgements deleted and the messages claimed in
        one statement (claim_messages)."""
        check_receive(max_messages, visibility_timeout, wait)
        check_settling(delete, extend)
        queue = self.queues.cached(name)
        one_statement = (
            queue is not None and bool(delete) and not extend and queue.kind.acks_ride_claims
            and (queue.attributes.receive_wait if wait is None else wait) == 0
            and not (gone is not None and gone.is_set())
        )
        if queue is None or not one_statement:
            deleted, extended = await self.settle(name, delete, extend)
            received = await self.receive(
                name, max_messages=max_messages, visibility_timeout=visibility_timeout,
                wait=wait, gone=gone,
            )
            return Settled(received, deleted, extended)
        receipts = self._signer.decode_all(delete, queue_id=queue.id)
        acks = tuple(
            r for r in receipts if isinstance(r, Receipt)
        )
        if visibility_timeout is None:
            visibility_timeout = queue.attributes.visibility_timeout
        received, acked = await self._claim_acking(
            queue, visibility_timeout, max_messages, acks
        )
        if not received:
            self.events.empty_receive(name)
        return Settled(received, self._results_told(queue, receipts, acked), [])

    async def change_visibility(
        self, name: str, entries: Sequence[tuple[str, int]]
    ) -> list[Lease | EntryError]:
        """Heartbeat (visibility timeout > 0) or release (0) each (handle, timeout)."""
        for _, visibility_timeout in entries:
            check_range("timeout", visibility_timeout, limits.VISIBILITY_TIMEOUT)
        queue = await self.queues.find(name)
        receipts = self._signer.decode_all(
            [handle for handle, _ in entries], queue_id=queue.id
        )
        valid = [
            Change(r, visibility_timeout)
            for r, (_, visibility_timeout) in zip(receipts, entries, strict=True)
            if isinstance(r, Receipt)
        ]
        changed = await self._change_within_budget(queue, valid) if valid else {}
        self._tell_changed(queue, valid, changed)
        results: list[Lease | EntryError] = []
        for receipt, (_, visibility_timeout) in zip(receipts, entries, strict=True):
            if isinstance(receipt, InvalidReceiptHandle):
                results.append(EntryError(receipt))
            elif receipt.message_row in changed:
                row = changed[receipt.message_row]
                results.append(Lease(
                    visibility_timeout=visibility_timeout,
                    lease_expires_at=row["lease_expires_at"],
                ))
            else:
                results.append(EntryError(LeaseLost()))
        return results

    def _tell_changed(
        self, queue: Queue, changes: list[Change], changed: dict[int, ChangedRow]
    ) -> None:
        lost = len(changes) - len(changed)
        released = sum(
            1 for c in changes if c.visibility_timeout == 0 and c.claim.message_row in changed
        )
        if lost:
            self.events.lease_lost(queue.name, lost)
        if released:
            self.events.released(queue.name, released)
        if len(changed) > released:
            self.events.extended(queue.name, len(changed) - released)

    async def _change_within_budget(
        self, queue: Queue, changes: list[Change]
    ) -> dict[int, ChangedRow]:
        """Visibility changes share two fifths of their pool (GroupCommit's budget).
        A beat that has waited for it as long as any request may wait for a
        connection is refused, so that its worker hears in time to try again
        before the lease runs out, rather than learning nothing until after.
        A change whose statement had already started may still land: like a
        lost answer, harmless, as a beat sets the lease from now again."""
        queue_id = queue.id
        change = queue.kind.change
        timer = asyncio.timeout(self.pool_wait_seconds)
        try:
            async with timer:
                changed = await self.group.run(change, queue_id, changes)
        except TimeoutError:
            if not timer.expired():
                raise
            raise Overloaded(
                "Visibility changes are using all the database connections they may "
                "have; retry shortly.",
            ) from None
        self._notify_here(lambda: grouped.visibility_notice(queue_id, list(changed.values())))
        return changed

    async def release(self, name: str, handle: str, delay: int | None = None) -> Released:
        """Give a message back after a failure: visible again after `delay`
        seconds, else after the queue's retry ladder's delay, else at once."""
        if delay is not None:
            check_range("delay", delay, limits.RELEASE_DELAY)
        async with self._db.session() as session:
            queue = await self.queues.find(name, session)
            receipt = self._signer.decode(handle, queue_id=queue.id)
            row = await session.fetchrow(
                Q.release_message,
                {
                    "queue_id": queue.id,
                    "id": receipt.message_row,
                    "token": receipt.claim_token,
                    "delay": delay,
                },
            )
            if row is None:
                self.events.lease_lost(queue.name, 1)
                raise LeaseLost()
            waited = max(float(row["delay"]), 0.0)
            notice = Ready(queue.id, 1) if waited <= 0 else Ready(queue.id, 0, waited)
            await session.fetch(*grouped.notify(notice))
        self._notify_here(lambda: notice)
        self.events.released(queue.name, 1)
        return Released(delay_seconds=waited, visible_at=row["visible_at"])

    async def delete(self, name: str, handles: Sequence[str]) -> list[EntryError | None]:
        """Acknowledge each handle; a stale one fails with LeaseLost and deletes nothing."""
        queue = await self.queues.find(name)
        receipts = self._signer.decode_all(handles, queue_id=queue.id)
        valid = [r for r in receipts if isinstance(r, Receipt)]
        deleted = await self.group.run(queue.kind.delete, queue, valid) if valid else {}
        return self._results_told(queue, receipts, deleted)

    async def lapsed(self, name: str, handles: Sequence[str]) -> set[str]:
        """Of `handles`, those whose message is still there but whose lease no
        longer holds (lapsed, released, or claimed again), judged on the
        database's clock; handles that do not verify are left to the action
        that follows, which refuses them."""
        queue = await self.queues.find(name)
        receipts = self._signer.decode_all(handles, queue_id=queue.id)
        valid = [(h, r) for h, r in zip(handles, receipts, strict=True) if isinstance(r, Receipt)]
        if not valid:
            return set()
        rows = await self._db.fetch(Q.lapsed_leases, {
            "queue_id": queue.id,
            "ids": [r.message_row for _, r in valid],
            "tokens": [r.claim_token for _, r in valid],
        })
        stale = {(row["id"], row["token"]) for row in rows}
        return {h for h, r in valid if (r.message_row, r.claim_token) in stale}

    def _results_told(
        self, queue: Queue, receipts: list[Receipt | InvalidReceiptHandle],
        deleted: Deleted,
    ) -> list[EntryError | None]:
        results = acknowledged(receipts, deleted)
        if deleted:
            self.events.deleted(
                queue.name, len(deleted), [h for h in deleted.values() if h is not None]
            )
        lost = sum(1 for r in results if r is not None and isinstance(r.error, LeaseLost))
        if lost:
            self.events.lease_lost(queue.name, lost)
        return results

    async def checkpoint(
        self, name: str, handle: str, cursor: Any, visibility_timeout: int | None = None
    ) -> Lease:
        """Record a cursor and renew the lease by `visibility_timeout` (default:
        the queue's)."""
        if visibility_timeout is not None:
            check_range("timeout", visibility_timeout, limits.VISIBILITY_TIMEOUT)
        async with self._db.session() as session:
            queue = await self.queues.find(name, session)
            receipt = self._signer.decode(handle, queue_id=queue.id)
            if visibility_timeout is None:
                visibility_timeout = queue.attributes.visibility_timeout
            row = await session.fetchrow(
                Q.save_checkpoint,
                {
                    "queue_id": queue.id,
                    "id": receipt.message_row,
                    "token": receipt.claim_token,
                    "cursor": json.dumps(cursor),
                    "visibility_timeout": visibility_timeout,
                },
            )
        if row is None:
            self.events.lease_lost(queue.name, 1)
            raise LeaseLost()
        self.events.extended(queue.name, 1)
        return Lease(
            visibility_timeout=visibility_timeout, lease_expires_at=row["lease_expires_at"]
        )

    async def peek(
        self, name: str, *, state: str | None = None, limit: int = 100,
        after: str | None = None, body_chars: int = peeking.PEEK_BODY_CHARS,
    ) -> list[PeekedMessage]:
        """Messages of a queue as an operator sees them, without claiming any."""
        return await peeking.peek(self._db, self.queues, name, state=state, limit=limit,
                                  after=after, body_chars=body_chars)
