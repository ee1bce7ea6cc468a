"""The forms of a QueueUrl SQS clients send, with boto3 on both protocols: any host,
port or region, or a bare name, names the queue; another account's does not. One
leaseq serves one region (LEASEQ_SQS_REGION): a URL naming another region names
the queue by its path, as a URL naming any other host does."""

from __future__ import annotations

from typing import Any

from sqs_clients import ACCOUNT, NO_QUEUE, refusal, run

QUEUE_URL_FORMS = [
    "forms",  # a bare queue name
    f"https://sqs.eu-west-1.amazonaws.com/{ACCOUNT}/forms",  # another host and region
    f"http://localhost:4566/{ACCOUNT}/forms",  # LocalStack's, ElasticMQ's
    f"http://sqs.us-east-1.localhost.localstack.cloud:4566/{ACCOUNT}/forms",
    # Region-specific hosts of other regions: a QueueUrl names its queue by its path.
    f"https://eu-west-1.queue.amazonaws.com/{ACCOUNT}/forms",  # SQS's legacy regional
    f"https://queue.amazonaws.com/{ACCOUNT}/forms",  # legacy, us-east-1
    f"http://sqs.eu-central-1.localhost.localstack.cloud:4566/{ACCOUNT}/forms",
    f"http://eu-central-1.queue.localhost.localstack.cloud:4566/{ACCOUNT}/forms",
    f"http://localhost:4566/queue/eu-central-1/{ACCOUNT}/forms",
    f"http://localhost:4566/queue/us-east-1/{ACCOUNT}/forms",  # LocalStack path-style
    "http://localhost:9324/queue/forms",  # ElasticMQ's old form
    f"{ACCOUNT}/forms",
]


async def test_queue_url_forms(sqs: Any, protocol: str, served: tuple[str, Any]) -> None:
    """A QueueUrl of any host, port or region, or a bare name, names the queue."""
    url = (await run(sqs.create_queue, QueueName="forms"))["QueueUrl"]
    await run(sqs.create_queue, QueueName="forms-other")
    for form in QUEUE_URL_FORMS:
        await run(sqs.send_message, QueueUrl=form, MessageBody=form)
    received: list[str] = []
    for _ in range(len(QUEUE_URL_FORMS)):
        got = await run(sqs.receive_message, QueueUrl="forms", MaxNumberOfMessages=10)
        received += [m["Body"] for m in got.get("Messages", [])]
        if len(received) == len(QUEUE_URL_FORMS):
            break
    assert sorted(received) == sorted(QUEUE_URL_FORMS)
    attributes = await run(sqs.get_queue_attributes, QueueUrl="forms-other",
                           AttributeNames=["ApproximateNumberOfMessages"])
    assert attributes["Attributes"]["ApproximateNumberOfMessages"] == "0"
    assert (await run(sqs.get_queue_url, QueueName="forms"))["QueueUrl"] == url
    expected = ("AWS.SimpleQueueService.NonExistentQueue", NO_QUEUE[protocol])
    for refused in [
        "https://sqs.eu-west-1.amazonaws.com/123456789012/forms",  # another account
        "http://localhost:4566/queue/us-east-1/123456789012/forms",
        "nope",  # a bare name of no queue
        "no such name!",
        "http://[::1/000000000000/forms",  # not a URL (urlsplit refuses it)
        f"http://localhost:4566/{ACCOUNT}/forms/extra",
        f"http://localhost:4566/{ACCOUNT}/",
    ]:
        assert await refusal(sqs.send_message, QueueUrl=refused, MessageBody="m") == expected
