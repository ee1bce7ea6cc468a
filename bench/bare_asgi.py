"""The least an ASGI app can do under uvicorn: answer every request `200 {}`.
`python -m bench` serves it with the service's uvicorn settings to measure the
server's own cost per request, beside which leaseq's figures are read."""

from __future__ import annotations

from typing import Any

_BODY = b"{}"
_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"2")]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": _BODY})


if __name__ == "__main__":
    # As `leaseq serve` runs uvicorn: httptools (one write per answer), uvloop,
    # no server header.
    import sys

    import uvicorn

    from app.asgi.one_write import OneWriteHttpToolsProtocol

    uvicorn.run(app, port=int(sys.argv[1]), log_level="warning", access_log=False,
                server_header=False, http=OneWriteHttpToolsProtocol)
