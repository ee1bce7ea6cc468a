"""What a connection may cost before its request is whole.

No request is authenticated before its headers are complete, and on the SQS
door not before its body is either (the signature covers it), so whatever a
connection holds until then is held for anyone who can reach the port. uvicorn
bounds none of it: a connection that sends its headers or its body a byte a
second (or nothing at all) keeps its socket and a place under
`limit_concurrency` for good, and httptools gathers a header of any size.
Here, on top of the one-write protocol:
- a deadline: the headers of each request must be whole within
  `timeout` seconds of the connection opening or of the request's first byte,
  else the connection is closed;
- a size: more than `max_bytes` of headers is answered 431 and closed, to the
  byte (the parser is fed no more than the bytes left under the cap);
- a cap on connections whose headers are unfinished: one more closes the oldest
  of them, so slow connections can never crowd out requests that arrive whole;
- deadlines for a body: whole within `body_timeout` seconds of its headers, and
  once its grace is over, arriving at `body_min_rate` bytes a second on average;
  else answered 408 (when nothing was answered yet) and closed. uvicorn then
  tells the app the client went away (`http.disconnect`). Time this service
  itself keeps a body waiting (reading paused while the app has not taken what
  came, or a `100-continue` not yet sent) is not held against the client.

A request that arrives in one read (most do) costs a few attribute checks: only
a body still unfinished at the end of a read is listed for the sweeper.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections import OrderedDict
from dataclasses import dataclass

from app.asgi.one_write import OneWriteHttpToolsProtocol


@dataclass(frozen=True)
class HeaderLimits:
    timeout: float = 10.0
    max_bytes: int = 65536
    max_unfinished: int = 100
    body_timeout: float = 30.0
    body_min_rate: int = 4096

    @property
    def body_grace(self) -> float:
        """How long a body may go slow before the rate counts: two seconds (a quarter
        of the total time if that is less), for a connection's first round trips."""
        return min(2.0, self.body_timeout / 4)

    @property
    def sweep_every(self) -> float:
        """How often the deadlines are checked: at most a second, often enough for
        the shortest of them."""
        return min(1.0, self.timeout / 4, self.body_grace / 2)


_LIMITS = HeaderLimits()


def configure(limits: HeaderLimits) -> None:
    """The limits of this process's connections (create_app sets them from the settings)."""
    global _LIMITS
    _LIMITS = limits


def _problem(status: int, reason: str, code: str, detail: str) -> bytes:
    body = json.dumps({
        "type": "about:blank", "title": reason, "status": status, "code": code,
        "detail": detail,
    }).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\n".encode()
        + b"content-type: application/problem+json\r\n"
        + b"content-length: " + str(len(body)).encode() + b"\r\n"
        + b"connection: close\r\n\r\n" + body
    )


_TOO_LARGE = _problem(
    431, "Request Header Fields Too Large", "request_header_too_large",
    "The request's headers are larger than this service takes.",
)
_TOO_SLOW = _problem(
    408, "Request Timeout", "request_timeout",
    "The request's body did not arrive in time: it must be whole within "
    "LEASEQ_BODY_TIMEOUT_SECONDS and arrive at LEASEQ_BODY_MIN_BYTES_PER_SECOND.",
)


class _Unfinished:
    """One event loop's connections whose headers are not whole yet, oldest first,
    those whose body is not, and the one timer that sweeps those past their
    deadlines (a timer per request would cost each request a heap entry to push
    and, cancelled, to clean)."""

    def __init__(self) -> None:
        self.since: OrderedDict[HeaderLimitedProtocol, float] = OrderedDict()
        self.bodies: dict[HeaderLimitedProtocol, None] = {}
        self.sweeper: asyncio.TimerHandle | None = None
        self.swept = 0.0  # when the sweeper last looked (or was started)

    def wake(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.sweeper is None:
            self.swept = loop.time()
            self.sweeper = loop.call_later(_LIMITS.sweep_every, _sweep, loop)


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Unfinished] = (
    weakref.WeakKeyDictionary())


class HeaderLimitedProtocol(OneWriteHttpToolsProtocol):
    """uvicorn's httptools protocol (one write per answer) with the limits above."""

    _pool: _Unfinished
    _waiting = False  # this connection's request headers are unfinished (in the pool)
    _counting = True  # the bytes fed next are a request's headers
    _header_bytes = 0
    _read_bytes = 0  # the read being fed
    _completed = False  # a request ended in the read being fed
    _check = False  # the read being fed ended headers or a request: look after it
    _in_body = False  # headers whole, the request not yet
    _body_listed = False
    _body_since = 0.0
    _body_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        pool = _BY_LOOP.get(self.loop)
        if pool is None:
            pool = _BY_LOOP[self.loop] = _Unfinished()
        self._pool = pool
        self._begin_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_headers()
        self._unlist_body()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._completed:
            # Pipelined: this request began in the read that ended the one before,
            # at a place the parser does not tell. All of the read counts.
            self._header_bytes = self._read_bytes
            self._check = True
        self._begin_headers()  # the next request on a kept-alive connection

    def on_headers_complete(self) -> None:
        self._end_headers()
        self._counting = False
        self._in_body = True
        self._body_bytes = 0
        self._check = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_body = False
        if self._body_listed:
            self._unlist_body()
        # What follows is the next request's headers.
        self._counting = True
        self._header_bytes = 0
        self._completed = True

    def data_received(self, data: bytes) -> None:
        if self.timeout_keep_alive_task is not None and not self._waiting:
            # Idle after an answer: uvicorn's keep-alive timer ends at any byte, and
            # a stray CRLF (which the parser skips) begins no request. The next
            # request's header deadline begins here, or nothing would ever close
            # the connection.
            self._begin_headers()
        self._completed = False
        self._read_bytes = len(data)
        if self._counting:
            room = _LIMITS.max_bytes - self._header_bytes
            if len(data) > room:
                self._feed_to_the_cap(data, room)
                return
            self._header_bytes += len(data)
        elif self._in_body:
            self._body_bytes += len(data)
        super().data_received(data)
        if self._check:
            self._after_read()

    def _feed_to_the_cap(self, data: bytes, room: int) -> None:
        """Feeds the parser the bytes left under the cap; if the request's headers
        are still unfinished then, the rest can only take them over it: 431."""
        if room > 0:
            self._header_bytes += room
            self._read_bytes = room
            super().data_received(data[:room])
            if self._check:
                self._after_read()
            if self.transport.is_closing():  # refused: 400 from the parser, or 431
                return
        if self._counting and not self._completed:
            self._refuse(_TOO_LARGE)
            return
        self.data_received(data[room:])  # a body, or the next request

    def _after_read(self) -> None:
        self._check = False
        if self._counting:
            if self._header_bytes > _LIMITS.max_bytes and not self.transport.is_closing():
                self._refuse(_TOO_LARGE)
        elif self._in_body and not self._body_listed and not self.transport.is_closing():
            self._body_listed = True
            self._body_since = self.loop.time()
            self._pool.bodies[self] = None
            self._pool.wake(self.loop)

    # -- the limits ---------------------------------------------------------------

    def _begin_headers(self) -> None:
        if self._waiting:
            return
        self._waiting = True
        pool = self._pool
        since = pool.since
        since[self] = self.loop.time()
        while len(since) > _LIMITS.max_unfinished:
            next(iter(since))._give_up()
        pool.wake(self.loop)

    def _end_headers(self) -> None:
        if self._waiting:
            self._pool.since.pop(self, None)
            self._waiting = False

    def _unlist_body(self) -> None:
        if self._body_listed:
            self._pool.bodies.pop(self, None)
            self._body_listed = False

    def _give_up(self) -> None:
        self._end_headers()
        self.transport.close()

    def _body_late(self) -> None:
        """Cut off: 408 if nothing of an answer was sent yet. The app, if it waits
        for the body, hears that the client went away."""
        self._unlist_body()
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            self._refuse(_TOO_SLOW)
        else:
            self.transport.close()

    def _held_by_us(self) -> bool:
        """Whether the body waits on this service, not on the client: reading is
        paused (the app has not taken what came yet), or the client waits for
        `100 Continue`, which is sent when the app first asks for the body."""
        cycle = self.cycle
        return self.flow.read_paused or (
            cycle is not None and cycle.waiting_for_100_continue)

    def _refuse(self, answer: bytes) -> None:
        self._end_headers()
        self._unlist_body()
        self.transport.write(answer)
        self.transport.close()


def _sweep(loop: asyncio.AbstractEventLoop) -> None:
    """Closes the connections past their deadlines, then looks again while any
    connection's headers or body are unfinished."""
    pool = _BY_LOOP.get(loop)
    if pool is None:
        return
    pool.sweeper = None
    now = loop.time()
    limits = _LIMITS
    late = now - limits.timeout
    while pool.since:  # the oldest come first
        oldest, since = next(iter(pool.since.items()))
        if since > late:
            break
        oldest._give_up()
    if pool.bodies:
        held_for = max(0.0, now - pool.swept)
        grace, rate = limits.body_grace, limits.body_min_rate
        for body in list(pool.bodies):
            if body._held_by_us():
                body._body_since += held_for
                continue
            elapsed = now - body._body_since
            if elapsed > limits.body_timeout or (
                    elapsed > grace and body._body_bytes < rate * (elapsed - grace)):
                body._body_late()
    pool.swept = now
    if pool.since or pool.bodies:
        pool.sweeper = loop.call_later(limits.sweep_every, _sweep, loop)
