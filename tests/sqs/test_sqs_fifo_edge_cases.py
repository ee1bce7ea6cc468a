"""FIFO edge cases through the SQS door, as AWS answers them (issue 30), with boto3 on
both protocols: a receipt handle whose lease lapsed has expired, a message made visible
again goes out while a later one of its group is still in flight, groups come back in
the order SQS gives them, a purge forgets deduplication ids, and a queue switched to
high throughput deduplicates per group from then on.

Time passes the way the database sees it: "31 seconds later" moves the queue's stored
deadlines and group hints back, so no test sleeps for a lease to lapse."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from sqs_clients import PROTOCOLS, client, run
from sqs_fifo_support import bodies, delete, fifo_queue, receive, refused, send


@pytest.fixture(params=PROTOCOLS)
def sqs(request: pytest.FixtureRequest, served: tuple[str, Any]) -> Any:
    return client(served[0], request.param)


async def later(db: asyncpg.Connection, queue: str, seconds: int) -> None:
    """`seconds` pass for `queue`: every deadline it holds moves back, and each
    turn of its groups to come as much, or just after now, in their order: a
    turn due already stays (none goes below a floor its claims hold)."""
    queue_id = await db.fetchval("SELECT id FROM leaseq.queues WHERE name = $1", queue)
    await db.execute("UPDATE leaseq.messages SET visible_at = visible_at "
                     "- make_interval(secs => $2) WHERE queue_id = $1", queue_id, seconds)
    await db.execute(
        "UPDATE leaseq.turns SET at = CASE "
        "WHEN at - make_interval(secs => $2) >= now() THEN at - make_interval(secs => $2) "
        "ELSE now() + (at - now()) / 1000000 END "
        "WHERE queue_id = $1 AND at > now()", queue_id, seconds)


def expired(handle: str) -> tuple[str, str]:
    return ("InvalidParameterValue",
            f"Value {handle} for parameter ReceiptHandle is invalid. Reason: The receipt "
            f"handle has expired.")


async def test_a_lapsed_fifo_handle_has_expired(sqs: Any, db: asyncpg.Connection) -> None:
    url = await fifo_queue(sqs, ContentBasedDeduplication="true")
    await run(sqs.send_message, QueueUrl=url, MessageBody="g1-m1", MessageGroupId="1")
    (first,) = await receive(sqs, url)
    handle = first["ReceiptHandle"]
    await later(db, "orders.fifo", 31)
    assert await refused(sqs.delete_message, QueueUrl=url, ReceiptHandle=handle) == (
        expired(handle))
    assert await refused(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=handle,
                         VisibilityTimeout=60) == expired(handle)
    batch = await run(sqs.delete_message_batch, QueueUrl=url,
                      Entries=[{"Id": "old", "ReceiptHandle": handle}])
    assert batch.get("Successful", []) == []
    code, message = expired(handle)
    assert batch["Failed"] == [
        {"Id": "old", "SenderFault": True, "Code": code, "Message": message}]
    batch = await run(sqs.change_message_visibility_batch, QueueUrl=url, Entries=[
        {"Id": "old", "ReceiptHandle": handle, "VisibilityTimeout": 60}])
    assert batch["Failed"] == [
        {"Id": "old", "SenderFault": True, "Code": code, "Message": message}]
    # The message was neither deleted nor hidden: the next receive has it.
    (again,) = await receive(sqs, url, AttributeNames=["ApproximateReceiveCount"])
    assert again["MessageId"] == first["MessageId"]
    assert again["Attributes"] == {"ApproximateReceiveCount": "2"}
    # A handle from the earlier receive stays expired; the new one works.
    assert await refused(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=handle,
                         VisibilityTimeout=0) == expired(handle)
    await delete(sqs, url, again)
    assert await receive(sqs, url) == []


async def test_a_handle_released_or_received_with_no_visibility_has_expired(sqs: Any) -> None:
    url = await fifo_queue(sqs)
    await send(sqs, url, "a", "A")
    await send(sqs, url, "b", "B")
    (a,) = await receive(sqs, url, MaxNumberOfMessages=1, VisibilityTimeout=0)
    assert await refused(sqs.delete_message, QueueUrl=url, ReceiptHandle=a["ReceiptHandle"]) == (
        expired(a["ReceiptHandle"]))
    got = await receive(sqs, url)
    b = next(m for m in got if m["Body"] == "b")
    await run(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=b["ReceiptHandle"],
              VisibilityTimeout=0)
    # In a batch, a live handle still succeeds beside an expired one.
    live = next(m for m in got if m["Body"] == "a")
    batch = await run(sqs.delete_message_batch, QueueUrl=url, Entries=[
        {"Id": "live", "ReceiptHandle": live["ReceiptHandle"]},
        {"Id": "released", "ReceiptHandle": b["ReceiptHandle"]},
    ])
    assert batch["Successful"] == [{"Id": "live"}]
    assert [(f["Id"], f["Code"], f["Message"]) for f in batch["Failed"]] == [
        ("released", *expired(b["ReceiptHandle"]))]
    assert bodies(await receive(sqs, url)) == ["b"]


async def test_a_standard_queue_keeps_accepting_a_lapsed_handle(
    sqs: Any, db: asyncpg.Connection,
) -> None:
    url = (await run(sqs.create_queue, QueueName="plain"))["QueueUrl"]
    for body in ("one", "two"):
        await run(sqs.send_message, QueueUrl=url, MessageBody=body)
    got = (await run(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=2))["Messages"]
    await later(db, "plain", 31)
    await run(sqs.change_message_visibility, QueueUrl=url,
              ReceiptHandle=got[0]["ReceiptHandle"], VisibilityTimeout=60)
    await run(sqs.delete_message, QueueUrl=url, ReceiptHandle=got[1]["ReceiptHandle"])
    counts = await run(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
    assert counts["Attributes"] == {
        "ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "1"}


async def test_a_group_in_flight_is_held_whole_until_its_leases_lapse(
    sqs: Any, db: asyncpg.Connection,
) -> None:
    url = await fifo_queue(sqs, ContentBasedDeduplication="true")
    for body, group in [("g1-m1", "1"), ("g1-m2", "1"), ("g1-m3", "1"), ("g1-m4", "1"),
                        ("g2-m1", "2"), ("g3-m1", "3")]:
        await run(sqs.send_message, QueueUrl=url, MessageBody=body, MessageGroupId=group)
    assert bodies(await receive(sqs, url, MaxNumberOfMessages=2)) == ["g1-m1", "g1-m2"]
    assert bodies(await receive(sqs, url, MaxNumberOfMessages=1)) == ["g2-m1"]
    await later(db, "orders.fifo", 31)
    # A group comes back at the end of the line, when its leases lapse.
    assert bodies(await receive(sqs, url, VisibilityTimeout=0)) == [
        "g3-m1", "g1-m1", "g1-m2", "g1-m3", "g1-m4", "g2-m1"]


async def test_a_head_kept_in_flight_holds_its_group_until_it_lapses(
    sqs: Any, db: asyncpg.Connection,
) -> None:
    url = await fifo_queue(sqs)
    for n in range(3):
        await send(sqs, url, f"m{n}", "G")
    head, *_ = await receive(sqs, url)
    await run(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=head["ReceiptHandle"],
              VisibilityTimeout=60)
    await later(db, "orders.fifo", 31)
    # The others' leases lapsed, but they stay behind their head.
    assert await receive(sqs, url) == []
    await later(db, "orders.fifo", 30)
    again = await receive(sqs, url, AttributeNames=["ApproximateReceiveCount"])
    assert bodies(again) == ["m0", "m1", "m2"]
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in again} == {"2"}


async def test_a_group_received_with_no_visibility_goes_to_the_end(sqs: Any) -> None:
    url = await fifo_queue(sqs, ContentBasedDeduplication="true")
    for body, group in [("g1-m1", "1"), ("g2-m1", "2"), ("g2-m2", "2"), ("g3-m1", "3"),
                        ("g1-m2", "1")]:
        await run(sqs.send_message, QueueUrl=url, MessageBody=body, MessageGroupId=group)
    assert bodies(await receive(sqs, url, MaxNumberOfMessages=3, VisibilityTimeout=0)) == [
        "g1-m1", "g1-m2", "g2-m1"]
    assert bodies(await receive(sqs, url, VisibilityTimeout=0)) == [
        "g3-m1", "g1-m1", "g1-m2", "g2-m1", "g2-m2"]


async def test_a_message_made_visible_goes_out_while_a_later_one_is_in_flight(
    sqs: Any, db: asyncpg.Connection,
) -> None:
    url = await fifo_queue(sqs, ContentBasedDeduplication="true")
    for body, group in [("g1-m1", "1"), ("g1-m2", "1"), ("g1-m3", "1"), ("g2-m1", "2")]:
        await run(sqs.send_message, QueueUrl=url, MessageBody=body, MessageGroupId=group)
    m1, m2 = await receive(sqs, url, MaxNumberOfMessages=2)
    assert bodies([m1, m2]) == ["g1-m1", "g1-m2"]
    await run(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=m1["ReceiptHandle"],
              VisibilityTimeout=0)
    # Group 2 waited longer; of group 1 only what is visible from its head goes out.
    m1_again, = [m for m in await receive(sqs, url) if m["Body"] == "g1-m1"]
    assert bodies(await receive(sqs, url)) == []
    # The in-flight message keeps the rest behind until it is visible too.
    await run(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=m2["ReceiptHandle"],
              VisibilityTimeout=0)
    assert await receive(sqs, url) == []
    await run(sqs.change_message_visibility, QueueUrl=url,
              ReceiptHandle=m1_again["ReceiptHandle"], VisibilityTimeout=0)
    assert bodies(await receive(sqs, url)) == ["g1-m1", "g1-m2", "g1-m3"]


async def test_released_and_lapsed_messages_come_back_after_a_waiting_group(
    sqs: Any, db: asyncpg.Connection,
) -> None:
    url = await fifo_queue(sqs, ContentBasedDeduplication="true")
    for body, group in [("g1-m1", "1"), ("g1-m2", "1"), ("g2-m1", "2")]:
        await run(sqs.send_message, QueueUrl=url, MessageBody=body, MessageGroupId=group)
    m1, _ = await receive(sqs, url, MaxNumberOfMessages=2)
    await run(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=m1["ReceiptHandle"],
              VisibilityTimeout=0)
    assert bodies(await receive(sqs, url, MaxNumberOfMessages=3)) == ["g2-m1", "g1-m1"]

    other = await fifo_queue(sqs, "other.fifo", ContentBasedDeduplication="true")
    for body, group in [("g1-m1", "1"), ("g1-m2", "1"), ("g2-m1", "2")]:
        await run(sqs.send_message, QueueUrl=other, MessageBody=body, MessageGroupId=group)
    m1, _ = await receive(sqs, other, MaxNumberOfMessages=2)
    await run(sqs.change_message_visibility, QueueUrl=other,
              ReceiptHandle=m1["ReceiptHandle"], VisibilityTimeout=1)
    # A receive meanwhile looks at group 1 too: it must expect it back when its head's
    # lease ends, not the later message's.
    assert bodies(await receive(sqs, other, VisibilityTimeout=0)) == ["g2-m1"]
    await later(db, "other.fifo", 2)
    assert bodies(await receive(sqs, other, MaxNumberOfMessages=3)) == ["g2-m1", "g1-m1"]


async def test_messages_come_back_in_order_after_their_leases_lapse(
    sqs: Any, db: asyncpg.Connection,
) -> None:
    url = await fifo_queue(sqs, VisibilityTimeout="1")
    for n in range(3):
        await send(sqs, url, f"message-{n}", "1")
    assert bodies(await receive(sqs, url)) == ["message-0", "message-1", "message-2"]
    await later(db, "orders.fifo", 2)
    again = await receive(sqs, url, AttributeNames=["ApproximateReceiveCount"])
    assert bodies(again) == ["message-0", "message-1", "message-2"]
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in again} == {"2"}


async def test_deleting_a_group_in_flight_frees_it_and_a_partial_delete_does_not(
    sqs: Any,
) -> None:
    sends = [("g1-m1", "1"), ("g2-m1", "2"), ("g1-m2", "1"), ("g2-m2", "2"),
             ("g1-m2", "1"),  # the same body again: a duplicate, not stored
             ("g1-m3", "1"), ("g1-m4", "1"), ("g3-m1", "3")]
    for name, whole in [("whole.fifo", True), ("partial.fifo", False)]:
        url = await fifo_queue(sqs, name, ContentBasedDeduplication="true")
        for body, group in sends:
            await run(sqs.send_message, QueueUrl=url, MessageBody=body, MessageGroupId=group)
        taken = await receive(sqs, url, MaxNumberOfMessages=2)
        assert bodies(taken) == ["g1-m1", "g1-m2"]
        await delete(sqs, url, *(taken if whole else taken[:1]))
        # SQS records g1's rest before g3 after a whole delete, or after it; both are in
        # order within each group. leaseq puts the freed group last.
        assert bodies(await receive(sqs, url)) == (
            ["g2-m1", "g2-m2", "g3-m1", "g1-m3", "g1-m4"] if whole
            else ["g2-m1", "g2-m2", "g3-m1"])


async def test_a_purge_forgets_the_deduplication_ids(sqs: Any) -> None:
    url = await fifo_queue(sqs)
    await send(sqs, url, "message-1", "G", dedup="d")
    await run(sqs.purge_queue, QueueUrl=url)
    await send(sqs, url, "message-2", "G", dedup="d")
    assert bodies(await receive(sqs, url)) == ["message-2"]
    content = await fifo_queue(sqs, "content.fifo", ContentBasedDeduplication="true")
    first = await run(sqs.send_message, QueueUrl=content, MessageBody="same", MessageGroupId="G")
    await run(sqs.purge_queue, QueueUrl=content)
    second = await run(sqs.send_message, QueueUrl=content, MessageBody="same", MessageGroupId="G")
    assert second["MessageId"] != first["MessageId"]
    assert [m["MessageId"] for m in await receive(sqs, content)] == [second["MessageId"]]


async def test_a_queue_deduplicates_by_the_scope_it_was_created_with(sqs: Any) -> None:
    # As recorded against SQS: the scope may be switched (high throughput) and
    # reads back switched, but the queue goes on deduplicating as it was created.
    url = await fifo_queue(sqs)
    names = ["DeduplicationScope", "FifoThroughputLimit"]
    attributes = await run(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=names)
    assert attributes["Attributes"] == {
        "DeduplicationScope": "queue", "FifoThroughputLimit": "perQueue"}
    one = await send(sqs, url, "a", "A", dedup="d-1")
    assert (await send(sqs, url, "b", "B", dedup="d-1"))["MessageId"] == one["MessageId"]
    await run(sqs.set_queue_attributes, QueueUrl=url, Attributes={
        "DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"})
    attributes = await run(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["All"])
    assert {k: attributes["Attributes"][k] for k in names} == {
        "DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"}
    two = await send(sqs, url, "c", "A", dedup="d-2")
    assert (await send(sqs, url, "d", "B", dedup="d-2"))["MessageId"] == two["MessageId"]
    assert (await send(sqs, url, "e", "C", dedup="d-1"))["MessageId"] == one["MessageId"]
    assert bodies(await receive(sqs, url)) == ["a", "c"]

    # And the other way: created per group, switched to the queue, still per group.
    grouped = await fifo_queue(sqs, "grouped.fifo", DeduplicationScope="messageGroup",
                               FifoThroughputLimit="perMessageGroupId")
    await run(sqs.set_queue_attributes, QueueUrl=grouped, Attributes={
        "DeduplicationScope": "queue", "FifoThroughputLimit": "perQueue"})
    first = await send(sqs, grouped, "x", "A", dedup="same")
    second = await send(sqs, grouped, "y", "B", dedup="same")
    assert first["MessageId"] != second["MessageId"]
    assert sorted(bodies(await receive(sqs, grouped))) == ["x", "y"]
