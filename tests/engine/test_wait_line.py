"""The wait line itself: first in, first woken; no wake-up is lost or multiplied."""

from __future__ import annotations

import asyncio

import asyncpg
from support import wait_until

from app.queue.waiting import Ready, WaitHub
from app.queue.watches import Watches


class Watched(Watches):
    """Every queue watched and fenced, as after watches.watch() on a database."""

    def holds(self, queue_id: int) -> bool:
        return True


def woken(hub: WaitHub, *waiters: object) -> list[bool]:
    return [w.woken.done() for w in waiters]  # type: ignore[attr-defined]


async def test_a_wake_for_n_messages_wakes_the_n_longest_waiting() -> None:
    hub = WaitHub()
    hub.set_listening(True)
    a, b, c = hub.park(1), hub.park(1), hub.park(1)
    other = hub.park(2)
    for waiter in (a, b, c, other):
        waiter.idle = True
    hub.on_notification("1:2:")  # as leaseq.notice(1, 2, NULL) writes it
    assert woken(hub, a, b, c, other) == [True, True, False, False]
    assert hub.parked(1) == 1 and hub.parked() == 2
    assert hub.wakeups == 2


async def test_an_unused_wake_up_passes_to_the_next_in_line() -> None:
    hub = WaitHub()
    hub.set_listening(True)
    a, b = hub.park(1), hub.park(1)
    hub.wake(1, 1)
    hub.leave(a, used=False)  # e.g. its client went away
    assert woken(hub, b) == [True]
    hub.leave(b, used=True)
    assert hub.parked() == 0


async def test_a_used_wake_up_is_not_passed_on() -> None:
    hub = WaitHub()
    hub.set_listening(True)
    a, b = hub.park(1), hub.park(1)
    hub.wake(1, 1)
    hub.leave(a, used=True)
    assert woken(hub, b) == [False]


async def test_a_timer_wakes_one_at_the_earliest_due_time() -> None:
    hub = WaitHub()
    hub.set_listening(True)
    a, b = hub.park(1), hub.park(1)
    hub.schedule(1, 30)
    hub.schedule(1, 0.05)  # sooner wins
    hub.schedule(1, 10)  # later is ignored
    async with asyncio.timeout(5):
        await a.woken
    assert woken(hub, b) == [False]


async def test_notification_with_a_due_time_sets_the_timer() -> None:
    hub = WaitHub()
    hub.set_listening(True)
    a = hub.park(7)
    hub.on_notification("7:0:0.050")
    assert not a.woken.done()
    async with asyncio.timeout(5):
        await a.woken


async def test_malformed_notifications_are_ignored() -> None:
    hub = WaitHub()
    hub.set_listening(True)
    a = hub.park(1)
    for text in ("", "1", "x:y:z", "1:2", "1:a:"):
        hub.on_notification(text)
    assert not a.woken.done()


async def test_losing_the_listener_wakes_everyone_and_then_one_per_second() -> None:
    hub = WaitHub()
    hub.set_listening(True)
    a = hub.park(1)
    hub.set_listening(False)
    assert a.woken.done()  # look again: something may have been missed
    hub.leave(a, used=True)
    b, c = hub.park(1), hub.park(1)
    async with asyncio.timeout(5):
        await b.woken
    assert not c.woken.done()
    hub.close()
    assert c.woken.done() and hub.closed


async def test_a_queue_is_quiet_until_anything_happens_to_it() -> None:
    hub = WaitHub(watches=Watched())
    hub.set_listening(True)
    generation = hub.generation(1)
    hub.mark_quiet(1, generation, due_in=None)
    assert hub.quiet_for(1) is not None and hub.quiet_for(1) <= 60  # type: ignore[operator]
    hub.announce(Ready(1, 1))
    assert hub.quiet_for(1) is None
    # A look that began before the notification cannot mark the queue quiet.
    hub.mark_quiet(1, generation, due_in=None)
    assert hub.quiet_for(1) is None


async def test_quiet_ends_when_the_next_message_is_due() -> None:
    hub = WaitHub(watches=Watched())
    hub.set_listening(True)
    hub.mark_quiet(2, hub.generation(2), due_in=0.01)
    assert hub.quiet_for(2) is not None
    await wait_until(lambda: hub.quiet_for(2) is None, seconds=5)


async def test_nothing_is_quiet_without_the_listener() -> None:
    hub = WaitHub(watches=Watched())
    hub.mark_quiet(3, hub.generation(3), due_in=None)
    assert hub.quiet_for(3) is None
    hub.set_listening(True)
    hub.mark_quiet(3, hub.generation(3), due_in=None)
    hub.set_listening(False)
    assert hub.quiet_for(3) is None


async def test_nothing_is_quiet_that_is_not_watched() -> None:
    """A send in a caller's own transaction announces itself only to watchers:
    an empty look at an unwatched queue proves nothing about the next moment."""
    hub = WaitHub()
    hub.set_listening(True)
    hub.mark_quiet(4, hub.generation(4), due_in=None)
    assert hub.quiet_for(4) is None


async def test_the_databases_notice_reads_back_as_what_it_said(db: asyncpg.Connection) -> None:
    """The text is written by PostgreSQL (leaseq.notice) and read here: one format."""
    said = []
    hub = WaitHub()
    hub.announce = said.append  # type: ignore[method-assign]
    for queue_id, ready, due_in in ((3, 2, None), (9, 0, 1.25), (12, 5, 0.0004)):
        hub.on_notification(await db.fetchval(
            "SELECT leaseq.notice($1, $2, $3)", queue_id, ready, due_in
        ))
    assert said == [Ready(3, 2, None), Ready(9, 0, 1.25), Ready(12, 5, 0.0)]


def test_a_timer_less_than_a_millisecond_away_is_rescheduled_under_uvloop() -> None:
    """uvloop answers such a call_at with a Handle that has no when(): the hub
    keeps the deadline itself (a second schedule once failed the receive, 500)."""
    import uvloop

    async def schedule_twice() -> bool:
        hub = WaitHub()
        waiter = hub.park(1)
        waiter.idle = True
        hub.schedule(1, 0.0004)
        hub.schedule(1, 0.01)  # later than the one set: kept as it is
        await asyncio.wait_for(waiter.woken, 5)
        return waiter.woken.done()

    assert uvloop.run(schedule_twice())
