"""Every worker works against a service that requires API keys: the Python SDK
(api_key, or LEASEQ_API_KEY), the Node worker and the curl worker (LEASEQ_API_KEY),
each with a key scoped to receiving from its queue."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from processes import service_env
from support import wait_until

from leaseq import AsyncClient, ClientError, Message, Worker

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
NODE = shutil.which("node")


async def _keys(app: Any) -> tuple[str, str]:
    admin, admin_secret = await app.state.keys.create("admin", ["admin:*"])
    worker, worker_secret = await app.state.keys.create("worker", ["receive:jobs-*"])
    return f"{admin.id}.{admin_secret}", f"{worker.id}.{worker_secret}"


async def _empty(api: AsyncClient, queue: str) -> None:
    async with asyncio.timeout(30):
        while True:
            stats = (await api.get_queue(queue)).stats
            if stats is not None and stats.visible == stats.in_flight == 0:
                return
            await asyncio.sleep(0.05)


async def test_the_python_worker_and_client(served: tuple[str, Any]) -> None:
    url, app = served
    admin, worker_key = await _keys(app)
    async with AsyncClient(url) as anonymous, AsyncClient(url, api_key=admin) as api:
        with pytest.raises(ClientError) as info:
            await anonymous.create_queue("jobs-py")
        assert info.value.status == 401
        await api.create_queue("jobs-py")
        await api.send("jobs-py", "hello")
        seen: list[str] = []

        async def handler(message: Message, _ctx: Any) -> None:
            seen.append(message.body)

        worker = Worker(handler, queue="jobs-py", url=url, wait=1, api_key=worker_key)
        task = asyncio.create_task(worker.serve())
        try:
            await wait_until(lambda: worker.stats.acknowledged == 1, seconds=20)
        finally:
            worker.stop(now=True)
            await task
        assert seen == ["hello"]
        await _empty(api, "jobs-py")


@pytest.mark.skipif(NODE is None, reason="node is not installed")
async def test_the_node_worker(served: tuple[str, Any], tmp_path: Path) -> None:
    url, app = served
    admin, worker_key = await _keys(app)
    events = tmp_path / "events.jsonl"
    async with AsyncClient(url, api_key=admin) as api:
        await api.create_queue("jobs-node")
        await api.send("jobs-node", json.dumps({"steps": 1, "step": 0.01}))
        proc = await asyncio.create_subprocess_exec(
            str(NODE), str(ROOT / "clients" / "node" / "bin" / "leaseq-worker.js"), "--url", url,
            "--queue", "jobs-node", "--wait", "1",
            str(ROOT / "tests" / "worker_handlers" / "node_handler.mjs"),
            env=service_env() | {"LEASEQ_TEST_EVENTS": str(events),
                                 "LEASEQ_API_KEY": worker_key},
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await _empty(api, "jobs-node")
        finally:
            proc.terminate()
            _, err = await proc.communicate()
        kinds = [json.loads(line)["kind"] for line in events.read_text().splitlines()]
        assert "started" in kinds, err.decode()[-2000:]


@pytest.mark.skipif(not all(shutil.which(t) for t in ("bash", "curl", "jq")),
                    reason="the shell worker needs bash, curl and jq")
async def test_the_curl_worker(served: tuple[str, Any], tmp_path: Path) -> None:
    url, app = served
    admin, worker_key = await _keys(app)
    async with AsyncClient(url, api_key=admin) as api:
        await api.create_queue("jobs-sh")
        await api.send("jobs-sh", "payload")
        proc = await asyncio.create_subprocess_exec(
            "bash", str(ROOT / "examples" / "curl-worker.sh"), "jobs-sh", "true",
            env=service_env() | {"LEASEQ_URL": url, "LEASEQ_ONCE": "1", "LEASEQ_WAIT": "2",
                                 "LEASEQ_API_KEY": worker_key},
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        async with asyncio.timeout(30):
            out, _ = await proc.communicate()
        assert proc.returncode == 0, out.decode()[-2000:]
        await _empty(api, "jobs-sh")
