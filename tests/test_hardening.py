"""Hostile input is refused with the protocol's own errors, never a 500, and the
embedded server and generated secrets keep what they hold to their owner."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import stat
import tempfile
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
import pytest
from sqs_clients import ACCOUNT, run
from sqs_clients import client as sqs_client
from support import make_queue

from app.api.message_schemas import _storable_json
from app.config import Settings
from app.db import embedded
from app.db.embedded import SYSTEM_USER, EmbeddedPostgres
from app.sqs import protocol
from app.sqs.errors import SqsError

FORM = {"content-type": "application/x-www-form-urlencoded"}
QUEUE_URL = f"http://leaseq.test/{ACCOUNT}/tagged"


def sqs_json(action: str, params: dict[str, Any]) -> dict[str, Any]:
    # ensure_ascii: lone surrogates travel as \ud800 escapes, as a client may send them.
    return {
        "content": json.dumps(params, ensure_ascii=True),
        "headers": {"x-amz-target": f"AmazonSQS.{action}",
                    "content-type": "application/x-amz-json-1.0"},
    }


def json_error(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text[:300]
    return str(response.json()["__type"]).split("#")[-1]


def query_error(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text[:300]
    return response.text.split("<Code>")[1].split("</Code>")[0]


# -- SQS Query and JSON parsing -------------------------------------------------


HOSTILE_FORMS = {
    "2,001 fields": "&".join(f"F{i}=x" for i in range(2_001)),
    "2,000 dotted parts": "Action=CreateQueue&" + ".".join(["a"] * 2_000) + "=x",
    "17 dotted parts": "Action=CreateQueue&QueueName=q&" + ".".join(["a"] * 17) + "=x",
    "a 300-character name": f"Action=CreateQueue&{'A' * 300}=x",
    "an index of 5,000 digits": f"Action=CreateQueue&Attribute.{'9' * 5_000}.Name=x",
    "an index of 200 digits": f"Action=CreateQueue&Attribute.{'9' * 200}.Name=x",
    "index 0": "Action=CreateQueue&QueueName=q&Attribute.0.Name=DelaySeconds",
    "index 1001": "Action=CreateQueue&QueueName=q&Attribute.1001.Name=DelaySeconds",
}


@pytest.mark.parametrize("body", HOSTILE_FORMS.values(), ids=HOSTILE_FORMS.keys())
async def test_hostile_query_forms_are_invalid_parameters(
    client: httpx.AsyncClient, body: str
) -> None:
    response = await client.post("/", content=body, headers=FORM)
    assert query_error(response) == "InvalidParameterValue"


async def test_the_field_limit_counts_the_query_string_too(client: httpx.AsyncClient) -> None:
    query = "&".join(f"Q{i}=x" for i in range(1_500))
    body = "&".join(f"F{i}=x" for i in range(501))
    response = await client.post(f"/?{query}", content=body, headers=FORM)
    assert query_error(response) == "InvalidParameterValue"


def test_the_largest_sqs_request_fits_the_query_limits() -> None:
    # SendMessageBatch at SQS's limits: 10 entries of 10 list-valued attributes.
    fields = ["Action=SendMessageBatch", f"QueueUrl={QUEUE_URL}"]
    for i in range(1, 11):
        entry = f"SendMessageBatchRequestEntry.{i}"
        fields += [f"{entry}.Id=e{i}", f"{entry}.MessageBody=b"]
        for j in range(1, 11):
            attribute = f"{entry}.MessageAttribute.{j}"
            fields += [f"{attribute}.Name=a{j}", f"{attribute}.Value.DataType=String",
                       f"{attribute}.Value.StringListValue.1=v"]
    action, params = protocol.parse_form(protocol.form_pairs("&".join(fields).encode(), ""))
    assert action == "SendMessageBatch"
    assert len(params["Entries"]) == 10
    assert params["Entries"][9]["MessageAttributes"]["a10"] == {
        "DataType": "String", "StringListValues": ["v"]
    }


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


SEND = f'{{"QueueUrl": "{QUEUE_URL}", "MessageBody": "b", "DelaySeconds": '
HOSTILE_JSON = {
    "nested 100,000 deep": ("CreateQueue", "[" * 100_000 + "]" * 100_000),
    # An unknown parameter is otherwise ignored: only the depth is refused.
    "nested 17 deep": ("CreateQueue", json.dumps({"QueueName": "q", "Other": nested(16)})),
    "an integer of 5,000 digits": ("SendMessage", SEND + "9" * 5_000 + "}"),
    "an integer of 4,000 digits": ("SendMessage", SEND + "9" * 4_000 + "}"),
}


@pytest.mark.parametrize("action,body", HOSTILE_JSON.values(), ids=HOSTILE_JSON.keys())
async def test_hostile_json_bodies_are_invalid_parameters(
    client: httpx.AsyncClient, action: str, body: str
) -> None:
    response = await client.post("/", content=body, headers={
        "x-amz-target": f"AmazonSQS.{action}", "content-type": "application/x-amz-json-1.0",
    })
    assert json_error(response) == "InvalidParameterValue"


def test_json_nests_up_to_the_limit_and_not_a_level_more() -> None:
    assert protocol.parse_json(json.dumps({"A": nested(15)}).encode())
    with pytest.raises(SqsError) as refused:
        protocol.parse_json(json.dumps({"A": nested(16)}).encode())
    assert refused.value.name == "InvalidParameterValue"


async def test_a_full_batch_from_a_query_client_passes_the_limits(
    served: tuple[str, Any],
) -> None:
    sqs = sqs_client(served[0], "query")
    url = (await run(sqs.create_queue, QueueName="full"))["QueueUrl"]
    attributes = {f"a{j}": {"DataType": "String", "StringValue": "v" * 20} for j in range(10)}
    sent = await run(sqs.send_message_batch, QueueUrl=url, Entries=[
        {"Id": f"e{i}", "MessageBody": "b", "MessageAttributes": attributes} for i in range(10)
    ])
    assert len(sent["Successful"]) == 10


# -- SQS tags -------------------------------------------------------------------


BAD_TEXT = ["\x00", "\ud800", "ok\x01", "\ufffe"]


@pytest.mark.parametrize("bad", BAD_TEXT, ids=lambda t: f"U+{ord(t[-1]):04X}")
async def test_tags_with_characters_sqs_refuses_are_invalid_parameters(
    client: httpx.AsyncClient, bad: str
) -> None:
    created = await client.post("/", **sqs_json("CreateQueue", {"QueueName": "tagged"}))
    assert created.status_code == 200, created.text
    calls: list[tuple[str, dict[str, Any]]] = [
        ("TagQueue", {"QueueUrl": QUEUE_URL, "Tags": {bad: "v"}}),
        ("TagQueue", {"QueueUrl": QUEUE_URL, "Tags": {"k": bad}}),
        ("UntagQueue", {"QueueUrl": QUEUE_URL, "TagKeys": ["k", bad]}),
        ("CreateQueue", {"QueueName": "other", "tags": {"k": bad}}),
        ("CreateQueue", {"QueueName": "other", "tags": {bad: "v"}}),
    ]
    for action, params in calls:
        response = await client.post("/", **sqs_json(action, params))
        assert json_error(response) == "InvalidParameterValue", (action, params)
    listed = await client.post("/", **sqs_json("ListQueueTags", {"QueueUrl": QUEUE_URL}))
    assert listed.json() == {}
    queues = await client.post("/", **sqs_json("ListQueues", {}))
    assert queues.json()["QueueUrls"] == [QUEUE_URL]


async def test_query_tags_with_nul_are_invalid_parameters(client: httpx.AsyncClient) -> None:
    await client.post("/", content="Action=CreateQueue&QueueName=tagged", headers=FORM)
    for body in (
        f"Action=TagQueue&QueueUrl={QUEUE_URL}&Tag.1.Key=k%00&Tag.1.Value=v",
        f"Action=TagQueue&QueueUrl={QUEUE_URL}&Tag.1.Key=k&Tag.1.Value=%00",
        f"Action=UntagQueue&QueueUrl={QUEUE_URL}&TagKey.1=%00",
        "Action=CreateQueue&QueueName=other&Tag.1.Key=k&Tag.1.Value=%00",
    ):
        assert query_error(await client.post("/", content=body, headers=FORM)) == (
            "InvalidParameterValue"
        ), body


# -- REST bodies ----------------------------------------------------------------


async def test_not_before_outside_the_window_is_a_validation_error(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client, "scheduled")
    url = f"/v1/queues/{queue}/messages"
    for moment in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00",
                   "1969-12-31T23:59:59Z", "9000-01-01T00:00:00Z"):
        for payload in ({"body": "x", "not_before": moment},
                        {"messages": [{"body": "x", "not_before": moment}]}):
            response = await client.post(url, json=payload)
            assert response.status_code == 422, (moment, response.text)
            assert response.json()["code"] == "validation_error"
    for moment in ("1970-01-01T00:00:00Z", "8999-12-31T23:59:59+14:00"):
        response = await client.post(url, json={"body": "x", "not_before": moment})
        assert response.status_code == 201, (moment, response.text)


async def test_refused_characters_are_named_in_the_error(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "texts")
    url = f"/v1/queues/{queue}/messages"
    for payload, code_point in [
        ({"body": "ok\x00"}, "U+0000"),
        ({"body": "tab\tok", "attributes": {"a": "x\ufffe"}}, "U+FFFE"),
        ({"body": "ok\x1f\x00"}, "U+001F"),
    ]:
        response = await client.post(url, json=payload)
        assert response.status_code == 422, response.text
        messages = [error["msg"] for error in response.json()["errors"]]
        assert any(f"does not allow: {code_point}" in m for m in messages), messages
    accepted = {"body": "\t\n\r \ud7ff\ue000\ufffd\U00010000\U0010ffff"}
    assert (await client.post(url, json=accepted)).status_code == 201


def test_a_cursor_reports_its_first_fault() -> None:
    assert _storable_json(nested(64, leaf=[])) is not None
    for depth in (65, 100_000):
        with pytest.raises(ValueError, match="nested too deeply"):
            _storable_json(nested(depth))
    with pytest.raises(ValueError, match="U\\+0000"):
        _storable_json([{"k": "\x00"}, "\ud800", float("nan")])
    with pytest.raises(ValueError, match="cannot represent"):
        _storable_json([[float("inf")], "\x00"])
    with pytest.raises(ValueError, match="U\\+0001"):
        _storable_json({"a": 1, "\x01": 2})


@pytest.mark.parametrize("path,payload,refused_by", [
    ("", {"messages": [{}] * 5_000}, "parser"),
    ("/visibility", {"entries": [{}] * 5_000}, "parser"),
    ("/delete", {"receipt_handles": [0] * 5_000}, "parser"),
    # Strings have no parser hook: pydantic stops at the hard cap instead.
    ("/delete", {"receipt_handles": ["h"] * 5_000}, "pydantic"),
])
async def test_batches_past_the_hard_cap_stop_validating_at_once(
    client: httpx.AsyncClient, path: str, payload: dict[str, Any], refused_by: str
) -> None:
    queue = await make_queue(client, "capped")
    response = await client.post(f"/v1/queues/{queue}/messages{path}", json=payload)
    assert response.status_code == 422, response.text[:300]
    if refused_by == "parser":
        # The JSON parser stopped at the first value past a full batch.
        assert "stopped reading after" in response.json()["detail"]
    else:
        # One error for the list, none for its 5,000 entries: pydantic refused
        # the list before it validated any of them.
        assert [e["type"] for e in response.json()["errors"]] == ["too_long"]


# -- the embedded server and secrets ----------------------------------------------


def test_embedded_server_environment_and_socket_directory_are_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"leaseq-hardening-{uuid.uuid4().hex}"
    for name in ("LEASEQ_SECRET", "DATABASE_URL", "AWS_SECRET_ACCESS_KEY", "PGPASSWORD"):
        monkeypatch.setenv(name, secret)
    # Deep enough that the socket cannot live in the server's directory itself
    # (which, run as root, is under the embedded root).
    data_dir = tmp_path / ("d" * 80)
    deep_root = Path(os.environ["LEASEQ_EMBEDDED_ROOT"]) / ("r" * 80)
    monkeypatch.setenv("LEASEQ_EMBEDDED_ROOT", str(deep_root))
    server = EmbeddedPostgres(data_dir, database="postgres")
    server.start()
    try:
        pid = server.postmaster_pid()
        assert pid is not None
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"PATH=" in environ and b"LEASEQ_" not in environ
        assert secret.encode() not in environ
        children = psutil.Process(pid).children()
        assert children  # the checkpointer and other background processes
        for child in children:
            try:
                environ = Path(f"/proc/{child.pid}/environ").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue  # a worker that came and went (autovacuum's)
            assert secret.encode() not in environ, child
        socket_dir = Path(server.dsn().split("host=")[1].split("&")[0])
        assert socket_dir.parent == Path(tempfile.gettempdir())
        assert socket_dir.name.startswith("leaseq-pg-")
        info = socket_dir.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700
        owner = pwd.getpwnam(SYSTEM_USER).pw_uid if os.geteuid() == 0 else os.geteuid()
        assert info.st_uid == owner
        assert psutil.Process(pid).uids().real == owner

        async def select_one() -> int:
            conn = await asyncpg.connect(server.dsn())
            try:
                return int(await conn.fetchval("SELECT 1"))
            finally:
                await conn.close()

        assert asyncio.run(select_one()) == 1
    finally:
        server.stop()
    assert not socket_dir.exists()


@pytest.mark.skipif(os.geteuid() != 0,
                    reason="only a server started by root runs as another user")
def test_as_root_the_server_lives_in_a_root_of_its_own_and_no_parent_is_loosened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root's home stays closed: the server's files and, when pip put them where
    its user cannot go, its binaries live under the embedded root; a data
    directory an earlier leaseq kept in place is moved there whole."""
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    installed = embedded._bin_dir().parent.parent
    install = private / "site-packages" / installed.name / "pginstall"
    shutil.copytree(installed / "pginstall", install, symlinks=True)
    shutil.copytree(installed.with_name(f"{installed.name}.libs"),
                    private / "site-packages" / f"{installed.name}.libs", symlinks=True)
    monkeypatch.setattr(embedded, "_bin_dir", lambda: install / "bin")
    data_dir = private / "leaseq"
    modes = {path: path.stat().st_mode for path in [install, *install.parents]}
    root = Path(os.environ["LEASEQ_EMBEDDED_ROOT"]).resolve()

    async def sql(dsn: str, statement: str) -> Any:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchval(statement)
        finally:
            await conn.close()

    server = EmbeddedPostgres(data_dir, database="postgres")
    server.start()
    try:
        link = data_dir / "pgdata"
        real = link.resolve()
        assert link.is_symlink() and real.parent.parent == root
        assert (real.parent / "data-directory").read_text() == f"{data_dir}\n"
        assert real.stat().st_uid == pwd.getpwnam(SYSTEM_USER).pw_uid
        pid = server.postmaster_pid()
        assert pid is not None
        postmaster = psutil.Process(pid)
        assert postmaster.cwd() == str(real)
        assert Path(postmaster.exe()).is_relative_to(root)
        asyncio.run(sql(server.dsn(), "CREATE TABLE kept (n int)"))
    finally:
        server.stop()
    assert {path: path.stat().st_mode for path in modes} == modes

    # The layout of an earlier leaseq: the server's directory inside data_dir.
    link.unlink()
    shutil.move(real, link)
    again = EmbeddedPostgres(data_dir, database="postgres")
    again.start()
    try:
        assert link.is_symlink() and link.resolve().parent.parent == root
        assert not real.exists() or not any(real.iterdir())
        assert asyncio.run(sql(again.dsn(), "SELECT to_regclass('kept') IS NOT NULL"))
    finally:
        again.stop()
    assert {path: path.stat().st_mode for path in modes} == modes


def test_a_generated_receipt_secret_is_created_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the mode the file is created with counts: chmod does nothing here,
    # and the umask would leave a file created without a mode readable by all.
    monkeypatch.setattr(os, "chmod", lambda *args, **kwargs: None)
    umask = os.umask(0o022)
    try:
        settings = Settings(data_dir=tmp_path / "data", secret=None)
        first = settings.master_secret()
    finally:
        os.umask(umask)
    path = tmp_path / "data" / "receipt-secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first) == 64 and path.read_bytes().strip() == first
    assert Settings(data_dir=tmp_path / "data", secret=None).master_secret() == first
    assert [p.name for p in path.parent.iterdir()] == ["receipt-secret"]
