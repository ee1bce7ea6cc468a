"""The AWS CLI (`aws sqs ... --endpoint-url`) and `@aws-sdk/client-sqs` under Node
against the real service: the whole cycle, batches, long polling, visibility,
a redrive through a dead-letter queue, and error codes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqs_clients import ACCOUNT, client, run
from support import eventually, wait_until

pytestmark = pytest.mark.e2e

AWS = str(Path(sys.executable).parent / "aws")
NODE = shutil.which("node")
NPM = shutil.which("npm")
ROOT = Path(__file__).resolve().parents[2]
JS_DIR = ROOT / ".cache" / "sqs-js"  # gitignored; installed once
CYCLE = Path(__file__).resolve().parents[1] / "sqs_js" / "cycle.mjs"
NODE_MAJOR = 0 if NODE is None else int(
    subprocess.run([NODE, "--version"], capture_output=True, text=True, check=False)
    .stdout.strip().lstrip("v").split(".")[0] or 0
)


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID="AKIDCLI", AWS_SECRET_ACCESS_KEY="secret",
        AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=str(tmp_path / "aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true", AWS_MAX_ATTEMPTS="1", AWS_PAGER="",
    )
    return env


class Cli:
    def __init__(self, endpoint: str, env: dict[str, str]) -> None:
        self.endpoint = endpoint
        self.env = env

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            AWS, "sqs", *args, "--endpoint-url", self.endpoint, "--output", "json",
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )

    async def finish(self, proc: asyncio.subprocess.Process) -> tuple[int, Any, str]:
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
        text = out.decode()
        return proc.returncode or 0, json.loads(text) if text.strip() else {}, err.decode()

    async def __call__(self, *args: str) -> Any:
        code, out, err = await self.finish(await self.start(*args))
        assert code == 0, err
        return out

    async def error(self, *args: str) -> str:
        code, _, err = await self.finish(await self.start(*args))
        assert code != 0
        return err


@pytest.mark.skipif(not Path(AWS).exists(), reason="the awscli package is not installed")
async def test_aws_cli(served: tuple[str, Any], tmp_path: Path) -> None:
    base, app = served
    aws = Cli(base, _env(tmp_path))
    dlq = (await aws("create-queue", "--queue-name", "cli-dead"))["QueueUrl"]
    assert dlq == f"{base}/{ACCOUNT}/cli-dead"
    dlq_arn = f"arn:aws:sqs:us-east-1:{ACCOUNT}:cli-dead"
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "1"})
    url = (await aws("create-queue", "--queue-name", "cli-work", "--attributes",
                     json.dumps({"RedrivePolicy": policy})))["QueueUrl"]
    await aws("send-message", "--queue-url", url, "--message-body", "one",
              "--message-attributes", '{"k": {"DataType": "String", "StringValue": "v"}}')
    sent = await aws("send-message-batch", "--queue-url", url, "--entries",
                     json.dumps([{"Id": "a", "MessageBody": "two"},
                                 {"Id": "b", "MessageBody": "three"}]))
    assert len(sent["Successful"]) == 2
    got = await aws("receive-message", "--queue-url", url, "--max-number-of-messages", "10",
                    "--message-attribute-names", "All", "--attribute-names", "All")
    messages = got["Messages"]
    assert sorted(m["Body"] for m in messages) == ["one", "three", "two"]
    one = next(m for m in messages if m["Body"] == "one")
    assert one["MessageAttributes"] == {"k": {"DataType": "String", "StringValue": "v"}}
    assert one["Attributes"]["SenderId"] == "AKIDCLI"
    others = [m for m in messages if m is not one]
    await aws("change-message-visibility-batch", "--queue-url", url, "--entries",
              json.dumps([{"Id": "x", "ReceiptHandle": others[0]["ReceiptHandle"],
                           "VisibilityTimeout": 60}]))
    await aws("delete-message-batch", "--queue-url", url, "--entries",
              json.dumps([{"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]}
                          for i, m in enumerate(others)]))
    await aws("change-message-visibility", "--queue-url", url, "--receipt-handle",
              one["ReceiptHandle"], "--visibility-timeout", "0")
    # Received once: the next receive dead-letters it; then redrive it back.
    assert await aws("receive-message", "--queue-url", url) == {}
    attrs = await aws("get-queue-attributes", "--queue-url", dlq, "--attribute-names", "All")
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "1"
    await aws("start-message-move-task", "--source-arn", dlq_arn)
    sqs = client(base)

    async def completed() -> bool:
        tasks = await run(sqs.list_message_move_tasks, SourceArn=dlq_arn)
        return bool(tasks["Results"][0]["Status"] == "COMPLETED")

    await eventually(completed)
    tasks = await aws("list-message-move-tasks", "--source-arn", dlq_arn)
    assert tasks["Results"][0]["Status"] == "COMPLETED"
    back = await aws("receive-message", "--queue-url", url)
    assert back["Messages"][0]["Body"] == "one"
    await aws("delete-message", "--queue-url", url, "--receipt-handle",
              back["Messages"][0]["ReceiptHandle"])

    # Long polling: the CLI's receive waits; a send wakes it.
    started = time.monotonic()
    waiting = await aws.start("receive-message", "--queue-url", url, "--wait-time-seconds", "15")
    await wait_until(lambda: app.state.hub.parked() >= 1, seconds=30)
    await run(sqs.send_message, QueueUrl=url, MessageBody="wake")
    code, woke, err = await aws.finish(waiting)
    assert code == 0, err
    assert woke["Messages"][0]["Body"] == "wake"
    assert time.monotonic() - started < 12

    assert "AWS.SimpleQueueService.NonExistentQueue" in await aws.error(
        "get-queue-url", "--queue-name", "cli-nope")
    assert "QueueAlreadyExists" in await aws.error(
        "create-queue", "--queue-name", "cli-work", "--attributes", '{"DelaySeconds": "3"}')
    assert "ReceiptHandleIsInvalid" in await aws.error(
        "delete-message", "--queue-url", url, "--receipt-handle", "nope")
    assert "TooManyEntriesInBatchRequest" in await aws.error(
        "send-message-batch", "--queue-url", url, "--entries",
        json.dumps([{"Id": str(i), "MessageBody": "x"} for i in range(11)]))
    listed = await aws("list-queues", "--queue-name-prefix", "cli-")
    assert sorted(listed["QueueUrls"]) == [dlq, url]
    await aws("delete-queue", "--queue-url", url)


async def _sdk_installed() -> str | None:
    """The reason to skip, or None once @aws-sdk/client-sqs is installed."""
    if NODE is None or NPM is None:
        return "node or npm is not installed"
    if NODE_MAJOR < 18:
        return f"Node {NODE_MAJOR} is too old for @aws-sdk/client-sqs"
    if (JS_DIR / "node_modules" / "@aws-sdk" / "client-sqs").exists():
        return None
    JS_DIR.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        NPM, "install", "--no-audit", "--no-fund", "--prefix", str(JS_DIR),
        "@aws-sdk/client-sqs@3", stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    async with asyncio.timeout(240):
        out, _ = await proc.communicate()
    if proc.returncode != 0:
        return f"npm install @aws-sdk/client-sqs failed: {out.decode()[-300:]}"
    return None


async def test_aws_sdk_for_javascript(served: tuple[str, Any], tmp_path: Path) -> None:
    reason = await _sdk_installed()
    if reason is not None:
        pytest.skip(reason)
    base, app = served
    script = JS_DIR / "cycle.mjs"  # next to its node_modules, so the import resolves
    shutil.copyfile(CYCLE, script)
    assert NODE is not None
    proc = await asyncio.create_subprocess_exec(
        NODE, str(script), env={**_env(tmp_path), "ENDPOINT": base},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []
    async with asyncio.timeout(90):
        while line := (await proc.stdout.readline()).decode():
            lines.append(line)
            if line.strip() == "step long-poll":
                await wait_until(lambda: app.state.hub.parked() >= 1, seconds=30)
                await run(client(base).send_message, QueueUrl=f"{base}/{ACCOUNT}/js-work",
                          MessageBody="wake")
        err = (await proc.stderr.read()).decode()
        assert await proc.wait() == 0, "".join(lines) + err
    out = json.loads(lines[-1])
    assert out["queues"] == [f"{base}/{ACCOUNT}/js-dead", f"{base}/{ACCOUNT}/js-work"]
    assert len(out["sentMd5"]) == 32
    assert out["moved"] == 1
    assert out["longPoll"]["body"] == "wake"
    assert out["longPoll"]["ms"] < 12_000
    assert out["staleChange"] == "InvalidParameterValue"
    assert out["visibility"] == "45"
    assert out["tags"] == {"team": "js"}
    assert out["errors"] == {
        "missingQueue": "QueueDoesNotExist",
        "exists": "QueueNameExists",
        "fifo": "InvalidParameterValue",
        "badHandle": "ReceiptHandleIsInvalid",
        "tooMany": "TooManyEntriesInBatchRequest",
        "notDistinct": "BatchEntryIdsNotDistinct",
        "badAttribute": "InvalidAttributeName",
        "badValue": "InvalidParameterValue",
    }
