"""/metrics forgets what is gone: a deleted queue's series leave the exposition at
once, in the process that deleted it, in another process on the same database
that heard the deletion, and with several worker processes sharing the
multiprocess files; creating and deleting queues leaves the exposition no larger.

Nothing in /metrics is labelled by a tenant or a key id (bounded labels: route
templates, SQS actions, queue names), so queues are the only labels that can be
deleted; the last test holds that."""

from __future__ import annotations

import time
from pathlib import Path

import asyncpg
import httpx
import pytest
from conftest import AppClient
from processes import ServiceProcesses
from prometheus_client.parser import text_string_to_metric_families
from support import make_queue, notices_heard, receive, send, wait_until

from app.db.engine import plain_url

Series = set[tuple[str, tuple[tuple[str, str], ...]]]


def series(text: str) -> Series:
    return {
        (sample.name, tuple(sorted(sample.labels.items())))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def naming(found: Series, queues: set[str]) -> Series:
    """The series with a label naming one of `queues`."""
    return {s for s in found if any(value in queues for _, value in s[1])}


async def traffic(client: httpx.AsyncClient, queue: str) -> None:
    """Every per-queue series: sends, claims, an acknowledgement, a heartbeat, a
    release, a lost lease and an empty receive."""
    for _ in range(3):
        await send(client, queue)
    first, second, third = await receive(client, queue, max=3, visibility_timeout=30)
    assert (await client.delete(
        f"/v1/queues/{queue}/messages/{first['receipt_handle']}")).status_code == 204
    assert (await client.patch(
        f"/v1/queues/{queue}/messages/{second['receipt_handle']}/visibility",
        json={"timeout": 60})).status_code == 200
    assert (await client.post(
        f"/v1/queues/{queue}/messages/{third['receipt_handle']}/release")).status_code == 200
    lost = await client.delete(f"/v1/queues/{queue}/messages/{first['receipt_handle']}")
    assert lost.status_code in (204, 409)
    await receive(client, queue, max=10)
    await receive(client, queue, max=10)  # empty now


async def test_a_deleted_queues_series_leave_metrics_at_once(
    client: httpx.AsyncClient,
) -> None:
    doomed = {f"doomed-{i}" for i in range(3)}
    for name in sorted(doomed):
        await make_queue(client, name)
        await traffic(client, name)
    await make_queue(client, "kept")
    await traffic(client, "kept")
    before = series((await client.get("/metrics")).text)
    assert len(naming(before, doomed)) >= 3 * 20
    for name in sorted(doomed):
        assert (await client.delete(f"/v1/queues/{name}")).status_code == 204
    after = series((await client.get("/metrics")).text)
    assert naming(after, doomed) == set()
    assert naming(after, {"kept"}) == naming(before, {"kept"})


async def test_another_process_that_heard_the_deletion_forgets_it_too(
    app_factory: AppClient, database_url: str
) -> None:
    one = await app_factory()
    two = await app_factory()
    doomed = {"gone-a", "gone-b"}
    for name in sorted(doomed):
        await make_queue(one, name)
        await traffic(one, name)
        await traffic(two, name)
    assert len(naming(series((await two.get("/metrics")).text), doomed)) >= 2 * 20
    for name in sorted(doomed):
        assert (await one.delete(f"/v1/queues/{name}")).status_code == 204
    pool = await asyncpg.create_pool(plain_url(database_url), min_size=2, max_size=2)
    try:
        await notices_heard(pool)  # both apps have heard the deletions
    finally:
        await pool.close()
    assert naming(series((await two.get("/metrics")).text), doomed) == set()
    assert naming(series((await one.get("/metrics")).text), doomed) == set()


async def test_creating_and_deleting_queues_leaves_metrics_no_larger(
    client: httpx.AsyncClient,
) -> None:
    await make_queue(client, "steady")
    await client.get("/metrics")  # its own route's series, from here on

    async def cycle(round_: int) -> Series:
        names = [f"churn-{round_}-{i}" for i in range(5)]
        for name in names:
            await make_queue(client, name)
            await traffic(client, name)
        await traffic(client, "steady")
        for name in names:
            assert (await client.delete(f"/v1/queues/{name}")).status_code == 204
        return series((await client.get("/metrics")).text)

    first = await cycle(0)
    for round_ in range(1, 4):
        assert await cycle(round_) == first
    labels = {name for _, labels in first for name, _ in labels}
    assert not labels & {"tenant", "key", "key_id"}


@pytest.mark.e2e
def test_worker_processes_hide_a_deleted_queues_series(
    services: ServiceProcesses, database_url: str, tmp_path: Path
) -> None:
    service = services.start(tmp_path / "w", database_url=database_url,
                             extra_args=("--workers", "2"))
    service.wait_healthy()
    doomed = {f"worker-gone-{i}" for i in range(4)}
    with service.client() as client:
        for name in sorted(doomed):
            assert client.post("/v1/queues", json={"name": name}).status_code == 201
            # New connections: the kernel spreads the traffic over both workers.
            for _ in range(4):
                with service.client() as own:
                    assert own.post(f"/v1/queues/{name}/messages",
                                    json={"body": "x"}).status_code == 201
                    assert own.get(f"/v1/queues/{name}/receive").status_code == 200
        assert naming(series(client.get("/metrics").text), doomed)
        for name in sorted(doomed):
            assert client.delete(f"/v1/queues/{name}").status_code == 204
        # Each worker hears the deletion through PostgreSQL: once both have,
        # no scrape, whichever worker answers, names the queues.
        deadline = time.monotonic() + 20
        clean = 0
        while clean < 10:
            assert time.monotonic() < deadline, "a deleted queue's series stayed"
            with service.client() as own:
                found = naming(series(own.get("/metrics").text), doomed)
            clean = clean + 1 if not found else 0


async def test_a_process_nobody_scrapes_forgets_a_deleted_queue(
    app_factory: AppClient,
) -> None:
    one = await app_factory()
    two = await app_factory()
    await make_queue(one, "unscraped")
    await traffic(two, "unscraped")
    metrics = two.app.state.metrics  # type: ignore[attr-defined]
    assert "unscraped" in metrics.local_queues()
    assert (await one.delete("/v1/queues/unscraped")).status_code == 204
    await wait_until(lambda: "unscraped" not in metrics.local_queues())
