"""The queue engine's CPU per message, in process: `python -m bench.engine`.

No HTTP, no load generator in another process: 16 tasks of this process run
send -> receive (short poll) -> delete through `QueueService`, with single
messages and with batches of 10, and the process's CPU time is divided by the
messages. The database is DATABASE_URL's, else an embedded PostgreSQL of its
own. CPU per message moves far less with the machine's other load than
throughput does, so it is the figure to compare between two versions of the
engine (run each in turn, twice, in the same minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from pydantic import SecretStr

from app.config import Settings
from app.db.embedded import EmbeddedPostgres, remove
from app.db.migrate import upgrade
from app.main import create_app
from app.queue.models import OutgoingMessage

TASKS = 16


async def measure(url: str, rounds: int, passes: int) -> None:
    await asyncio.to_thread(upgrade, url)
    settings = Settings(
        database_url=url, data_dir=Path(tempfile.mkdtemp(prefix="leaseq-bench-")),
        secret=SecretStr("bench-secret-0123456789abcdef"), retention_sweep_seconds=3600,
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        service = app.state.service
        for name in ("engine-single", "engine-batch"):
            await service.queues.create_queue(name, {})

        async def cycle(name: str, size: int) -> None:
            for _ in range(rounds):
                await service.send(name, [OutgoingMessage(body="x" * 100) for _ in range(size)])
                got = await service.receive(name, max_messages=size, visibility_timeout=30, wait=0)
                if got:
                    await service.delete(name, [m.receipt_handle for m in got])

        print(f"engine, in process, {TASKS} tasks, {rounds} cycles each (first pass warms up)")
        for one in range(passes):
            for name, size in (("engine-single", 1), ("engine-batch", 10)):
                cpu, wall = time.process_time(), time.perf_counter()
                await asyncio.gather(*(cycle(name, size) for _ in range(TASKS)))
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                count = TASKS * rounds * size
                print(f"pass {one + 1}, {'single' if size == 1 else 'batch 10':8} "
                      f"{count:6} messages  {count / wall:7.0f} msg/s  "
                      f"CPU {cpu / count * 1e6:6.1f} us per message")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=150, help="cycles per task and pass")
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL")
    embedded = None
    if url is None:
        embedded = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="leaseq-bench-pg-")))
        url = embedded.start()
    try:
        asyncio.run(measure(url, args.rounds, args.passes))
    finally:
        if embedded is not None:
            embedded.stop()
            remove(embedded.data_dir)


if __name__ == "__main__":
    main()
