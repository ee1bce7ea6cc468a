"""How much request body one process holds for callers not proven yet.

On the SQS door the signature covers the body, so a request is proven only once
its body is read; and key ids are not secret (every receiver of a message sees
its sender's). Without a bound, requests that name a real key id and carry a
forged signature make the service hold a full body each until it is refused.
Here each such request reserves its declared length before its body is read and
gives it back once its signature is checked, pass or fail. The whole length is
reserved up front, never a part at a time: two half-read bodies each waiting for
the other's bytes would never finish.

Two bounds hold: the budget's total, and each client address's share of it (one
full request, of a budget of two by default), so that one caller, however many
connections it opens, never holds the whole budget while it trickles a body
and starves everyone else. Waiters are served in order, so a large request is
not starved by small ones; but one waiting for its own address's share waits
apart, and never holds up another address's request the budget has room for.
A body no larger than what the server reads ahead anyway reserves nothing
(`SMALL_BODY`). One that cannot be served in time is refused unread.

A caller with several addresses could still fill that budget. So there are two
budgets alike: one for callers proven lately (`ProvenCallers`: a client address
whose signature with that key id checked out), one for everyone else. A forged
signature proves nothing, so however many addresses a forger has, it only ever
fills the strangers' budget; a worker that made any signed request lately (its
GetQueueUrl, its polls) sends its large bodies through a budget no forger
reaches.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import time

SMALL_BODY = 64 * 1024
"""uvicorn reads this much of a body ahead of the app on every connection, whatever
the app does (its flow control's high-water mark): a body no larger adds nothing
to what the connection limit already bounds, reserves nothing, and so a small
request never waits behind large ones."""


def address_of(client: tuple[str, int] | list[object] | None) -> str:
    """Whose share a request draws on: its client address (behind a trusted proxy,
    the one uvicorn read from X-Forwarded-For); an IPv6 host by its /64, which a
    single host commonly has whole and could otherwise spread over."""
    if not client:
        return ""
    host = str(client[0])
    if ":" not in host:
        return host
    try:
        ip = ipaddress.IPv6Address(host)
    except ValueError:
        return host
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))


class Reservation:
    """Bytes taken from a budget; `release` gives them back (once, however often
    it is called)."""

    __slots__ = ("_address", "_budget", "_bytes")

    def __init__(self, budget: BodyBudget, size: int, address: str) -> None:
        self._budget = budget
        self._bytes = size
        self._address = address

    def release(self) -> None:
        if self._bytes:
            size, self._bytes = self._bytes, 0
            self._budget._give_back(size, self._address)


class _Waiter:
    __slots__ = ("address", "line", "served", "size")

    def __init__(self, size: int, address: str, served: asyncio.Future[None]) -> None:
        self.size = size
        self.address = address
        self.served = served
        self.line: collections.deque[_Waiter] | None = None
        """The line it waits in (the budget's, or its address's); None once out."""


class BodyBudget:
    def __init__(self, limit: int, per_address: int) -> None:
        self.limit = limit
        self.per_address = min(per_address, limit)
        self.held = 0
        self.high_water = 0
        """The most ever held at once (for tests and the curious)."""
        self._claimed: dict[str, int] = {}
        """By address (only those with any): what it holds, and what its waiters in
        the budget's line will hold once served."""
        self._waiting: collections.deque[_Waiter] = collections.deque()
        """In order, the waiters whose address has room for them, waiting for the
        budget to have it too."""
        self._parked: dict[str, collections.deque[_Waiter]] = {}
        """By address, in order, the waiters its share has no room for yet."""

    def waiters(self) -> int:
        """How many requests wait for a share (for tests and the curious)."""
        return len(self._waiting) + sum(len(line) for line in self._parked.values())

    async def reserve(self, size: int, address: str, wait: float) -> Reservation | None:
        """`size` bytes (at most an address's share) for `address`, within `wait`
        seconds; None if they could not be had in time."""
        size = min(size, self.per_address)
        claimed = self._claimed.get(address, 0)
        roomy = claimed + size <= self.per_address and address not in self._parked
        if roomy and not self._waiting and self.held + size <= self.limit:
            self._claimed[address] = claimed + size
            self._take(size)
            return Reservation(self, size, address)
        if wait <= 0:
            return None
        waiter = _Waiter(size, address, asyncio.get_running_loop().create_future())
        if roomy:
            self._line_up(waiter)
        else:
            waiter.line = self._parked.setdefault(address, collections.deque())
            waiter.line.append(waiter)
        try:
            async with asyncio.timeout(wait):
                await waiter.served
        except TimeoutError:
            if not _served(waiter.served):
                self._leave(waiter)
                return None
        except asyncio.CancelledError:
            if _served(waiter.served):  # served as it was cancelled
                self._give_back(size, address)
            else:
                self._leave(waiter)
            raise
        return Reservation(self, size, address)

    def _line_up(self, waiter: _Waiter) -> None:
        self._claimed[waiter.address] = self._claimed.get(waiter.address, 0) + waiter.size
        waiter.line = self._waiting
        self._waiting.append(waiter)

    def _leave(self, waiter: _Waiter) -> None:
        line = waiter.line
        if line is None:  # _serve or _unpark dropped it already
            return
        line.remove(waiter)
        waiter.line = None
        if line is self._waiting:
            self._unclaim(waiter.address, waiter.size)
        elif not line:
            del self._parked[waiter.address]
        # Its leaving may let those behind it in.
        self._unpark(waiter.address)
        self._serve()

    def _take(self, size: int) -> None:
        self.held += size
        self.high_water = max(self.high_water, self.held)

    def _give_back(self, size: int, address: str) -> None:
        self.held -= size
        self._unclaim(address, size)
        self._unpark(address)
        self._serve()

    def _unclaim(self, address: str, size: int) -> None:
        left = self._claimed[address] - size
        if left:
            self._claimed[address] = left
        else:
            del self._claimed[address]

    def _unpark(self, address: str) -> None:
        """Into the budget's line, in order, the address's waiters its share has
        room for now."""
        line = self._parked.get(address)
        if line is None:
            return
        while line:
            head = line[0]
            if head.served.done():  # cancelled: its task is leaving
                line.popleft()
                head.line = None
            elif self._claimed.get(address, 0) + head.size <= self.per_address:
                line.popleft()
                self._line_up(head)
            else:
                break
        if not line:
            del self._parked[address]

    def _serve(self) -> None:
        while self._waiting:
            head = self._waiting[0]
            if head.served.done():  # cancelled: its task is leaving
                self._waiting.popleft()
                head.line = None
                self._unclaim(head.address, head.size)
                self._unpark(head.address)
            elif self.held + head.size <= self.limit:
                self._waiting.popleft()
                head.line = None
                self._take(head.size)
                head.served.set_result(None)
            else:
                break


def _served(future: asyncio.Future[None]) -> bool:
    # A task cancelled (or timed out) while it awaits cancels the future too.
    return future.done() and not future.cancelled()


class ProvenCallers:
    """The (client address, key id) pairs whose signature checked out within the
    last `seconds`, at most `most` of them (the least recently proven go first)."""

    def __init__(self, seconds: float = 600.0, most: int = 10_000) -> None:
        self.seconds = seconds
        self.most = most
        self._until: collections.OrderedDict[tuple[str, str], float] = (
            collections.OrderedDict())

    def prove(self, address: str, key_id: str) -> None:
        pair = (address, key_id)
        now = time.monotonic()
        until = self._until.get(pair)
        # Proven a moment ago: nothing to move (every signed request comes here).
        if until is not None and until - now > self.seconds - 1.0:
            return
        self._until[pair] = now + self.seconds
        self._until.move_to_end(pair)
        if len(self._until) > self.most:
            self._until.popitem(last=False)

    def knows(self, address: str, key_id: str) -> bool:
        until = self._until.get((address, key_id))
        return until is not None and until > time.monotonic()

    def __len__(self) -> int:
        return len(self._until)
