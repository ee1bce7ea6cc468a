"""Shared by the SQS tests: boto3 clients of either protocol, a reference MD5 of
message attributes written from SQS's documentation, and small helpers."""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import boto3
import botocore.session
from botocore.config import Config

QUERY_MODEL = Path(__file__).resolve().parent / "sqs_query_model"
ACCOUNT = "000000000000"


def client(
    endpoint: str,
    protocol: str = "json",
    *,
    key: str = "AKIDLEASEQTEST",
    secret: str = "secret",
    region: str = "us-east-1",
) -> Any:
    """A boto3 SQS client; `query` loads the last Query-protocol service model."""
    session = botocore.session.get_session()
    if protocol == "query":
        session.get_component("data_loader").search_paths.insert(0, str(QUERY_MODEL))
    sqs = boto3.Session(botocore_session=session).client(
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
