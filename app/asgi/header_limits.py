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
from collections import OrderedDict
from dataclasses import dataclass
from typing import ClassVar

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


class HeaderLimitedProtocol(OneWriteHttpToolsProtocol):
    """uvicorn's httptools protocol (one write per answer) with the limits above."""

    _unfinished: ClassVar[OrderedDict[HeaderLimitedProtocol, None]] = OrderedDict()
    _header_bytes: int = 0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
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
        counted = self in self._unfinished
        before = self._header_bytes
        self._header_bytes += len(data)
        super().data_received(data)
        # Still unfinished after this read, and past the cap: whatever the read
        # held beyond the headers (a body) cannot be, as they are not over yet.
        if counted and self in self._unfinished and before + len(data) > _LIMITS.max_bytes:
            self._refuse_too_large()

    # -- the limits ---------------------------------------------------------------

    def _begin_headers(self) -> None:
        if self in self._unfinished or self.transport.is_closing():
            return
        self._header_bytes = 0
        self._unfinished[self] = None
        self._header_timer = self.loop.call_later(_LIMITS.timeout, self._too_slow)
        while len(self._unfinished) > _LIMITS.max_unfinished:
            oldest = next(iter(self._unfinished))
            oldest._give_up()

    def _end_headers(self) -> None:
        self._unfinished.pop(self, None)
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _too_slow(self) -> None:
        self._header_timer = None
        self._give_up()

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

    @classmethod
    def unfinished(cls) -> int:
        """Connections whose request headers are not whole yet (for tests and metrics)."""
        return len(cls._unfinished)
