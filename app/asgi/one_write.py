"""One socket write per answer: uvicorn's httptools protocol, its writes gathered.

uvicorn writes an answer's status line and headers when the app sends
`http.response.start`, and its body on `http.response.body`: two send(2) calls,
two TCP segments, and on loopback the receiving side's work for each (the
sender's CPU pays for that). A profile of the workers' cycle put 28 % of the
service's samples in those two writes (docs/performance.md). Here the writes
made in one turn of the event loop are joined and written once, at the end of
that turn: an answer whose body follows its headers at once (every leaseq
answer but a stream) goes out as one segment. Nothing waits longer than the
turn it was written in.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _GatheredWrites:
    """A transport whose writes in one turn of the loop reach the socket as one;
    everything else is the transport's own."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def _flush(self) -> None:
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()  # a connection closed after its answer still sends the answer
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OneWriteHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (`uvicorn.Config(http=...)`), each answer
    written to its socket once."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        gathered: Any = _GatheredWrites(transport, self.loop)
        super().connection_made(gathered)
