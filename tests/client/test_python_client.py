"""The Python client package in-process: it loads nothing of the server, its public
surface, and its clients (async and blocking) against the real service (uvicorn in
this event loop, real PostgreSQL): typed results, problems as exceptions, long polls."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from processes import LEASEQ, service_env
from support import eventually
from worker_support import stats

import leaseq
from leaseq import (
    ApiError,
    AsyncClient,
    Client,
    InvalidReceiptHandle,
    LeaseLost,
    Message,
    OutgoingMessage,
    PeekedMessage,
    PeekPage,
    Queue,
    QueueAlreadyExists,
    QueueNotFound,
    QueuePage,
    RedriveTask,
    Released,
    RetryBackoff,
    Unreachable,
    ValidationError,
)

TESTS = Path(__file__).resolve().parents[1]

SERVER_MODULES = (
    "fastapi", "starlette", "sqlalchemy", "asyncpg", "uvicorn", "pydantic", "pydantic_settings",
    "alembic", "app",
)


def server_modules(loaded: list[str]) -> list[str]:
    return [m for m in loaded if any(m == s or m.startswith(s + ".") for s in SERVER_MODULES)]


# -- the package stands alone --------------------------------------------------------


@pytest.mark.e2e
def test_importing_the_client_loads_no_server_module() -> None:
    # The package's names load when first used (leaseq/__init__.py): use them.
    code = ("import json, sys\nfrom leaseq import AsyncClient, Client, Worker\n"
            "print(json.dumps(sorted(sys.modules)))")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
        cwd=TESTS.parent,
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert "leaseq" in loaded and "httpx" in loaded
    assert server_modules(loaded) == []


@pytest.mark.e2e
def test_leaseq_worker_loads_no_server_module(tmp_path: Path) -> None:
    # The probe handler module records sys.modules when the worker imports it;
    # `missing` then makes the command stop with exit 2.
    out = tmp_path / "modules.json"
    env = service_env() | {"LEASEQ_TEST_MODULES": str(out)}
    result = subprocess.run(
        [LEASEQ, "worker", "--queue", "q", "--app-dir", str(TESTS),
         "worker_handlers.modules_probe:missing"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "cannot load worker_handlers.modules_probe:missing" in result.stderr
    loaded = json.loads(out.read_text())
    assert "leaseq.cli" in loaded and "app" not in loaded
    assert server_modules(loaded) == []


def test_the_public_surface() -> None:
    assert sorted(leaseq.__all__) == sorted(
        name for name in dir(leaseq) if not name.startswith("_")
        and name not in {
            "backoff", "batching", "cli", "client", "context", "errors", "lease", "models",
            "tracing", "worker",
        }
    )


# -- the clients ---------------------------------------------------------------------


async def test_the_clients_cover_queues_peek_and_redrive_with_typed_results(
    api: AsyncClient, url: str
) -> None:
    await api.create_queue("typed-dlq")
    created = await api.create_queue(
        "typed", visibility_timeout=5, dead_letter_queue="typed-dlq", max_receive_count=1,
        retry_backoff={"initial": 2, "max": 8, "multiplier": 2, "jitter": 0},
    )
    assert isinstance(created, Queue) and created.stats is None
    assert created.attributes.dead_letter_queue == "typed-dlq"
    assert created.attributes.retry_backoff == RetryBackoff(2, 2, 8, 0)
    changed = await api.update_queue("typed", visibility_timeout=7, retry_backoff=None)
    assert changed.attributes.visibility_timeout == 7 and changed.attributes.retry_backoff is None
    page = await api.list_queues(prefix="typed", limit=1)
    assert [q.name for q in page.queues] == ["typed"] and page.next_after == "typed"
    rest = await api.list_queues(prefix="typed", after=page.next_after)
    assert [q.name for q in rest.queues] == ["typed-dlq"]
    assert await api.dead_letter_sources("typed-dlq") == ["typed"]

    await api.send("typed", "x" * 50, attributes={"k": "v"})
    peeked = await api.peek("typed", state="visible", body_chars=10)
    (one,) = peeked.messages
    assert isinstance(one, PeekedMessage) and one.body == "x" * 10 and one.truncated
    assert one.attributes == {"k": "v"} and one.state == "visible" and peeked.next_after is None
    # received once, then dead-lettered by the next claim (max_receive_count 1)
    (got,) = await api.receive("typed", visibility_timeout=0, wait=0)
    assert await api.receive("typed", wait=0) == []
    detail = await api.get_queue("typed-dlq")
    assert detail.stats is not None and detail.stats.visible == 1
    assert (await api.peek("typed-dlq")).messages[0].dead_letter_source == "typed"

    task = await api.start_redrive("typed-dlq")
    assert isinstance(task, RedriveTask) and task.source == "typed-dlq"
    assert [t.task_id for t in await api.list_redrives("typed-dlq")] == [task.task_id]

    async def finished() -> bool:
        return (await api.get_redrive(task.task_id)).status != "running"

    await eventually(finished)
    done = await api.get_redrive(task.task_id)
    assert (done.status, done.moved) == ("completed", 1)
    with pytest.raises(ApiError) as info:
        await api.cancel_redrive("not-a-task")
    assert (info.value.status, info.value.code) == (404, "task_not_found")

    def blocking_calls() -> tuple[Queue, QueuePage, PeekPage]:
        with Client(url) as blocking:  # the blocking client has the same calls
            return (blocking.get_queue("typed"), blocking.list_queues(prefix="typed-"),
                    blocking.peek("typed"))

    queue, listed, peek = await asyncio.to_thread(blocking_calls)
    assert queue.stats is not None and [q.name for q in listed.queues] == ["typed-dlq"]
    assert peek.messages[0].message_id == got.message_id


async def test_the_async_client_speaks_the_whole_message_api(api: AsyncClient) -> None:
    created = await api.create_queue("sdk", visibility_timeout=30)
    assert created.name == "sdk" and created.attributes.visibility_timeout == 30
    assert (await api.create_queue("sdk", visibility_timeout=30)).name == "sdk"
    with pytest.raises(QueueAlreadyExists):
        await api.create_queue("sdk", visibility_timeout=31)

    one = await api.send("sdk", "one", attributes={"kind": "a"})
    batch = await api.send_batch("sdk", ["two", OutgoingMessage("three", delay=0)])
    assert all(not isinstance(r, ApiError) for r in batch)
    got = await api.receive("sdk", max=10, visibility_timeout=7, wait=0)
    assert sorted(m.body for m in got) == ["one", "three", "two"]
    first = next(m for m in got if m.message_id == one.message_id)
    assert first.attributes == {"kind": "a"} and first.receive_count == 1
    assert first.lease_seconds == 7 and first.checkpoint is None
    assert len({m.fencing_token for m in got}) == 3

    lease = await api.extend("sdk", first.receipt_handle, 12)
    assert lease.lease_seconds == 12
    saved = await api.checkpoint("sdk", first.receipt_handle, {"next": 4})
    assert saved.lease_seconds == 30  # the service renews a checkpoint by the queue's timeout
    saved = await api.checkpoint("sdk", first.receipt_handle, {"next": 4}, timeout=11)
    assert saved.lease_seconds == 11  # ... or by the timeout it is given
    extended = await api.extend_batch("sdk", [(m.receipt_handle, 9) for m in got])
    assert [r.lease_seconds for r in extended if not isinstance(r, ApiError)] == [9, 9, 9]

    released = await api.release("sdk", first.receipt_handle)  # no ladder: at once
    assert isinstance(released, Released) and released.delay_seconds == 0
    (again,) = await api.receive("sdk", wait=0)
    assert again.message_id == one.message_id and again.checkpoint == {"next": 4}
    assert again.receive_count == 2 and again.fencing_token > first.fencing_token

    # the first claim is dead for good: every write with its handle is refused
    with pytest.raises(LeaseLost) as lost:
        await api.extend("sdk", first.receipt_handle, 5)
    assert lost.value.status == 409 and lost.value.code == "lease_lost"
    with pytest.raises(LeaseLost):
        await api.delete("sdk", first.receipt_handle)
    with pytest.raises(LeaseLost):
        await api.checkpoint("sdk", first.receipt_handle, 1)

    results = await api.delete_batch(
        "sdk", [again.receipt_handle, first.receipt_handle,
                *(m.receipt_handle for m in got if m is not first)]
    )
    assert results[0] is None and isinstance(results[1], LeaseLost)
    assert results[2:] == [None, None]
    assert await stats(api, "sdk") == {
        "visible": 0, "in_flight": 0, "delayed": 0, "oldest_age_seconds": 0.0
    }


async def test_problems_become_exceptions_by_their_code(api: AsyncClient) -> None:
    with pytest.raises(QueueNotFound) as missing:
        await api.receive("nowhere", wait=0)
    assert missing.value.status == 404 and not missing.value.transient
    await api.create_queue("errs")
    with pytest.raises(InvalidReceiptHandle):
        await api.delete("errs", "not-a-handle")
    with pytest.raises(ValidationError):
        await api.receive("errs", max=11)
    with pytest.raises(ValidationError):
        await api.send("errs", "")


async def test_an_unreachable_service_is_one_exception() -> None:
    async with AsyncClient("http://127.0.0.1:1", timeout=5) as dead:
        with pytest.raises(Unreachable):
            await dead.receive("q", wait=0)
    with Client("http://127.0.0.1:1", timeout=5) as sync_dead, pytest.raises(Unreachable):
        sync_dead.send("q", "x")


async def test_the_blocking_client(url: str) -> None:
    def round_trip() -> list[Message]:
        with Client(url) as client:
            client.create_queue("blocking", visibility_timeout=10)
            client.send("blocking", "b")
            received = client.receive("blocking", max=1, wait=1)
            client.delete("blocking", received[0].receipt_handle)
            with pytest.raises(LeaseLost):
                client.delete("blocking", received[0].receipt_handle)
            return received

    (message,) = await asyncio.to_thread(round_trip)
    assert message.body == "b" and message.lease_seconds == 10


async def test_a_long_poll_outlasts_the_default_timeout(api: AsyncClient) -> None:
    # The read timeout of a receive follows its `wait`: a 2 s poll on a client
    # whose own timeout is 1 s answers (empty) instead of timing out.
    await api.create_queue("slowpoll")
    async with AsyncClient(api.url, timeout=1.0) as short:
        assert await short.receive("slowpoll", wait=2) == []
