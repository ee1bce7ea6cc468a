"""A tiny TCP proxy for the network-partition test: `python proxy.py TARGET_PORT`.

It listens on a free port of 127.0.0.1, prints that port on a line of its own,
and forwards every connection to TARGET_PORT. The test blocks the path by
stopping this process (SIGSTOP): connections stay open and new ones are even
accepted by the kernel, but no byte goes through — a black hole, not a refusal.
"""

from __future__ import annotations

import asyncio
import sys


async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except ConnectionError:
        pass
    finally:
        dst.close()


async def main(target: int) -> None:
    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(forward, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
