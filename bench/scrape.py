"""The cost of a /metrics scrape with many queues.

    python -m bench.scrape [--queues 1000] [--messages 100]

Starts `leaseq serve` (embedded PostgreSQL unless DATABASE_URL is set), creates
the queues through the API, fills each with messages in several states (visible,
in flight, delayed) straight in SQL, then times scrapes that miss the gauge cache
(one every GAUGE_CACHE_SECONDS and a bit) next to a floor measured the same way: the
same statement run from a plain asyncpg connection, and an HTTP round trip to
/healthz. Target: a scrape of 1,000 queues within 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg

from app.api.queue_gauges import GAUGE_CACHE_SECONDS
from app.queue.sql import Q
from bench._harness import Http, running_service, summary_ms
from bench.longpoll import database_url

FILL = """
INSERT INTO leaseq.messages (queue_id, body, visible_at, leased, receive_count,
                      claim_token, fencing_token)
SELECT q.id, 'x',
       CASE WHEN g % 10 = 0 THEN now() + interval '1 hour'  -- in flight
            WHEN g % 10 = 1 THEN now() + interval '10 minutes'  -- delayed
            ELSE now() - g * interval '1 second' END,
       g % 10 = 0, CASE WHEN g % 10 = 0 THEN 1 ELSE 0 END,
       CASE WHEN g % 10 = 0 THEN gen_random_uuid() END,
       CASE WHEN g % 10 = 0 THEN nextval('leaseq.fencing_tokens') END
FROM leaseq.queues AS q, generate_series(1, $1) AS g
"""


async def measure(port: int, url: str, queues: int, messages: int, rounds: int) -> None:
    http = await Http.open(port)
    started = time.perf_counter()
    for i in range(queues):
        status, _ = await http.request("POST", "/v1/queues", {"name": f"q{i:05d}"})
        assert status == 201, status
    db = await asyncpg.connect(url)
    await db.execute(FILL, messages)
    await db.execute("ANALYZE leaseq.messages")
    print(f"{queues} queues, {queues * messages} messages, ready in "
          f"{time.perf_counter() - started:.1f} s")

    floor_sql, floor_http, scrapes, sizes = [], [], [], []
    for _ in range(rounds):
        start = time.perf_counter()
        await db.fetch(Q.queue_gauges.sql)
        floor_sql.append(time.perf_counter() - start)
        start = time.perf_counter()
        await http.request("GET", "/healthz")
        floor_http.append(time.perf_counter() - start)
        await asyncio.sleep(GAUGE_CACHE_SECONDS + 0.1)  # past the cache: a real reading
        start = time.perf_counter()
        status, body = await http.raw("GET", "/metrics")
        scrapes.append(time.perf_counter() - start)
        assert status == 200
        sizes.append(len(body))
    await db.close()
    http.close()
    print(f"floor: queue_gauges over asyncpg   {summary_ms(floor_sql)}")
    print(f"floor: GET /healthz                {summary_ms(floor_http)}")
    print(f"GET /metrics (cache missed)        {summary_ms(scrapes)}   "
          f"{sizes[-1] / 1024:.0f} KiB")
    median = sorted(scrapes)[len(scrapes) // 2]
    floor = sorted(floor_sql)[len(floor_sql) // 2] + sorted(floor_http)[len(floor_http) // 2]
    print(f"scrape / (statement + round trip): {median / floor:.2f}; "
          f"target: within 100 ms ({'met' if median <= 0.1 else 'NOT met'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=100, help="per queue")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with running_service() as service:
        asyncio.run(measure(service.port, database_url(service), args.queues, args.messages,
                            args.rounds))


if __name__ == "__main__":
    main()
