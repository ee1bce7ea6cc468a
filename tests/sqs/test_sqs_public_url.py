"""Queue URLs: built from LEASEQ_PUBLIC_URL when it is set (what a proxy in front
publishes), else from the request's scheme and Host header; every action that
answers with queue URLs (CreateQueue, GetQueueUrl, ListQueues,
ListDeadLetterSourceQueues) gives the same form, and the URLs handed out name
their queue when clients pass them back."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from conftest import ServeApp
from pydantic import ValidationError
from sqs_clients import ACCOUNT, PROTOCOLS, client, run

from app.config import Settings


@pytest.mark.parametrize(("given", "kept"), [
    ("https://q.example.com", "https://q.example.com"),
    ("https://q.example.com/", "https://q.example.com"),
    ("http://q.example.com:4566/sqs//", "http://q.example.com:4566/sqs"),
    ("https://q.example.com/sqs", "https://q.example.com/sqs"),
    ("  https://q.example.com/ ", "https://q.example.com"),
    ("", None),
])
def test_public_url_accepted(given: str, kept: str | None) -> None:
    assert Settings(public_url=given).public_url == kept


@pytest.mark.parametrize("given", [
    "ftp://q.example.com",
    "q.example.com",  # no scheme
    "https://",  # no host
    "https:///sqs",
    "https://q.example.com/?a=1",
    "https://q.example.com/?",
    "https://q.example.com/#top",
    "https://user:secret@q.example.com",
    "https://q.example.com:99999",
    "https://q.example.com:port",
    "https://q.example .com",
    "https://[::1",
])
def test_public_url_refused(given: str) -> None:
    with pytest.raises(ValidationError, match="LEASEQ_PUBLIC_URL"):
        Settings(public_url=given)


def test_public_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASEQ_PUBLIC_URL", "https://q.example.com/sqs/")
    assert Settings().public_url == "https://q.example.com/sqs"


async def queue_urls(sqs: Any) -> dict[str, Any]:
    """The URLs of one queue (and its dead-letter queue) by each action."""
    dead = (await run(sqs.create_queue, QueueName="dead"))["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": f"arn:aws:sqs:us-east-1:{ACCOUNT}:dead",
                         "maxReceiveCount": "2"})
    created = (await run(sqs.create_queue, QueueName="orders",
                         Attributes={"RedrivePolicy": policy}))["QueueUrl"]
    return {
        "created": created,
        "got": (await run(sqs.get_queue_url, QueueName="orders"))["QueueUrl"],
        "listed": (await run(sqs.list_queues))["QueueUrls"],
        "sources": (await run(sqs.list_dead_letter_source_queues, QueueUrl=dead))["queueUrls"],
        "dead": dead,
    }


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_public_url_is_the_base_of_queue_urls(
    serve_factory: ServeApp, protocol: str
) -> None:
    base, _ = await serve_factory(public_url="https://q.example.com/sqs/")
    sqs = client(base, protocol)
    public = f"https://q.example.com/sqs/{ACCOUNT}"
    assert await queue_urls(sqs) == {
        "created": f"{public}/orders", "got": f"{public}/orders",
        "listed": [f"{public}/dead", f"{public}/orders"], "sources": [f"{public}/orders"],
        "dead": f"{public}/dead",
    }
    # The URLs handed out name their queue when passed back, as do the usual forms;
    # the path prefix belongs to the public URL only.
    for url in (f"{public}/orders", f"{base}/{ACCOUNT}/orders", "orders"):
        await run(sqs.send_message, QueueUrl=url, MessageBody=url)
    got = await run(sqs.receive_message, QueueUrl=f"{public}/orders", MaxNumberOfMessages=10)
    assert len(got["Messages"]) == 3
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        await run(sqs.send_message, QueueUrl=f"https://q.example.com/other/{ACCOUNT}/orders",
                  MessageBody="m")


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_without_a_public_url_the_host_header_is_the_base(
    served: tuple[str, Any], protocol: str
) -> None:
    base, _ = served
    here = f"{base}/{ACCOUNT}"
    assert await queue_urls(client(base, protocol)) == {
        "created": f"{here}/orders", "got": f"{here}/orders",
        "listed": [f"{here}/dead", f"{here}/orders"], "sources": [f"{here}/orders"],
        "dead": f"{here}/dead",
    }


REGION_HOST = "sqs.us-east-1.localhost:4566"  # LocalStack's region-style endpoint


async def urls_by_action(http: httpx.AsyncClient, protocol: str) -> list[str]:
    """CreateQueue's, GetQueueUrl's and ListQueues' URLs of one queue, over raw
    HTTP (to choose the Host header)."""
    calls = [("CreateQueue", {"QueueName": "orders"}), ("GetQueueUrl", {"QueueName": "orders"}),
             ("ListQueues", {})]
    urls: list[str] = []
    for action, params in calls:
        if protocol == "json":
            answer = await http.post("/", content=json.dumps(params), headers={
                "Content-Type": "application/x-amz-json-1.0",
                "X-Amz-Target": f"AmazonSQS.{action}"})
            assert answer.status_code == 200, answer.text
            body = answer.json()
            urls += body["QueueUrls"] if action == "ListQueues" else [body["QueueUrl"]]
        else:
            answer = await http.post("/", data={"Action": action, "Version": "2012-11-05",
                                                **params})
            assert answer.status_code == 200, answer.text
            urls += re.findall(r"<QueueUrl>([^<]*)</QueueUrl>", answer.text)
    return urls


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_region_style_hosts_get_one_url_form(
    serve_factory: ServeApp, protocol: str
) -> None:
    base, _ = await serve_factory(allowed_hosts="*")
    async with httpx.AsyncClient(base_url=base, headers={"Host": REGION_HOST}) as http:
        urls = await urls_by_action(http, protocol)
    assert urls == [f"http://{REGION_HOST}/{ACCOUNT}/orders"] * 3


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_public_url_wins_over_the_host_header(
    serve_factory: ServeApp, protocol: str
) -> None:
    base, _ = await serve_factory(allowed_hosts="*", public_url="https://q.example.com")
    async with httpx.AsyncClient(base_url=base, headers={"Host": REGION_HOST}) as http:
        urls = await urls_by_action(http, protocol)
    assert urls == [f"https://q.example.com/{ACCOUNT}/orders"] * 3
