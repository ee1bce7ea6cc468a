"""Authorization by every queue a request reaches, on both doors: a key scoped to
its own queues cannot point one of them at another queue as its dead-letter
queue, nor redrive into a queue it may not send to. Refused requests change
nothing (the queues' rows are compared before and after)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from conftest import AppClient, ServeApp
from sqs_clients import client, refusal, run

ADMIN_ID = "LQBOOTSTRAPADMIN0001"
ADMIN = f"{ADMIN_ID}.admin-secret-0123456789abcdefghij"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def snapshot(db: asyncpg.Connection) -> list[Any]:
    """Every queue's row and how many messages each holds."""
    rows = await db.fetch(
        "SELECT q.*, (SELECT count(*) FROM leaseq.messages m WHERE m.queue_id = q.id) AS held "
        "FROM leaseq.queues q ORDER BY q.name")
    tasks = await db.fetchval("SELECT count(*) FROM leaseq.redrive_tasks")
    return [tuple(r.values()) for r in rows] + [tasks]


async def _token(app: Any, *scopes: str) -> str:
    info, secret = await app.state.keys.create("test", list(scopes))
    return f"{info.id}.{secret}"


@pytest.mark.parametrize("fifo", [False, True])
async def test_rest_a_scoped_admin_reaches_only_queues_it_may_send_to(
    app_factory: AppClient, db: asyncpg.Connection, fifo: bool
) -> None:
    client_ = await app_factory(admin_key=ADMIN)
    app = client_.app  # type: ignore[attr-defined]
    sfx = ".fifo" if fifo else ""
    extra = {"fifo": True} if fifo else {}
    for name in ("team-a-src", "team-a-dlq", "billing"):
        made = await client_.post("/v1/queues", json={"name": name + sfx, **extra},
                                  headers=bearer(ADMIN))
        assert made.status_code == 201, made.text
    team = bearer(await _token(app, "admin:team-a-*"))
    before = await snapshot(db)
    policy = {"dead_letter_queue": "billing" + sfx, "max_receive_count": 3}
    refused = [
        await client_.patch(f"/v1/queues/team-a-src{sfx}", json=policy, headers=team),
        await client_.post("/v1/queues", json={"name": f"team-a-new{sfx}", **extra, **policy},
                           headers=team),
        await client_.post(f"/v1/queues/team-a-dlq{sfx}/redrive",
                           json={"destination": "billing" + sfx}, headers=team),
    ]
    for answer in refused:
        assert answer.status_code == 403, answer.text
        assert answer.json()["code"] == "forbidden" and "billing" in answer.json()["detail"]
    assert await snapshot(db) == before
    # Its own queues, and a queue it may send to, it reaches.
    own = {"dead_letter_queue": "team-a-dlq" + sfx, "max_receive_count": 3}
    assert (await client_.patch(f"/v1/queues/team-a-src{sfx}", json=own,
                                headers=team)).status_code == 200
    both = bearer(await _token(app, "admin:team-a-*", "send:billing*"))
    assert (await client_.patch(f"/v1/queues/team-a-src{sfx}", json=policy,
                                headers=both)).status_code == 200
    # The queue it did not get to point at stays deletable by its owner.
    assert (await client_.delete(f"/v1/queues/team-a-new{sfx}",
                                 headers=bearer(ADMIN))).status_code == 404


async def test_rest_a_redrive_back_to_its_sources_needs_send_on_each(
    app_factory: AppClient, db: asyncpg.Connection
) -> None:
    """Without a destination, a redrive writes into the queues its messages came
    from: billing's owner made team-a-dlq its dead-letter queue, and team A may not
    therefore write into billing."""
    client_ = await app_factory(admin_key=ADMIN)
    app = client_.app  # type: ignore[attr-defined]
    admin = bearer(ADMIN)
    await client_.post("/v1/queues", json={"name": "team-a-dlq"}, headers=admin)
    await client_.post("/v1/queues", json={"name": "billing", "dead_letter_queue": "team-a-dlq",
                                            "max_receive_count": 1}, headers=admin)
    await client_.post("/v1/queues/billing/messages", json={"body": "x"}, headers=admin)
    for _ in range(2):  # received once, then dead-lettered by the next claim
        await client_.get("/v1/queues/billing/receive",
                          params={"wait": 0, "visibility_timeout": 0}, headers=admin)
    assert await db.fetchval(
        "SELECT count(*) FROM leaseq.messages m JOIN leaseq.queues q ON q.id = m.queue_id "
        "WHERE q.name = 'team-a-dlq'") == 1
    team = bearer(await _token(app, "admin:team-a-*"))
    before = await snapshot(db)
    refused = await client_.post("/v1/queues/team-a-dlq/redrive", json={}, headers=team)
    # Refused without naming billing, which team A may not read.
    assert refused.status_code == 403 and "billing" not in refused.json()["detail"]
    assert await snapshot(db) == before
    allowed = bearer(await _token(app, "admin:team-a-*", "send:billing"))
    assert (await client_.post("/v1/queues/team-a-dlq/redrive", json={},
                               headers=allowed)).status_code == 202


@pytest.mark.parametrize("protocol", ["json", "query"])
async def test_sqs_a_scoped_admin_reaches_only_queues_it_may_send_to(
    serve_factory: ServeApp, db: asyncpg.Connection, protocol: str
) -> None:
    endpoint, app = await serve_factory(admin_key=ADMIN)
    admin = client(endpoint, protocol, key=ADMIN_ID, secret=ADMIN.split(".")[1])
    for fifo in (False, True):
        sfx, attrs = (".fifo", {"FifoQueue": "true"}) if fifo else ("", {})
        urls = {name: (await run(admin.create_queue, QueueName=name + sfx,
                                 Attributes=attrs))["QueueUrl"]
                for name in ("team-a-src", "team-a-dlq", "billing")}
        info, secret = await app.state.keys.create("team", ["admin:team-a-*"])
        team = client(endpoint, protocol, key=info.id, secret=secret)
        billing_arn = f"arn:aws:sqs:us-east-1:000000000000:billing{sfx}"
        dlq_arn = f"arn:aws:sqs:us-east-1:000000000000:team-a-dlq{sfx}"
        policy = json.dumps({"deadLetterTargetArn": billing_arn, "maxReceiveCount": "3"})
        # Its own dead-letter queue it may name (a move task needs one configured).
        own = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "3"})
        await run(team.set_queue_attributes, QueueUrl=urls["team-a-src"],
                  Attributes={"RedrivePolicy": own})
        before = await snapshot(db)
        for call, kwargs in [
            (team.set_queue_attributes, {"QueueUrl": urls["team-a-src"],
                                         "Attributes": {"RedrivePolicy": policy}}),
            (team.create_queue, {"QueueName": f"team-a-new{sfx}",
                                 "Attributes": {**attrs, "RedrivePolicy": policy}}),
            (team.start_message_move_task, {"SourceArn": dlq_arn,
                                            "DestinationArn": billing_arn}),
        ]:
            code, message = await refusal(call, **kwargs)
            assert code == "AccessDenied" and "billing" in message, (call, code, message)
        assert await snapshot(db) == before
