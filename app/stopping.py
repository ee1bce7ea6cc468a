"""A stop asked by a signal, seen the moment it arrives.

uvicorn, serving, captures SIGTERM and SIGINT and then drains: it closes its
sockets and waits up to its graceful timeout for open requests. A parked long
poll would hold that drain for the rest of its wait, so the moment the signal
arrives the wait hub is closed first (every parked receive answers at once,
empty, and none parks again); then uvicorn's own handler runs as before. This
works in every mode (`--workers N` children capture signals the same way).
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType

import uvicorn

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def on_stop_signal(callback: Callable[[], None]) -> Callable[[], None]:
    """Runs `callback` in the running loop when a stop signal reaches a process
    that uvicorn is serving; returns what undoes it. Elsewhere (an app in a
    test, no uvicorn capturing signals) nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    replaced: dict[int, Callable[[int, FrameType | None], object]] = {}
    for sig in STOP_SIGNALS:
        current = signal.getsignal(sig)
        if not callable(current) or not isinstance(getattr(current, "__self__", None),
                                                   uvicorn.Server):
            continue
        replaced[sig] = current

        def handler(
            signum: int, frame: FrameType | None,
            uvicorn_handler: Callable[[int, FrameType | None], object] = current,
        ) -> None:
            loop.call_soon_threadsafe(callback)
            uvicorn_handler(signum, frame)

        signal.signal(sig, handler)

    def undo() -> None:
        for sig, previous in replaced.items():
            signal.signal(sig, previous)

    return undo
