"""A FIFO queue through the SQS door with the AWS CLI: create, send with
deduplication, receive with an attempt id and again with the same one, queue
attributes, and a refusal."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqs_clients import ACCOUNT

AWS = str(Path(sys.executable).parent / "aws")


@pytest.mark.e2e
@pytest.mark.skipif(not Path(AWS).exists(), reason="the awscli package is not installed")
async def test_aws_cli_with_a_fifo_queue(served: tuple[str, Any], tmp_path: Path) -> None:
    base, _ = served
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID="AKIDCLI", AWS_SECRET_ACCESS_KEY="secret",
        AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=str(tmp_path / "aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true", AWS_MAX_ATTEMPTS="1", AWS_PAGER="",
    )

    async def aws(*args: str, ok: bool = True) -> Any:
        proc = await asyncio.create_subprocess_exec(
            AWS, "sqs", *args, "--endpoint-url", base, "--output", "json",
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
        assert (proc.returncode == 0) == ok, err.decode()
        return json.loads(out) if ok and out.strip() else err.decode()

    url = (await aws("create-queue", "--queue-name", "cli.fifo", "--attributes",
                     json.dumps({"FifoQueue": "true", "ContentBasedDeduplication": "false"})))[
        "QueueUrl"]
    assert url == f"{base}/{ACCOUNT}/cli.fifo"
    first = await aws("send-message", "--queue-url", url, "--message-body", "one",
                      "--message-group-id", "g", "--message-deduplication-id", "d-1")
    duplicate = await aws("send-message", "--queue-url", url, "--message-body", "one",
                          "--message-group-id", "g", "--message-deduplication-id", "d-1")
    second = await aws("send-message", "--queue-url", url, "--message-body", "two",
                       "--message-group-id", "g", "--message-deduplication-id", "d-2")
    assert duplicate["MessageId"] == first["MessageId"]
    assert int(second["SequenceNumber"]) > int(first["SequenceNumber"])
    got = await aws("receive-message", "--queue-url", url, "--max-number-of-messages", "10",
                    "--attribute-names", "All", "--receive-request-attempt-id", "cli-try")
    assert [m["Body"] for m in got["Messages"]] == ["one", "two"]
    assert [m["Attributes"]["MessageGroupId"] for m in got["Messages"]] == ["g", "g"]
    assert [m["Attributes"]["SequenceNumber"] for m in got["Messages"]] == [
        first["SequenceNumber"], second["SequenceNumber"]]
    retried = await aws("receive-message", "--queue-url", url, "--max-number-of-messages",
                        "10", "--receive-request-attempt-id", "cli-try")
    assert [m["ReceiptHandle"] for m in retried["Messages"]] == [
        m["ReceiptHandle"] for m in got["Messages"]]
    attributes = (await aws("get-queue-attributes", "--queue-url", url, "--attribute-names",
                            "All"))["Attributes"]
    assert attributes["FifoQueue"] == "true"
    assert "MissingParameter" in await aws(
        "send-message", "--queue-url", url, "--message-body", "x",
        "--message-deduplication-id", "d-3", ok=False)
