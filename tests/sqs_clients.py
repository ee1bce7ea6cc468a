"""Shared by the SQS tests: boto3 clients of either protocol, a reference MD5 of
message attributes written from SQS's documentation, and small helpers."""

from __future__ import annotations

import asyncio
import functools
import gzip
import hashlib
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

ACCOUNT = "000000000000"
QUERY_BOTOCORE = "1.31.0"
"""The last botocore whose SQS service model speaks the Query protocol."""
_CACHE = Path(__file__).resolve().parent.parent / ".cache" / f"botocore-{QUERY_BOTOCORE}"
_MODEL = "botocore/data/sqs/2012-11-05/service-2.json"

PROTOCOLS = ["json", "query"]
"""The SQS door's two protocols: JSON 1.0 and Query (XML answers)."""
NO_QUEUE = {
    "json": "The specified queue does not exist.",
    "query": "The specified queue does not exist for this wsdl version.",
}
"""What SQS says of a queue that does not exist, by protocol."""


@functools.cache
def query_model() -> Path:
    """A botocore data directory holding the Query-protocol SQS model, taken from
    that botocore's wheel on the package index (fetched once into .cache/).
    Skips the calling test when it cannot be had."""
    target = _CACHE / "sqs" / "2012-11-05" / "service-2.json"
    if not target.exists():
        with tempfile.TemporaryDirectory() as download:
            fetched = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                 "--only-binary=:all:", "-d", download, f"botocore=={QUERY_BOTOCORE}"],
                capture_output=True, text=True, timeout=300,
            )
            wheels = list(Path(download).glob("botocore-*.whl"))
            if fetched.returncode != 0 or not wheels:
                pytest.skip(f"botocore {QUERY_BOTOCORE} (the Query-protocol SQS model) "
                            f"could not be downloaded: {fetched.stderr.strip()[-300:]}")
            with zipfile.ZipFile(wheels[0]) as wheel:
                names = set(wheel.namelist())
                member = next(n for n in (_MODEL, _MODEL + ".gz") if n in names)
                data = wheel.read(member)
        if member.endswith(".gz"):
            data = gzip.decompress(data)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial_file = target.with_suffix(".part")
        partial_file.write_bytes(data)
        partial_file.replace(target)
    return _CACHE


@functools.cache
def _session(protocol: str) -> boto3.Session:
    """One session per protocol: it loads and caches the service model once, where a
    session per client read it again for every client (a tenth of a second each)."""
    session = botocore.session.get_session()
    if protocol == "query":
        session.get_component("data_loader").search_paths.insert(0, str(query_model()))
    return boto3.Session(botocore_session=session)


def client(
    endpoint: str,
    protocol: str = "json",
    *,
    key: str = "AKIDLEASEQTEST",
    secret: str = "secret",
    region: str = "us-east-1",
) -> Any:
    """A boto3 SQS client; `query` loads the last Query-protocol service model."""
    sqs = _session(protocol).client(
        "sqs",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}, read_timeout=60),
    )
    assert sqs.meta.service_model.protocol == protocol
    return sqs


async def run(call: Callable[..., Any], /, **kwargs: Any) -> Any:
    """A blocking client call, off the event loop that serves it."""
    return await asyncio.to_thread(partial(call, **kwargs))


async def refusal(call: Callable[..., Any], /, **kwargs: Any) -> tuple[str, str]:
    """(code, message) of a call that must fail."""
    with pytest.raises(ClientError) as info:
        await run(call, **kwargs)
    error = info.value.response["Error"]
    return str(error["Code"]), str(error["Message"])


def reference_md5_of_attributes(attributes: dict[str, dict[str, Any]]) -> str:
    """MD5OfMessageAttributes as the SQS developer guide describes it."""
    digest = hashlib.md5()
    for name in sorted(attributes):
        value = attributes[name]
        for part in (name.encode(), value["DataType"].encode()):
            digest.update(struct.pack(">I", len(part)) + part)
        if "BinaryValue" in value:
            data = value["BinaryValue"]
            digest.update(b"\x02" + struct.pack(">I", len(data)) + data)
        else:
            data = value["StringValue"].encode()
            digest.update(b"\x01" + struct.pack(">I", len(data)) + data)
    return digest.hexdigest()


def error_code(exc: Exception) -> str:
    return str(exc.response["Error"]["Code"])  # type: ignore[attr-defined]
