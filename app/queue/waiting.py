"""Waking long-polling receivers without holding database connections.

Receivers park in a first-in-first-out line per queue, holding no connection.
They are woken by:
- notifications on the `leaseq` channel, issued in the transaction of every
  send and release (PostgreSQL delivers them on commit, to every service
  process). A payload `queue_id:ready:due` says how many messages became
  visible now, and in how many seconds (if any) the next delayed one will be;
- a timer per queue, set to the moment its next delayed message or lease
  becomes visible, as PostgreSQL computed it after an empty claim.

No thundering herd: a notification for n messages wakes the n longest-waiting
receivers, a timer wakes one. A woken receiver that takes a full batch passes
the wake-up on (there may be more); one that leaves without claiming (client
gone, time up) hands its wake-up to the next in line, so none is lost.

One LISTEN connection per process feeds the line. While it is down, one
receiver per queue re-checks each second; when it is back, every receiver
re-checks once, so a notification lost in between costs at most one round.

Every long poll costs memory and a socket while it lasts, so a process seats
at most `max_waiters` of them, and at most `max_waiters_per_queue` on one
queue, and at most `max_waiters_per_key` for one API key, of which at most
`max_waiters_per_key_on_a_queue` on one queue (below the queue's cap: a key
polling a queue it shares leaves the others seats there); one more is refused
(Overloaded) before it does any work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from app.config import Settings
from app.db.connector import listening
from app.errors import Overloaded
from app.queue.watches import Watches

if TYPE_CHECKING:
    from app.db.hosts import Dialer

_log = logging.getLogger(__name__)

CHANNEL = "leaseq"
DEGRADED_RECHECK_SECONDS = 1.0
REFUSED_RETRY_SECONDS = 1
"""Retry-After of a refused long poll: seats free whenever a poll gets a message
or its wait ends, and a refusal costs the service next to nothing."""


CALLER_KEY: ContextVar[str | None] = ContextVar("leaseq_caller_key", default=None)
"""The API key a request runs for (None: no key), set by the door that checked it,
so that a long poll counts against its key's share of the seats."""


class Seat(NamedTuple):
    """A long poll's admission: its queue, and the key it counts against."""

    queue_id: int
    key: str | None


class Ready(NamedTuple):
    """What a wake-up notification says: `ready` messages of `queue_id` are visible
    now, and the next one (if any is known) in `due_in` seconds. PostgreSQL formats
    it (`leaseq.notice`, migration 0006); `WaitHub.on_notification` reads it."""

    queue_id: int
    ready: int
    due_in: float | None = None


def _count_down(counts: dict[Any, int], key: Any) -> None:
    """One fewer of `key`; a count that reaches 0 leaves the dict (it stays small)."""
    left = counts.pop(key, 0) - 1
    if left > 0:
        counts[key] = left


class Waiter:
    """One receiver in line. `woken` resolves when it should look again;
    `idle` is true while it waits (rather than looks) and holds no connection."""

    __slots__ = ("idle", "queue_id", "woken")

    def __init__(self, queue_id: int, woken: asyncio.Future[None]) -> None:
        self.queue_id = queue_id
        self.woken = woken
        self.idle = False


@dataclass
class _Line:
    waiters: deque[Waiter] = field(default_factory=deque)
    timer: asyncio.Handle | None = None
    # When the timer fires, kept beside it: uvloop hands out a plain Handle,
    # without when(), for a call_at less than a millisecond away.
    timer_at: float = 0.0
    looking: int = 0  # receivers of this line inside a claim right now


class WaitHub:
    """The waiting receivers of this process, per queue."""

    def __init__(
        self,
        *,
        max_waiters: int = Settings.model_fields["max_waiters"].default,
        max_waiters_per_queue: int = Settings.model_fields["max_waiters_per_queue"].default,
        max_waiters_per_key: int | None = None,
        max_waiters_per_key_on_a_queue: int | None = None,
        watches: Watches | None = None,
    ) -> None:
        self._lines: dict[int, _Line] = {}
        self.max_waiters = max_waiters
        self.max_waiters_per_queue = max_waiters_per_queue
        self.max_waiters_per_key = max_waiters_per_key or max_waiters
        self.max_waiters_per_key_on_a_queue = (
            max_waiters_per_key_on_a_queue or max_waiters_per_queue)
        self._seats: dict[int, int] = {}
        self._key_seats: dict[str, int] = {}
        self._key_queue_seats: dict[tuple[str, int], int] = {}
        self._seated = 0
        self._listening = False
        self._degraded_task: asyncio.Task[None] | None = None
        self.closed = False
        self.wakeups = 0
        """Wake-ups delivered so far (a herd shows here first)."""
        # Known-empty queues: (generation seen, quiet until (loop time)). Any
        # event for a queue bumps its generation and so ends its quiet.
        self._generation: dict[int, int] = {}
        self._quiet: dict[int, tuple[int, float]] = {}
        self.on_queue_changed: Callable[[int | None], None] = lambda _queue_id: None
        """Called with a queue id whose attributes changed (None: perhaps any)."""
        self.watches = watches or Watches()
        """The queues whose every send is announced (watches.py); only those
        are ever taken as known-empty."""
        self.watches.on_fenced = self._look_again
        self.watches.in_use = lambda queue_id: queue_id in self._lines

    # -- receivers ------------------------------------------------------------

    def take_seat(self, queue_id: int) -> Seat:
        """Admit one long poll on `queue_id` for the whole of its wait, or refuse
        it with Overloaded. Taken once, before the first park: a seat, unlike a
        place in line, is kept while the receiver looks between waits, so a
        poll already admitted is never refused halfway. The seat counts against
        the caller's key too (CALLER_KEY): no key takes more than its share, so
        one tenant's polls never leave the others none. Give it back with
        free_seat."""
        key = CALLER_KEY.get()
        if key is not None and self._key_seats.get(key, 0) >= self.max_waiters_per_key:
            raise Overloaded(
                f"This key already has {self.max_waiters_per_key} long polls waiting in this "
                f"service process (its share, LEASEQ_KEY_WAITER_SHARE); retry later, or "
                f"receive without waiting.",
                retry_after=REFUSED_RETRY_SECONDS,
            )
        if self._seated >= self.max_waiters:
            raise Overloaded(
                f"This service process already has {self.max_waiters} long polls waiting; "
                f"retry later, or receive without waiting.",
                retry_after=REFUSED_RETRY_SECONDS,
            )
        if (key is not None and self._key_queue_seats.get((key, queue_id), 0)
                >= self.max_waiters_per_key_on_a_queue):
            raise Overloaded(
                f"This key already has {self.max_waiters_per_key_on_a_queue} long polls "
                f"waiting on this queue in this service process (its share of the queue's "
                f"seats, LEASEQ_KEY_WAITER_SHARE); retry later, or receive without waiting.",
                retry_after=REFUSED_RETRY_SECONDS,
            )
        on_queue = self._seats.get(queue_id, 0)
        if on_queue >= self.max_waiters_per_queue:
            raise Overloaded(
                f"This queue already has {self.max_waiters_per_queue} long polls waiting "
                f"in this service process; retry later, or receive without waiting.",
                retry_after=REFUSED_RETRY_SECONDS,
            )
        self._seats[queue_id] = on_queue + 1
        self._seated += 1
        if key is not None:
            self._key_seats[key] = self._key_seats.get(key, 0) + 1
            self._key_queue_seats[key, queue_id] = (
                self._key_queue_seats.get((key, queue_id), 0) + 1)
        return Seat(queue_id, key)

    def free_seat(self, seat: Seat) -> None:
        _count_down(self._seats, seat.queue_id)
        self._seated -= 1
        if seat.key is not None:
            _count_down(self._key_seats, seat.key)
            _count_down(self._key_queue_seats, (seat.key, seat.queue_id))

    def seated(self, queue_id: int | None = None) -> int:
        """Long polls admitted right now, on `queue_id` or on any queue."""
        return self._seated if queue_id is None else self._seats.get(queue_id, 0)

    def park(self, queue_id: int) -> Waiter:
        """Join the line. Do it *before* looking for messages: a send that
        commits between the look and the wait then still wakes this waiter."""
        waiter = Waiter(queue_id, asyncio.get_running_loop().create_future())
        self._lines.setdefault(queue_id, _Line()).waiters.append(waiter)
        return waiter

    def leave(self, waiter: Waiter, *, used: bool) -> None:
        """Leave the line. A woken waiter that did not use its wake-up (it found
        the client gone or its time up) passes it on."""
        line = self._lines.get(waiter.queue_id)
        if line is not None:
            with contextlib.suppress(ValueError):
                line.waiters.remove(waiter)
        if waiter.woken.done():
            if not used:
                self.wake(waiter.queue_id, 1)
        else:
            waiter.woken.cancel()
        self._forget_if_idle(waiter.queue_id)

    @contextlib.contextmanager
    def looking(self, waiter: Waiter) -> Iterator[None]:
        """Marks a claim in progress by a receiver in line."""
        line = self._lines[waiter.queue_id]
        line.looking += 1
        try:
            yield
        finally:
            line.looking -= 1

    def on_the_way(self, queue_id: int) -> int:
        """Receivers already woken or already looking: they will take what is
        visible, so nobody else need be woken for it."""
        line = self._lines.get(queue_id)
        if line is None:
            return 0
        return line.looking + sum(1 for w in line.waiters if w.woken.done())

    def parked(self, queue_id: int | None = None) -> int:
        """Receivers idly waiting right now, on `queue_id` or on any queue."""
        lines = self._lines.values() if queue_id is None else [self._lines.get(queue_id)]
        return sum(
            1 for line in lines if line is not None
            for w in line.waiters if w.idle and not w.woken.done()
        )

    # -- known-empty queues -----------------------------------------------------

    def generation(self, queue_id: int) -> int:
        """Changes whenever something may have become visible in the queue."""
        return self._generation.get(queue_id, 0)

    def _bump(self, queue_id: int) -> None:
        self._generation[queue_id] = self._generation.get(queue_id, 0) + 1
        self._quiet.pop(queue_id, None)

    def mark_quiet(self, queue_id: int, generation: int, due_in: float | None) -> None:
        """A claim that started at `generation` found the queue empty, with its
        next message due in `due_in` seconds (None: nothing pending). Until
        then, and unless a notification says otherwise, looking is pointless."""
        if (not self._listening or generation != self.generation(queue_id)
                or not self.watches.holds(queue_id)):
            return
        # With nothing pending, still look again within a minute: a safety net
        # for any change that might not announce itself.
        quiet = 60.0 if due_in is None else min(due_in, 60.0)
        until = asyncio.get_running_loop().time() + quiet
        self._quiet[queue_id] = (generation, until)

    def quiet_for(self, queue_id: int) -> float | None:
        """Seconds the queue is known to stay empty, or None when unknown."""
        entry = self._quiet.get(queue_id)
        if (entry is None or not self._listening or entry[0] != self.generation(queue_id)
                or not self.watches.holds(queue_id)):
            return None
        remaining = entry[1] - asyncio.get_running_loop().time()
        return remaining if remaining > 0 else None

    # -- wake-ups ---------------------------------------------------------------

    def wake(self, queue_id: int, count: int) -> None:
        """Wake the `count` longest-waiting receivers of a queue."""
        line = self._lines.get(queue_id)
        if line is None:
            return
        for waiter in line.waiters:
            if count <= 0:
                break
            if not waiter.woken.done():
                waiter.woken.set_result(None)
                self.wakeups += 1
                count -= 1

    def wake_all(self) -> None:
        for queue_id in list(self._lines):
            self.wake(queue_id, len(self._lines[queue_id].waiters))

    def schedule(self, queue_id: int, seconds: float) -> None:
        """Wake one receiver of the queue `seconds` from now, unless a wake-up
        is already due sooner."""
        line = self._lines.get(queue_id)
        if line is None or not line.waiters:
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + max(seconds, 0.0)
        if line.timer is not None:
            if line.timer_at <= when:
                return
            line.timer.cancel()
        line.timer = loop.call_at(when, self._timer_fired, queue_id)
        line.timer_at = when

    def _look_again(self, queue_id: int) -> None:
        """Something may have become visible unannounced: one receiver looks."""
        self._bump(queue_id)
        self.wake(queue_id, 1)

    def _timer_fired(self, queue_id: int) -> None:
        self._bump(queue_id)
        line = self._lines.get(queue_id)
        if line is not None:
            line.timer = None
            self.wake(queue_id, 1)

    def _forget_if_idle(self, queue_id: int) -> None:
        line = self._lines.get(queue_id)
        if line is not None and not line.waiters:
            if line.timer is not None:
                line.timer.cancel()
            del self._lines[queue_id]

    def on_notification(self, text: str) -> None:
        """A notification about a queue (`Listener` hands the rest elsewhere)."""
        if text.endswith(":changed"):
            try:
                changed = int(text.split(":")[0])
            except ValueError:
                _log.warning("ignoring malformed notification %r", text)
                return
            self.on_queue_changed(changed)
            self._bump(changed)
            self.wake(changed, len(self._lines[changed].waiters) if changed in self._lines else 0)
            return
        try:
            queue_part, ready_part, due_part = text.split(":")
            notice = Ready(int(queue_part), int(ready_part),
                           float(due_part) if due_part else None)
        except ValueError:
            _log.warning("ignoring malformed notification %r", text)
            return
        self.announce(notice)

    def announce(self, notice: Ready) -> None:
        """Acts on a wake-up: from a notification, or told directly while the
        LISTEN connection is down."""
        self._bump(notice.queue_id)
        if notice.ready > 0:
            self.wake(notice.queue_id, notice.ready)
        if notice.due_in is not None:
            self.schedule(notice.queue_id, notice.due_in)

    # -- listener state ---------------------------------------------------------

    @property
    def listening(self) -> bool:
        return self._listening

    def set_listening(self, listening: bool) -> None:
        if listening == self._listening:
            return
        self._listening = listening
        self._quiet.clear()
        if not listening:
            self.watches.detach()
        self.on_queue_changed(None)
        if listening:
            if self._degraded_task is not None:
                self._degraded_task.cancel()
                self._degraded_task = None
        elif not self.closed:
            self._degraded_task = asyncio.create_task(self._recheck_while_deaf())
        # Either way, anything may have happened unheard: everyone looks again.
        self.wake_all()

    async def _recheck_while_deaf(self) -> None:
        while True:
            await asyncio.sleep(DEGRADED_RECHECK_SECONDS)
            for queue_id in list(self._lines):
                self.wake(queue_id, 1)

    def close(self) -> None:
        """Shutting down: wake everyone, and let nobody wait again."""
        self.closed = True
        if self._degraded_task is not None:
            self._degraded_task.cancel()
            self._degraded_task = None
        self.wake_all()


class Listener:
    """The LISTEN connection of one process; reconnects with backoff. Notifications
    about a queue go to the hub, every other (`keys:changed`) to `notices`; while
    it is reconnecting anything may have been missed, which `notices` hear as
    `*:changed`."""

    def __init__(
        self, url: str, hub: WaitHub, *, dial: Dialer,
        notices: Sequence[Callable[[str], None]] = (),
    ) -> None:
        self._url = url
        self._hub = hub
        self._dial = dial
        self._notices = tuple(notices)
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="leaseq-listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                async with listening(
                    self._url, CHANNEL, self._dispatch, name="leaseq-listener",
                    dial=self._dial,
                ) as (lost, conn):
                    self._hub.watches.attach(conn)
                    self._set_listening(True)
                    self.connected.set()
                    backoff = 0.1
                    await lost.wait()
                _log.warning("listener connection lost; reconnecting")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _log.warning("listener cannot connect (%s); retrying in %.1fs", exc, backoff)
            finally:
                self.connected.clear()
                self._hub.watches.detach()
            self._set_listening(False)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def _dispatch(self, text: str) -> None:
        if text[:1].isdigit():
            self._hub.on_notification(text)
            return
        for hear in self._notices:
            hear(text)

    def _set_listening(self, listening: bool) -> None:
        if listening != self._hub.listening:
            self._hub.set_listening(listening)
            for hear in self._notices:
                hear("*:changed")
