"""One receive's way to its messages: a short poll claims at once; a long poll
waits in its queue's line (waiting.py), holding no connection, and looks again
when woken.

The claim itself (with its dead-letter rounds, grouped or in a session) is the
service's, passed in as `claim`; this module owns the rest: the receive's seat
and place in the line, when it asks the database and when it need not, and
whom it wakes after it looked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from app.db.connector import Connector, Session
from app.queue import limits
from app.queue.catalog import QueueCatalog, check_range
from app.queue.models import Queue, ReceivedMessage
from app.queue.waiting import Seat, Waiter, WaitHub


class Gone(Protocol):
    """Set when the client has gone away."""

    def is_set(self) -> bool: ...

    def watch(self) -> None: ...

    async def wait(self) -> Any: ...


LOOK_AGAIN = 0.05
"""Seconds after which a long poll that claimed nothing while its outlook saw
messages claimable looks again."""

Claim = Callable[[Queue, int, int], Awaitable[list[ReceivedMessage]]]
"""claim(queue, visibility_timeout, count), with whoever else claims from the
queue now (group commit)."""


@dataclass(frozen=True)
class Outlook:
    due_in: float | None  # seconds until the next message becomes claimable
    more_now: bool  # messages are claimable right now


MAYBE_MORE = Outlook(due_in=None, more_now=True)
"""What a receive that took a full batch, with no one else of this process
waiting on the queue, assumes lies ahead instead of asking the database:
maybe more. Under a standing backlog every receive is such a one, and this
spares the database a second statement (and its planning) per receive; a
receiver that parks later reads the outlook for itself."""


async def outlook(session: Session, queue: Queue) -> Outlook:
    (row,) = await session.fetch(*queue.kind.outlook(queue))
    due_in = row["due_in"]
    return Outlook(due_in=None if due_in is None else float(due_in), more_now=bool(row["more_now"]))


def check_receive(max_messages: int, visibility_timeout: int | None, wait: int | None) -> None:
    check_range("max", max_messages, limits.RECEIVE_MAX)
    if visibility_timeout is not None:
        check_range("visibility_timeout", visibility_timeout, limits.VISIBILITY_TIMEOUT)
    if wait is not None:
        check_range("wait", wait, limits.RECEIVE_WAIT)


class Receive:
    """One receive while it runs: its queue, visibility timeout and deadline, its
    waiting seat and its waiter."""

    def __init__(
        self,
        db: Connector,
        queues: QueueCatalog,
        hub: WaitHub,
        claim: Claim,
        name: str,
        *,
        max_messages: int,
        visibility_timeout: int | None,
        wait: int | None,
        gone: Gone | None,
    ) -> None:
        self._db = db
        self._queues = queues
        self._hub = hub
        self._claim = claim
        self._name = name
        self._max = max_messages
        self._asked = (visibility_timeout, wait)
        self._gone = gone
        self._waiter: Waiter | None = None
        self._seat: Seat | None = None  # the waiting seat this receive holds
        self._visibility_timeout, self._deadline = 0, 0.0
        # A receiver polling again finds its queue's attributes cached; the first
        # look otherwise reads them in the claim's own connection.
        self._queue = queues.cached(name)
        if self._queue is not None:
            self._settle(self._queue)

    async def run(self) -> list[ReceivedMessage]:
        try:
            while True:
                if self._gone is not None and self._gone.is_set():
                    return []
                if self._waiter is not None:
                    if not self._waiter.woken.done():
                        return []  # the wait ran out with nothing announced
                    self._hub.leave(self._waiter, used=True)  # woken: we are looking now
                    self._waiter = None
                    # Dropped from the cache (changed or deleted): read it again.
                    self._queue = self._queues.cached(self._name)
                queue = self._queue
                if queue is not None and not self._may_wait():
                    # A short poll of a known queue: one claim with whoever else polls now.
                    return await self._claim(queue, self._visibility_timeout, self._max)
                quiet = None if queue is None else self._hub.quiet_for(queue.id)
                if queue is not None and quiet is not None:
                    # A long poll on a queue known empty since the last look (no
                    # notification since): wait without asking the database. A
                    # notification still on its way wakes it like any waiter.
                    self._park(queue)
                    received: list[ReceivedMessage] = []
                    ahead = Outlook(due_in=quiet, more_now=False)
                else:
                    received, looked = await self._look()
                    if looked is None:
                        return received  # it may not wait: the answer is this claim
                    ahead = looked
                if received:
                    self._hand_on(len(received), ahead)
                    return received
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    return []
                if ahead.due_in is not None:
                    assert self._queue is not None
                    self._hub.schedule(self._queue.id, ahead.due_in)
                await self._wait(remaining)
        finally:
            if self._waiter is not None:
                self._hub.leave(self._waiter, used=False)
            if self._seat is not None:
                self._hub.free_seat(self._seat)

    def _settle(self, queue: Queue) -> None:
        """The visibility timeout and the wait asked for, else the queue's."""
        visibility_timeout, wait = self._asked
        attributes = queue.attributes
        self._visibility_timeout = (
            attributes.visibility_timeout if visibility_timeout is None else visibility_timeout
        )
        wait_seconds = attributes.receive_wait if wait is None else wait
        self._deadline = time.monotonic() + wait_seconds

    def _may_wait(self) -> bool:
        return self._deadline > time.monotonic() and not self._hub.closed

    def _park(self, queue: Queue) -> None:
        """In line (admitted or refused for a seat first)."""
        if self._seat is None:
            self._seat = self._hub.take_seat(queue.id)
        self._waiter = self._hub.park(queue.id)
        if self._gone is not None:
            self._gone.watch()

    async def _look(self) -> tuple[list[ReceivedMessage], Outlook | None]:
        """Claims with whoever else claims from the queue now (one statement for
        all: group commit); a receive that may wait also reads what lies ahead
        (None: it may not wait, and this claim is its answer)."""
        if self._queue is not None and self._seat is None:
            # A long poll of a known queue: admitted or refused before it
            # takes a connection.
            self._seat = self._hub.take_seat(self._queue.id)
        if self._queue is None:
            async with self._db.session() as session:
                self._queue = await self._queues.lookup(session, self._name)
            if self._deadline == 0.0:  # the first look; later ones keep it
                self._settle(self._queue)
        queue = self._queue
        if self._may_wait():
            # In line before looking: a send committed after the look
            # still reaches this receiver.
            self._park(queue)
        if self._waiter is None:
            claimed = await self._claim(queue, self._visibility_timeout, self._max)
            return claimed, None
        received, ahead = await self._claim_in_line(queue)
        if not received and not ahead.more_now and not self._hub.watches.holds(queue.id):
            # About to wait on a queue no send is sure to announce (sends in
            # callers' own transactions announce only to watchers): watch it,
            # then look once more, the look the watch's fence makes complete.
            await self._hub.watches.watch(queue.id)
            if self._hub.watches.holds(queue.id):
                received, ahead = await self._claim_in_line(queue)
        return received, ahead

    async def _claim_in_line(self, queue: Queue) -> tuple[list[ReceivedMessage], Outlook]:
        """A claim by a receiver in line, and what lies ahead after it."""
        assert self._waiter is not None
        generation = self._hub.generation(queue.id)
        with self._hub.looking(self._waiter):
            received = await self._claim(queue, self._visibility_timeout, self._max)
            # What lies ahead matters to whoever waits: this receiver when it
            # found less than it asked for, the others when it took a full
            # batch (none: MAYBE_MORE).
            if len(received) == self._max and self._hub.parked(queue.id) == 0:
                ahead = MAYBE_MORE
            else:
                async with self._db.session() as session:
                    ahead = await outlook(session, queue)
        if not received and not ahead.more_now:
            self._hub.mark_quiet(queue.id, generation, ahead.due_in)
        if not received and ahead.more_now:
            # Messages (FIFO: groups) claimable, none of them taken: another
            # claim or send held their rows for a moment (a FIFO claim locks a
            # few more groups than it takes), or they became claimable between
            # the claim and the outlook, each statement having its own now (a
            # lease or a delay that ended in between: the outlook no longer
            # counts it as due, and no notification announces it). Look again
            # shortly rather than at the next notification.
            due = LOOK_AGAIN if ahead.due_in is None else min(ahead.due_in, LOOK_AGAIN)
            ahead = Outlook(due_in=due, more_now=True)
        return received, ahead

    def _hand_on(self, count: int, ahead: Outlook) -> None:
        """Out of line with messages: whoever waits next may have some too."""
        assert self._waiter is not None and self._queue is not None
        self._hub.leave(self._waiter, used=False)
        self._waiter = None
        queue_id = self._queue.id
        if ahead.more_now and count == self._max:
            # A full batch may have left more behind: wake the next in line,
            # unless others are already on their way.
            if self._hub.on_the_way(queue_id) == 0:
                self._hub.wake(queue_id, 1)
        elif ahead.due_in is not None:
            self._hub.schedule(queue_id, ahead.due_in)

    async def _wait(self, seconds: float) -> None:
        """Until woken, the client is gone, or `seconds` pass."""
        assert self._waiter is not None
        self._waiter.idle = True
        watched: list[asyncio.Future[Any]] = [self._waiter.woken]
        gone_wait = None
        if self._gone is not None:
            gone_wait = asyncio.ensure_future(self._gone.wait())
            watched.append(gone_wait)
        try:
            await asyncio.wait(watched, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waiter.idle = False
            if gone_wait is not None:
                gone_wait.cancel()
