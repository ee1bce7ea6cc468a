"""LEASEQ_SQS_CREDENTIALS: with keys configured, SQS requests must carry a valid
AWS Signature Version 4 (over the body too); anything else gets the error an SQS
client expects. Without keys, any access key is accepted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from conftest import ServeApp
from sqs_clients import client, error_code, run

from app.config import Settings

ONE = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
TWO = "Zq3_x8VbN1-kPf0wYt7uLr2sHc9aJe4dMg6iWo5n"
KEYS = f"AKIDONE:{ONE}, AKIDTWO:{TWO}"


@pytest.fixture
async def signed(serve_factory: ServeApp) -> str:
    """The app behind a real uvicorn, with SQS credentials configured."""
    return (await serve_factory(sqs_credentials=KEYS))[0]


@pytest.mark.parametrize("protocol", ["json", "query"])
async def test_signed_requests_work_and_others_are_refused(signed: str, protocol: str) -> None:
    good = client(signed, protocol, key="AKIDTWO", secret=TWO)
    url = (await run(good.create_queue, QueueName="signed"))["QueueUrl"]
    await run(good.send_message, QueueUrl=url, MessageBody="hello ✓")
    got = await run(good.receive_message, QueueUrl=url, AttributeNames=["SenderId"])
    assert got["Messages"][0]["Body"] == "hello ✓"
    assert got["Messages"][0]["Attributes"]["SenderId"] == "AKIDTWO"

    wrong_secret = client(signed, protocol, key="AKIDONE", secret=TWO)
    with pytest.raises(ClientError) as info:
        await run(wrong_secret.list_queues)
    assert error_code(info.value) == "SignatureDoesNotMatch"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403

    unknown = client(signed, protocol, key="AKIDNOBODY", secret=ONE)
    with pytest.raises(ClientError) as info:
        await run(unknown.list_queues)
    assert error_code(info.value) == "InvalidClientTokenId"

    # A signature scoped to another region than LEASEQ_SQS_REGION's.
    elsewhere = client(signed, protocol, key="AKIDTWO", secret=TWO, region="eu-west-1")
    with pytest.raises(ClientError) as info:
        await run(elsewhere.list_queues)
    assert error_code(info.value) == "SignatureDoesNotMatch"
    assert "region" in info.value.response["Error"]["Message"]


async def test_the_configured_region_is_the_one_signed_for(serve_factory: ServeApp) -> None:
    endpoint, _ = await serve_factory(sqs_credentials=KEYS, sqs_region="eu-west-1")
    here = client(endpoint, "json", key="AKIDONE", secret=ONE, region="eu-west-1")
    await run(here.create_queue, QueueName="regional")
    there = client(endpoint, "json", key="AKIDONE", secret=ONE, region="us-east-1")
    with pytest.raises(ClientError) as info:
        await run(there.list_queues)
    assert error_code(info.value) == "SignatureDoesNotMatch"


def _signed_request(endpoint: str, body: bytes, secret: str) -> AWSRequest:
    request = AWSRequest(
        method="POST", url=endpoint + "/", data=body,
        headers={"Content-Type": "application/x-amz-json-1.0",
                 "X-Amz-Target": "AmazonSQS.ListQueues"},
    )
    SigV4Auth(Credentials("AKIDONE", secret), "sqs", "us-east-1").add_auth(request)
    return request


async def test_the_body_is_signed_and_unsigned_requests_are_refused(signed: str) -> None:
    async with httpx.AsyncClient() as http:
        request = _signed_request(signed, b"{}", ONE)
        ok = await http.post(signed + "/", content=b"{}", headers=dict(request.headers))
        assert ok.status_code == 200, ok.text
        # The same signature over another body.
        tampered = await http.post(signed + "/", content=b'{"QueueNamePrefix": "x"}',
                                   headers=dict(request.headers))
        assert tampered.status_code == 403
        assert tampered.headers["x-amzn-query-error"] == "SignatureDoesNotMatch;Sender"
        unsigned = await http.post(signed + "/", data={"Action": "ListQueues"})
        assert unsigned.status_code == 403
        assert "<Code>MissingAuthenticationToken</Code>" in unsigned.text
        # A service other than sqs in the credential scope.
        other = AWSRequest(method="POST", url=signed + "/", data=b"{}", headers={
            "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"})
        SigV4Auth(Credentials("AKIDONE", ONE), "s3", "us-east-1").add_auth(other)
        refused = await http.post(signed + "/", content=b"{}", headers=dict(other.headers))
        assert refused.status_code == 403


async def test_without_credentials_any_key_is_accepted(served: tuple[str, Any]) -> None:
    sqs = client(served[0], key="ANYTHING", secret="whatever")
    assert (await run(sqs.list_queues)).get("QueueUrls", []) == []


def test_credentials_setting_is_checked(settings_factory: Callable[..., Settings]) -> None:
    with pytest.raises(ValueError, match="ACCESS_KEY:SECRET"):
        settings_factory(sqs_credentials="no-colon-here")
