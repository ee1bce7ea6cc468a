"""One socket write per answer (app/asgi/one_write.py): what uvicorn writes in one
turn of the event loop reaches the transport as one write, and nothing is lost or
reordered when the connection closes or writes more later."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn
from support import wait_until

from app.asgi.one_write import OneWriteHttpToolsProtocol, _GatheredWrites


class Recorded(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: Any) -> None:
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


async def _turn() -> None:
    await asyncio.sleep(0)


async def test_writes_of_one_turn_go_out_together_in_order() -> None:
    raw = Recorded()
    gathered = _GatheredWrites(raw, asyncio.get_running_loop())
    gathered.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    gathered.write(memoryview(b"{}"))
    assert raw.writes == [] and gathered.get_write_buffer_size() == 40
    await _turn()
    assert raw.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    gathered.write(b"next")
    await _turn()
    assert raw.writes[1:] == [b"next"]
    assert gathered.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest is the transport's


async def test_close_sends_what_was_written_and_abort_drops_it() -> None:
    raw = Recorded()
    gathered = _GatheredWrites(raw, asyncio.get_running_loop())
    gathered.write(b"answer")
    gathered.close()
    assert raw.writes == [b"answer"] and raw.closed
    await _turn()  # the scheduled flush finds nothing left and writes nothing
    assert raw.writes == [b"answer"]

    dropped = Recorded()
    gathered = _GatheredWrites(dropped, asyncio.get_running_loop())
    gathered.write(b"half an answer")
    gathered.abort()
    await _turn()
    assert dropped.writes == [] and dropped.aborted


async def test_uvicorn_serves_whole_answers_through_it() -> None:
    """Through a real uvicorn, on one keep-alive connection: each answer whole and
    in order (the gathering itself is the tests above)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"5")]})
        await send({"type": "http.response.body", "body": b"hello"})

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(
        app, port=port, http=OneWriteHttpToolsProtocol, lifespan="off", log_level="warning"))
    serving = asyncio.create_task(server.serve())
    try:
        await wait_until(lambda: server.started)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(3):  # keep-alive: every answer of the connection
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            chunk = await reader.read(65536)
            assert chunk.startswith(b"HTTP/1.1 200 OK\r\n") and chunk.endswith(b"\r\n\r\nhello")
        writer.close()
    finally:
        server.should_exit = True
        await serving
