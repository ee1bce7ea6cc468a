"""The minimal queue table: the database's floor for a queue with leases.

Six columns (id, queue, body, deadline, receive count, claim token), its primary
key and one claim index, driven by the best raw SQL for it: one statement to
send a batch, one to claim, one conditional delete. Whatever leaseq's schema
and statements cost PostgreSQL beyond this is what issue 26 measures against
(docs/scaling.md). It lives in the bench's database beside leaseq's tables and
is dropped afterwards.
"""

from __future__ import annotations

from bench._harness import execute

TABLE = "bench_minimal_messages"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue int NOT NULL,
    body text NOT NULL,
    deadline timestamptz NOT NULL DEFAULT statement_timestamp(),
    receive_count int NOT NULL DEFAULT 0,
    claim_token uuid
);
CREATE INDEX IF NOT EXISTS {TABLE}_claim ON {TABLE} (queue, deadline);
"""

SEND = f"""
INSERT INTO {TABLE} (queue, body)
SELECT $1, b FROM unnest($2::text[]) AS b
RETURNING id
"""
CLAIM = f"""
UPDATE {TABLE}
SET deadline = statement_timestamp() + interval '600 seconds',
    receive_count = receive_count + 1, claim_token = gen_random_uuid()
WHERE id = ANY(ARRAY(
    SELECT id FROM {TABLE}
    WHERE queue = $1 AND deadline <= statement_timestamp()
    ORDER BY deadline LIMIT $2
    FOR UPDATE SKIP LOCKED))
RETURNING id, claim_token, body
"""
DELETE = f"""
DELETE FROM {TABLE} AS m USING unnest($1::bigint[], $2::uuid[]) AS h(id, token)
WHERE m.id = h.id AND m.claim_token = h.token
RETURNING m.id
"""
PREFILL = f"""
INSERT INTO {TABLE} (queue, body)
SELECT $1, md5(n::text) FROM generate_series(1, $2) AS n
RETURNING id
"""
REMAINING = f"SELECT id::text FROM {TABLE} WHERE queue = $1"


async def create(url: str) -> None:
    await execute(url, SCHEMA)


async def reset(url: str) -> None:
    """Empties the table without leaving dead rows for the next measurement."""
    await execute(url, f"TRUNCATE {TABLE}")


async def drop(url: str) -> None:
    await execute(url, f"DROP TABLE IF EXISTS {TABLE}")
