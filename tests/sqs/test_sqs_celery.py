"""Celery with kombu's SQS transport runs one task end to end through leaseq.

Skipped when celery (with kombu's SQS extra: boto3 and pycurl) is not installed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import eventually

pytest.importorskip("kombu.transport.SQS", reason="celery[sqs] (kombu's SQS transport) "
                    "is not installed")
pytest.importorskip("pycurl", reason="pycurl (kombu's SQS HTTP client) is not installed")

pytestmark = pytest.mark.e2e

TASKS = '''
import os
from celery import Celery

app = Celery("tasks", broker="sqs://AKIDCELERY:secret@" + os.environ["HOSTPORT"])
app.conf.broker_transport_options = {
    "region": "us-east-1", "is_secure": False, "polling_interval": 0.1,
    "wait_time_seconds": 1,
}
app.conf.task_default_queue = "celery-jobs"
app.conf.broker_connection_retry_on_startup = True


@app.task
def add(x, y):
    with open(os.environ["OUT"], "a") as out:
        out.write(f"{x + y}\\n")
    return x + y
'''


async def test_celery_runs_a_task(served: tuple[str, Any], tmp_path: Path) -> None:
    base, _ = served
    (tmp_path / "tasks.py").write_text(TASKS)
    out = tmp_path / "out.txt"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
           "HOSTPORT": base.removeprefix("http://"), "OUT": str(out),
           "PYTHONPATH": str(tmp_path)}
    send = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from tasks import add; add.delay(2, 3)",
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    async with asyncio.timeout(60):
        sent, _ = await send.communicate()
    assert send.returncode == 0, sent.decode()
    log = tmp_path / "worker.log"
    with log.open("wb") as sink:
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "celery", "-A", "tasks", "worker", "--pool", "solo",
            "--loglevel", "info", "--without-mingle", "--without-gossip",
            cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )
        try:
            async def done() -> bool:
                return out.exists() and out.read_text() == "5\n"

            await eventually(done, seconds=40)
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(20):
                    await worker.wait()
            except TimeoutError:
                worker.kill()
                await worker.wait()
    assert "succeeded" in log.read_text()
