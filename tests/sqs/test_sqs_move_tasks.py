"""SQS message move tasks as AWS answers them, with boto3 on both protocols: the
shapes of StartMessageMoveTask, ListMessageMoveTasks and CancelMessageMoveTask, and
AWS's error codes and words for every refusal (as recorded against SQS itself)."""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any

import pytest
from sqs_clients import ACCOUNT, PROTOCOLS, client, run
from sqs_fifo_support import refusal
from support import eventually

REGION = "us-east-1"


@pytest.fixture(params=PROTOCOLS)
def sqs(request: pytest.FixtureRequest, served: tuple[str, Any]) -> Any:
    return client(served[0], str(request.param))


def arn(name: str) -> str:
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"


def handle(task_id: str, source_arn: str) -> str:
    return base64.b64encode(
        json.dumps({"taskId": task_id, "sourceArn": source_arn}).encode()
    ).decode()


async def dead_letter_queue(sqs: Any, name: str = "dead", **attributes: str) -> str:
    """A queue named as another's dead-letter queue (SQS moves only out of those)."""
    url = (await run(sqs.create_queue, QueueName=name, Attributes=attributes))["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": arn(name), "maxReceiveCount": "3"})
    work = f"{name.removesuffix('.fifo')}-work{'.fifo' if name.endswith('.fifo') else ''}"
    await run(sqs.create_queue, QueueName=work, Attributes={**attributes, "RedrivePolicy": policy})
    return str(url)


async def latest(sqs: Any, source_arn: str, **kwargs: Any) -> list[dict[str, Any]]:
    listed = await run(sqs.list_message_move_tasks, SourceArn=source_arn, **kwargs)
    # No task: the Query protocol's empty list is no element at all, so no key.
    return list(listed.get("Results", []))


async def finished(sqs: Any, source_arn: str) -> None:
    async def done() -> bool:
        return (await latest(sqs, source_arn))[0]["Status"] != "RUNNING"

    await eventually(done)


NOT_DLQ = ("InvalidParameterValue", "Source queue must be configured as a Dead Letter Queue.", 400)
NO_SOURCE = ("ResourceNotFoundException",
             "The resource that you specified for the SourceArn parameter doesn't exist.", 404)
NO_DESTINATION = (
    "ResourceNotFoundException",
    "The resource that you specified for the DestinationArn parameter doesn't exist.", 404,
)
RUNNING = (
    "InvalidParameterValue",
    "There is already a task running. Only one active task is allowed for a source queue "
    "arn at a given time.", 400,
)
NO_TASK = ("ResourceNotFoundException", "Task does not exist.", 404)
BAD_HANDLE = ("InvalidParameterValue", "Value for parameter TaskHandle is invalid.", 400)


def bad_arn(parameter: str) -> tuple[str, str, int]:
    return ("InvalidParameterValue",
            f"You must use this format to specify the {parameter}: "
            f"arn:<partition>:<service>:<region>:<account-id>:<resource-id>", 400)


async def test_a_running_task_then_cancelled(sqs: Any) -> None:
    dlq = await dead_letter_queue(sqs)
    await run(sqs.create_queue, QueueName="elsewhere")
    for i in range(5):
        await run(sqs.send_message, QueueUrl=dlq, MessageBody=f"m{i}")
    before = int(time.time() * 1000)
    # One message a second: five messages keep it running for seconds.
    started = await run(sqs.start_message_move_task, SourceArn=arn("dead"),
                        DestinationArn=arn("elsewhere"), MaxNumberOfMessagesPerSecond=1)
    raw = base64.b64decode(started["TaskHandle"]).decode()
    decoded = json.loads(raw)  # SQS's handle form, compact as SQS writes it
    assert raw == json.dumps(decoded, separators=(",", ":"))
    assert list(decoded) == ["taskId", "sourceArn"]
    assert decoded["sourceArn"] == arn("dead")
    assert uuid.UUID(decoded["taskId"])
    (task,) = await latest(sqs, arn("dead"))
    assert task["Status"] == "RUNNING"
    assert task["TaskHandle"] == started["TaskHandle"]
    assert task["SourceArn"] == arn("dead")
    assert task["DestinationArn"] == arn("elsewhere")
    assert task["MaxNumberOfMessagesPerSecond"] == 1
    assert task["ApproximateNumberOfMessagesToMove"] == 5
    assert 0 <= task["ApproximateNumberOfMessagesMoved"] < 5
    assert before - 5000 <= task["StartedTimestamp"] <= int(time.time() * 1000) + 5000
    assert "FailureReason" not in task

    # One task at a time per source, whatever its destination.
    assert await refusal(sqs.start_message_move_task, SourceArn=arn("dead")) == RUNNING

    cancelled = await run(sqs.cancel_message_move_task, TaskHandle=started["TaskHandle"])
    moved = cancelled["ApproximateNumberOfMessagesMoved"]
    assert 0 <= moved < 5
    (task,) = await latest(sqs, arn("dead"))
    # The engine's cancel stops the task at once: never CANCELLING.
    assert task["Status"] == "CANCELLED"
    assert "TaskHandle" not in task
    assert task["ApproximateNumberOfMessagesMoved"] == moved
    assert task["ApproximateNumberOfMessagesToMove"] == 5
    assert task["DestinationArn"] == arn("elsewhere")
    # What moved stays moved; the rest stays in the dead-letter queue.
    left = await run(sqs.get_queue_attributes, QueueUrl=dlq,
                     AttributeNames=["ApproximateNumberOfMessages"])
    assert left["Attributes"]["ApproximateNumberOfMessages"] == str(5 - moved)
    # Only a running task can be cancelled.
    assert await refusal(sqs.cancel_message_move_task,
                         TaskHandle=started["TaskHandle"]) == NO_TASK
    # Once it stopped, another may start.
    assert (await run(sqs.start_message_move_task, SourceArn=arn("dead")))["TaskHandle"]


async def test_finished_tasks_listed_most_recent_first(sqs: Any) -> None:
    dlq = await dead_letter_queue(sqs)
    await run(sqs.create_queue, QueueName="elsewhere")
    await run(sqs.send_message, QueueUrl=dlq, MessageBody="m")
    assert await latest(sqs, arn("dead")) == []
    await run(sqs.start_message_move_task, SourceArn=arn("dead"), DestinationArn=arn("elsewhere"))
    await finished(sqs, arn("dead"))
    (first,) = await latest(sqs, arn("dead"))
    assert first == {
        "Status": "COMPLETED", "SourceArn": arn("dead"), "DestinationArn": arn("elsewhere"),
        "ApproximateNumberOfMessagesMoved": 1, "ApproximateNumberOfMessagesToMove": 1,
        "StartedTimestamp": first["StartedTimestamp"],
    }
    for _ in range(10):
        await run(sqs.start_message_move_task, SourceArn=arn("dead"))
        await finished(sqs, arn("dead"))

    (newest,) = await latest(sqs, arn("dead"))  # MaxResults is 1 by default
    # A completed task started without them shows no destination and no rate.
    assert newest == {
        "Status": "COMPLETED", "SourceArn": arn("dead"),
        "ApproximateNumberOfMessagesMoved": 0, "ApproximateNumberOfMessagesToMove": 0,
        "StartedTimestamp": newest["StartedTimestamp"],
    }
    tasks = await latest(sqs, arn("dead"), MaxResults=10)
    assert len(tasks) == 10  # of the 11: the most recent 10
    assert [t["StartedTimestamp"] for t in tasks] == sorted(
        (t["StartedTimestamp"] for t in tasks), reverse=True)
    assert all("DestinationArn" not in t for t in tasks)  # the first one is left off
    assert tasks[0] == newest


async def test_start_refusals(sqs: Any) -> None:
    await dead_letter_queue(sqs)
    await dead_letter_queue(sqs, "dead.fifo", FifoQueue="true")
    await run(sqs.create_queue, QueueName="plain")
    start = sqs.start_message_move_task
    assert await refusal(start, SourceArn=arn("plain")) == NOT_DLQ
    # The work queue is a source of a dead-letter queue, not one itself.
    assert await refusal(start, SourceArn=arn("dead-work")) == NOT_DLQ
    assert await refusal(start, SourceArn=arn("nope")) == NO_SOURCE
    assert await refusal(start, SourceArn=f"arn:aws:sqs:{REGION}:123456789012:dead") == NO_SOURCE
    assert await refusal(start, SourceArn=f"arn:aws:sns:{REGION}:{ACCOUNT}:dead") == NO_SOURCE
    # Another region's queue of the same name is not this one.
    assert await refusal(start, SourceArn=f"arn:aws:sqs:eu-west-1:{ACCOUNT}:dead") == NO_SOURCE
    assert await refusal(start, SourceArn=arn("dead"),
                         DestinationArn=f"arn:aws:sqs:eu-west-1:{ACCOUNT}:plain") == (
        NO_DESTINATION)
    for malformed in ["", "dead", "arn:aws:sqs:dead", f"arn:aws:sqs:{REGION}:{ACCOUNT}:"]:
        assert await refusal(start, SourceArn=malformed) == bad_arn("SourceArn"), malformed
    assert await refusal(start, SourceArn=arn("dead"), DestinationArn=arn("nope")) == (
        NO_DESTINATION)
    assert await refusal(start, SourceArn=arn("dead"), DestinationArn="") == (
        bad_arn("DestinationArn"))
    assert await refusal(start, SourceArn=arn("dead"), DestinationArn=arn("dead")) == (
        "InvalidParameterValue", "Source queue arn and destination queue arn cannot be the same.",
        400)
    same_type = ("InvalidParameterValue",
                 "The source queue and destination queue must be of the same queue type.", 400)
    assert await refusal(start, SourceArn=arn("dead"), DestinationArn=arn("dead.fifo")) == (
        same_type)
    assert await refusal(start, SourceArn=arn("dead.fifo"), DestinationArn=arn("plain")) == (
        same_type)
    for rate in (0, 501, -1):
        assert await refusal(start, SourceArn=arn("dead"), MaxNumberOfMessagesPerSecond=rate) == (
            "InvalidParameterValue",
            f"Value {rate} for parameter MaxNumberOfMessagesPerSecond is invalid. Reason: Must "
            f"be between 1 and 500, if provided.", 400)
    # None of these started a task.
    assert await latest(sqs, arn("dead")) == []
    assert await latest(sqs, arn("plain")) == []


async def test_list_refusals(sqs: Any) -> None:
    await dead_letter_queue(sqs)
    listing = sqs.list_message_move_tasks
    assert await refusal(listing, SourceArn=arn("nope")) == NO_SOURCE
    assert await refusal(listing, SourceArn="dead") == bad_arn("SourceArn")
    assert await refusal(listing, SourceArn=f"arn:aws:sqs:eu-west-1:{ACCOUNT}:dead") == NO_SOURCE
    for limit in (0, 11):
        assert await refusal(listing, SourceArn=arn("dead"), MaxResults=limit) == (
            "InvalidParameterValue",
            f"Value {limit} for parameter MaxResults is invalid. Reason: Must be between 1 and "
            f"10, if provided.", 400)
    assert await latest(sqs, arn("dead"), MaxResults=10) == []


async def test_cancel_refusals(sqs: Any) -> None:
    await dead_letter_queue(sqs)
    await dead_letter_queue(sqs, "other")
    cancel = sqs.cancel_message_move_task
    started = (await run(sqs.start_message_move_task, SourceArn=arn("dead")))["TaskHandle"]
    task_id = json.loads(base64.b64decode(started))["taskId"]
    for malformed in [
        "foobared",  # not base64
        base64.b64encode(b"not json").decode(),
        base64.b64encode(b"[1, 2]").decode(),
        base64.b64encode(json.dumps({"taskId": task_id}).encode()).decode(),
        base64.b64encode(json.dumps({"taskId": 7, "sourceArn": arn("dead")}).encode()).decode(),
        handle(task_id, "dead"),  # the source is no ARN
    ]:
        assert await refusal(cancel, TaskHandle=malformed) == BAD_HANDLE, malformed
    assert await refusal(cancel, TaskHandle=handle(task_id, arn("nope"))) == NO_SOURCE
    # Another account's queue, or another region's, is none of ours.
    for foreign in (f"arn:aws:sqs:{REGION}:878966065785:dead",
                    f"arn:aws:sqs:eu-west-1:{ACCOUNT}:dead"):
        assert await refusal(cancel, TaskHandle=handle(task_id, foreign)) == NO_SOURCE
    assert await refusal(cancel, TaskHandle=handle(str(uuid.uuid4()), arn("dead"))) == NO_TASK
    assert await refusal(cancel, TaskHandle=handle("not-a-uuid", arn("dead"))) == NO_TASK
    # A queue that is no dead-letter queue has no task either.
    await run(sqs.create_queue, QueueName="plain")
    assert await refusal(cancel, TaskHandle=handle(str(uuid.uuid4()), arn("plain"))) == NO_TASK
    # A task is cancelled through a handle of its own source queue only.
    assert await refusal(cancel, TaskHandle=handle(task_id, arn("other"))) == NO_TASK
    await finished(sqs, arn("dead"))
    assert await refusal(cancel, TaskHandle=started) == NO_TASK
    assert (await latest(sqs, arn("dead")))[0]["Status"] == "COMPLETED"


async def test_a_deleted_destination_fails_the_task(sqs: Any) -> None:
    dlq = await dead_letter_queue(sqs)
    destination = (await run(sqs.create_queue, QueueName="elsewhere"))["QueueUrl"]
    for i in range(5):
        await run(sqs.send_message, QueueUrl=dlq, MessageBody=f"m{i}")
    await run(sqs.start_message_move_task, SourceArn=arn("dead"),
              DestinationArn=arn("elsewhere"), MaxNumberOfMessagesPerSecond=1)
    await run(sqs.delete_queue, QueueUrl=destination)
    await finished(sqs, arn("dead"))
    (task,) = await latest(sqs, arn("dead"))
    assert task["Status"] == "FAILED"
    assert task["FailureReason"] == "AWS.SimpleQueueService.NonExistentQueue"
    assert task["DestinationArn"] == arn("elsewhere")  # listed as it was started
    assert task["ApproximateNumberOfMessagesToMove"] == 5
    assert "TaskHandle" not in task
    moved = task["ApproximateNumberOfMessagesMoved"]
    assert moved < 5
    # What was not moved stays in the dead-letter queue, and another task may start.
    left = await run(sqs.get_queue_attributes, QueueUrl=dlq,
                     AttributeNames=["ApproximateNumberOfMessages"])
    assert left["Attributes"]["ApproximateNumberOfMessages"] == str(5 - moved)
    assert (await run(sqs.start_message_move_task, SourceArn=arn("dead")))["TaskHandle"]
