"""No names for a key that may not read them, on both doors and the dashboard:
paging cursors, the queue_in_use refusal, dead-letter sources, the overview;
and a refusal for a queue beyond a key's scopes says the same whether or not
that queue exists. Each test's control: an admin:* key still sees everything.

The world: team A's queues (team-a-*), others' queues sorting before and after
them, and billing's owner made team-a-dlq billing-src's dead-letter queue."""

from __future__ import annotations

import base64
import re
from typing import Any

import httpx
import pytest
from conftest import AppClient, ServeApp
from sqs_clients import client, refusal, run

ADMIN_ID = "LQBOOTSTRAPADMIN0001"
ADMIN = f"{ADMIN_ID}.admin-secret-0123456789abcdefghij"
TEAM = {"team-a-1", "team-a-dlq", "team-a-src", "team-a-x"}
OTHERS = {"a-other", "billing-dlq", "billing-src", "zz-other"}
ARN = "arn:aws:sqs:us-east-1:000000000000:"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _world(app_client: httpx.AsyncClient) -> None:
    admin = bearer(ADMIN)
    for name in ("a-other", "billing-dlq", "team-a-1", "team-a-dlq", "zz-other"):
        made = await app_client.post("/v1/queues", json={"name": name}, headers=admin)
        assert made.status_code == 201, made.text
    for name, dlq in (("team-a-src", "team-a-dlq"), ("billing-src", "team-a-dlq"),
                      ("team-a-x", "billing-dlq")):
        made = await app_client.post(
            "/v1/queues", json={"name": name, "dead_letter_queue": dlq, "max_receive_count": 1},
            headers=admin)
        assert made.status_code == 201, made.text


async def _team_key(app: Any) -> tuple[str, str]:
    info, secret = await app.state.keys.create("team", ["admin:team-a-*"])
    return info.id, secret


async def _rest_world(app_factory: AppClient) -> tuple[httpx.AsyncClient, dict[str, str]]:
    app_client = await app_factory(admin_key=ADMIN)
    await _world(app_client)
    key_id, secret = await _team_key(app_client.app)  # type: ignore[attr-defined]
    return app_client, bearer(f"{key_id}.{secret}")


async def _sqs_world(serve_factory: ServeApp, protocol: str) -> tuple[Any, Any]:
    endpoint, app = await serve_factory(admin_key=ADMIN)
    async with httpx.AsyncClient(base_url=endpoint) as rest:
        await _world(rest)
    key_id, secret = await _team_key(app)
    team = client(endpoint, protocol, key=key_id, secret=secret)
    admin = client(endpoint, protocol, key=ADMIN_ID, secret=ADMIN.split(".")[1])
    return team, admin


def _named(text: str, names: set[str]) -> set[str]:
    return {name for name in names if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)}


# -- paging cursors ---------------------------------------------------------------


async def _rest_pages(app_client: httpx.AsyncClient, headers: dict[str, str]) -> tuple[
        list[str], list[str]]:
    shown: list[str] = []
    cursors: list[str] = []
    after = ""
    while True:
        page = await app_client.get("/v1/queues", params={"limit": 1, "after": after},
                                    headers=headers)
        assert page.status_code == 200, page.text
        shown += [q["name"] for q in page.json()["queues"]]
        after = page.json()["next_after"]
        if after is None:
            return shown, cursors
        cursors.append(after)


async def test_rest_paging_cursors_name_only_readable_queues(app_factory: AppClient) -> None:
    app_client, team = await _rest_world(app_factory)
    shown, cursors = await _rest_pages(app_client, team)
    assert shown == sorted(TEAM)
    assert set(cursors) <= TEAM
    shown, _ = await _rest_pages(app_client, bearer(ADMIN))
    assert shown == sorted(TEAM | OTHERS)


@pytest.mark.parametrize("protocol", ["json", "query"])
async def test_sqs_next_tokens_name_only_readable_queues(
    serve_factory: ServeApp, protocol: str
) -> None:
    team, admin = await _sqs_world(serve_factory, protocol)
    for who, expected in ((team, TEAM), (admin, TEAM | OTHERS)):
        shown: list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"MaxResults": 1}
            if token:
                kwargs["NextToken"] = token
            page = await run(who.list_queues, **kwargs)
            shown += [url.rsplit("/", 1)[1] for url in page.get("QueueUrls", [])]
            token = page.get("NextToken")
            if not token:
                break
            if who is team:
                assert base64.urlsafe_b64decode(token).decode() in TEAM, token
        assert shown == sorted(expected)


# -- queue_in_use ------------------------------------------------------------------


async def test_rest_queue_in_use_names_only_readable_sources(app_factory: AppClient) -> None:
    app_client, team = await _rest_world(app_factory)
    refused = await app_client.delete("/v1/queues/team-a-dlq", headers=team)
    assert refused.status_code == 409 and refused.json()["code"] == "queue_in_use"
    detail = refused.json()["detail"]
    assert _named(detail, OTHERS) == set() and "team-a-src" in detail
    assert "1 queue you may not read" in detail
    refused = await app_client.delete("/v1/queues/team-a-dlq", headers=bearer(ADMIN))
    assert _named(refused.json()["detail"], OTHERS | TEAM) == {"team-a-src", "billing-src",
                                                              "team-a-dlq"}


@pytest.mark.parametrize("protocol", ["json", "query"])
async def test_sqs_queue_in_use_names_only_readable_sources(
    serve_factory: ServeApp, protocol: str
) -> None:
    team, admin = await _sqs_world(serve_factory, protocol)
    url = (await run(team.get_queue_url, QueueName="team-a-dlq"))["QueueUrl"]
    _, message = await refusal(team.delete_queue, QueueUrl=url)
    assert _named(message, OTHERS) == set() and "team-a-src" in message
    _, message = await refusal(admin.delete_queue, QueueUrl=url)
    assert {"team-a-src", "billing-src"} <= _named(message, OTHERS | TEAM)


# -- dead-letter sources -------------------------------------------------------------


async def test_rest_dead_letter_sources_are_only_readable_ones(app_factory: AppClient) -> None:
    app_client, team = await _rest_world(app_factory)
    path = "/v1/queues/team-a-dlq/dead-letter-sources"
    assert (await app_client.get(path, headers=team)).json()["queues"] == ["team-a-src"]
    assert (await app_client.get(path, headers=bearer(ADMIN))).json()["queues"] == [
        "billing-src", "team-a-src"]


@pytest.mark.parametrize("protocol", ["json", "query"])
async def test_sqs_dead_letter_sources_are_only_readable_ones(
    serve_factory: ServeApp, protocol: str
) -> None:
    team, admin = await _sqs_world(serve_factory, protocol)
    url = (await run(team.get_queue_url, QueueName="team-a-dlq"))["QueueUrl"]
    for who, expected in ((team, ["team-a-src"]), (admin, ["billing-src", "team-a-src"])):
        found = await run(who.list_dead_letter_source_queues, QueueUrl=url)
        assert [u.rsplit("/", 1)[1] for u in found["queueUrls"]] == expected
        paged = await run(who.list_dead_letter_source_queues, QueueUrl=url, MaxResults=1)
        if who is team:
            assert "NextToken" not in paged


# -- a refusal beyond the scopes tells nothing of existence ------------------------------


@pytest.mark.parametrize("protocol", ["json", "query"])
async def test_sqs_refusal_is_the_same_for_a_queue_that_does_not_exist(
    serve_factory: ServeApp, protocol: str
) -> None:
    team, admin = await _sqs_world(serve_factory, protocol)
    answers = []
    for missing in ("billing-dlq", "billing-none"):
        source = await refusal(team.start_message_move_task, SourceArn=ARN + missing)
        destination = await refusal(team.start_message_move_task,
                                    SourceArn=ARN + "team-a-dlq", DestinationArn=ARN + missing)
        listed = await refusal(team.list_message_move_tasks, SourceArn=ARN + missing)
        url = (await run(team.get_queue_url, QueueName="team-a-1"))["QueueUrl"]
        policy = f'{{"deadLetterTargetArn": "{ARN + missing}", "maxReceiveCount": "2"}}'
        redrive_policy = await refusal(team.set_queue_attributes, QueueUrl=url,
                                       Attributes={"RedrivePolicy": policy})
        answers.append([(code, message.replace(missing, "<queue>"))
                        for code, message in (source, destination, listed, redrive_policy)])
    assert answers[0] == answers[1]
    assert {code for code, _ in answers[0]} == {"AccessDenied"}
    # The control: an admin of every queue is told which one does not exist.
    code, _ = await refusal(admin.start_message_move_task, SourceArn=ARN + "team-a-dlq",
                            DestinationArn=ARN + "billing-none")
    assert code == "ResourceNotFoundException"


async def test_rest_redrive_refusal_is_the_same_for_a_queue_that_does_not_exist(
    app_factory: AppClient,
) -> None:
    app_client, team = await _rest_world(app_factory)
    answers = []
    for missing in ("billing-dlq", "billing-none"):
        answer = []
        for method, path, body in (
            ("POST", "/v1/queues/team-a-dlq/redrive", {"destination": missing}),
            ("POST", f"/v1/queues/{missing}/redrive", {}),
            ("GET", f"/v1/queues/{missing}/dead-letter-sources", None),
            ("DELETE", f"/v1/queues/{missing}", None),
            ("PATCH", "/v1/queues/team-a-1",
             {"dead_letter_queue": missing, "max_receive_count": 2}),
        ):
            got = await app_client.request(method, path, json=body, headers=team)
            answer.append((got.status_code, got.json()["code"],
                           got.json()["detail"].replace(missing, "<queue>")))
        answers.append(answer)
    assert answers[0] == answers[1]
    assert {status for status, _, _ in answers[0]} == {403}
    refused = await app_client.post("/v1/queues/team-a-dlq/redrive",
                                    json={"destination": "billing-none"}, headers=bearer(ADMIN))
    assert refused.status_code == 404


async def test_rest_redrive_back_to_sources_names_no_unreadable_source(
    app_factory: AppClient,
) -> None:
    app_client, team = await _rest_world(app_factory)
    refused = await app_client.post("/v1/queues/team-a-dlq/redrive", json={}, headers=team)
    assert refused.status_code == 403
    assert _named(refused.json()["detail"], OTHERS) == set()


# -- the dashboard ------------------------------------------------------------------


async def test_dashboard_overview_names_only_readable_queues(app_factory: AppClient) -> None:
    app_client, team = await _rest_world(app_factory)
    for message in range(2):  # billing-src's messages end up in team-a-dlq
        await app_client.post("/v1/queues/billing-src/messages", json={"body": str(message)},
                              headers=bearer(ADMIN))
    for _ in range(3):
        await app_client.get("/v1/queues/billing-src/receive",
                             params={"wait": 0, "visibility_timeout": 0, "max": 10},
                             headers=bearer(ADMIN))
    overview = await app_client.get("/ui/api/overview", headers=team)
    assert overview.status_code == 200, overview.text
    assert _named(overview.text, OTHERS) == set()
    shown = {q["name"]: q for q in overview.json()["queues"]}
    assert set(shown) == TEAM
    assert shown["team-a-x"]["dead_letter_queue"] is None
    assert shown["team-a-src"]["dead_letter_queue"] == "team-a-dlq"
    everything = await app_client.get("/ui/api/overview", headers=bearer(ADMIN))
    assert _named(everything.text, OTHERS) == OTHERS
    admin_shown = {q["name"]: q for q in everything.json()["queues"]}
    assert admin_shown["team-a-x"]["dead_letter_queue"] == "billing-dlq"
    assert admin_shown["team-a-dlq"]["dead_letter_sources"] == {"billing-src": 2}
