"""What a connection may cost before its request's headers are whole.

No request is authenticated before its headers are complete, so whatever a
connection holds until then is held for anyone who can reach the port. uvicorn
bounds none of it: a connection that sends its headers a byte a second (or
nothing at all) keeps its socket and a place under `limit_concurrency` for good,
and httptools gathers a header of any size. Here, on top of the one-write
protocol:
- a deadline: the headers of each request must be whole within
  `timeout` seconds of the connection opening or of the request's first byte,
  else the connection is closed;
- a size: more than `max_bytes` of headers is answered 431 and closed (checked
  per read, so at most one read past the cap is ever held);
- a cap on connections whose headers are unfinished: one more closes the oldest
  of them, so slow connections can never crowd out requests that arrive whole.
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


_LIMITS = HeaderLimits()


def configure(limits: HeaderLimits) -> None:
    """The limits of this process's connections (create_app sets them from the settings)."""
    global _LIMITS
    _LIMITS = limits


_TOO_LARGE = json.dumps({
    "type": "about:blank", "title": "Request Header Fields Too Large", "status": 431,
    "code": "request_header_too_large",
    "detail": "The request's headers are larger than this service takes.",
}).encode()


class _Unfinished:
    """One event loop's connections whose headers are not whole yet, oldest first,
    and the one timer that sweeps those past their deadline (a timer per request
    would cost each request a heap entry to push and, cancelled, to clean)."""

    def __init__(self) -> None:
        self.since: OrderedDict[HeaderLimitedProtocol, float] = OrderedDict()
        self.sweeper: asyncio.TimerHandle | None = None


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Unfinished] = (
    weakref.WeakKeyDictionary())


class HeaderLimitedProtocol(OneWriteHttpToolsProtocol):
    """uvicorn's httptools protocol (one write per answer) with the limits above."""

    _header_bytes: int = 0
    _waiting = False  # this connection's request headers are unfinished
    _pool: _Unfinished

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        pool = _BY_LOOP.get(self.loop)
        if pool is None:
            pool = _BY_LOOP[self.loop] = _Unfinished()
        self._pool = pool
        self._begin_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_headers()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begin_headers()  # the next request on a kept-alive connection

    def on_headers_complete(self) -> None:
        self._end_headers()
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        if not self._waiting:  # a body, or the first read of the next request
            super().data_received(data)
            return
        self._header_bytes += len(data)
        super().data_received(data)
        # Still unfinished after this read, and past the cap: whatever the read
        # held beyond the headers (a body) cannot be, as they are not over yet.
        if self._waiting and self._header_bytes > _LIMITS.max_bytes:
            self._refuse_too_large()

    # -- the limits ---------------------------------------------------------------

    def _begin_headers(self) -> None:
        if self._waiting:
            return
        self._waiting = True
        self._header_bytes = 0
        pool = self._pool
        since = pool.since
        since[self] = self.loop.time()
        while len(since) > _LIMITS.max_unfinished:
            next(iter(since))._give_up()
        if pool.sweeper is None:
            pool.sweeper = self.loop.call_later(_sweep_every(), _sweep, self.loop)

    def _end_headers(self) -> None:
        if self._waiting:
            self._pool.since.pop(self, None)
            self._waiting = False

    def _give_up(self) -> None:
        self._end_headers()
        self.transport.close()

    def _refuse_too_large(self) -> None:
        self._end_headers()
        head = (
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/problem+json\r\n"
            b"content-length: " + str(len(_TOO_LARGE)).encode() + b"\r\n"
            b"connection: close\r\n\r\n"
        )
        self.transport.write(head + _TOO_LARGE)
        self.transport.close()


def _sweep_every() -> float:
    """How often the deadline is checked: a quarter of it, at most a second."""
    return min(1.0, _LIMITS.timeout / 4)


def _sweep(loop: asyncio.AbstractEventLoop) -> None:
    """Closes the connections past their deadline (the oldest come first), then
    looks again while any connection's headers are unfinished."""
    unfinished = _BY_LOOP.get(loop)
    if unfinished is None:
        return
    unfinished.sweeper = None
    late = loop.time() - _LIMITS.timeout
    while unfinished.since:
        oldest, since = next(iter(unfinished.since.items()))
        if since > late:
            break
        oldest._give_up()
    if unfinished.since:
        unfinished.sweeper = loop.call_later(_sweep_every(), _sweep, loop)
