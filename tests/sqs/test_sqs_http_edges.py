"""The SQS door over raw HTTP, where SQS's answers were recorded against AWS (LocalStack's
TestSqsQueryApi): what a queue URL takes, a request naming no action, Query answers
in JSON for a client that accepts JSON, the JSON protocol posted to a queue URL, and
queue URLs under region-specific host names."""

from __future__ import annotations

import json
from typing import Any

import httpx
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from sqs_clients import ACCOUNT

JSON_HEADERS = {"content-type": "application/x-amz-json-1.0"}


def signed(method: str, url: str, *, params: dict[str, str] | None = None,
           headers: dict[str, str] | None = None, body: bytes = b"",
           region: str = "us-east-1") -> dict[str, Any]:
    """httpx arguments of a request signed as the SDKs sign (SigV4 in the
    Authorization header), with any key: the door is open in these tests."""
    full = str(httpx.URL(url, params=params or {}))
    request = AWSRequest(method=method, url=full, data=body, headers=headers or {})
    SigV4Auth(Credentials("AKIDEXAMPLE", "secret"), "sqs", region).add_auth(request)
    return {"method": method, "url": full, "content": body, "headers": dict(request.headers)}


async def make_queue(http: httpx.AsyncClient, base: str, name: str) -> str:
    created = await http.post(f"{base}/", data={"Action": "CreateQueue", "QueueName": name})
    assert created.status_code == 200, created.text
    return f"{base}/{ACCOUNT}/{name}"


async def test_a_queue_url_refuses_the_services_own_actions(served: tuple[str, Any]) -> None:
    """CreateQueue and ListQueues are not a queue's: on a queue URL SQS answers
    InvalidAction (400, Sender), by GET or POST; at the root both work, GET too."""
    base, _ = served
    async with httpx.AsyncClient() as http:
        url = await make_queue(http, base, "edges")
        for action, extra in (("CreateQueue", {"QueueName": "edges-2"}), ("ListQueues", {})):
            params = {"Action": action, **extra}
            for answer in (await http.request(**signed("GET", url, params=params)),
                           await http.post(url, data=params)):
                assert answer.status_code == 400, answer.text
                assert answer.headers["content-type"].startswith("text/xml")
                assert "<Type>Sender</Type>" in answer.text
                assert "<Code>InvalidAction</Code>" in answer.text
                assert (f"<Message>The action {action} is not valid for this endpoint."
                        f"</Message>") in answer.text
        listed = await http.request(**signed("GET", f"{base}/", params={
            "Action": "ListQueues", "Version": "2012-11-05"}))
        assert listed.status_code == 200 and "<ListQueuesResponse" in listed.text
        assert f"<QueueUrl>{url}</QueueUrl>" in listed.text
        assert "edges-2" not in listed.text  # the refused CreateQueue made nothing
        made = await http.request(**signed("GET", f"{base}/", params={
            "Action": "CreateQueue", "QueueName": "edges-3"}))
        assert made.status_code == 200, made.text
        assert f"<QueueUrl>{base}/{ACCOUNT}/edges-3</QueueUrl>" in made.text


async def test_get_queue_url_on_a_queue_url_names_any_queue(served: tuple[str, Any]) -> None:
    base, _ = served
    async with httpx.AsyncClient() as http:
        first = await make_queue(http, base, "first")
        second = await make_queue(http, base, "second")
        for name, url in (("first", first), ("second", second)):
            answer = await http.request(**signed("GET", first, params={
                "Action": "GetQueueUrl", "QueueName": name}))
            assert answer.status_code == 200, answer.text
            assert f"<QueueUrl>{url}</QueueUrl>" in answer.text
        # A QueueUrl among the parameters wins over the URL the request went to.
        answer = await http.request(**signed("GET", first, params={
            "Action": "GetQueueAttributes", "QueueUrl": second, "AttributeName.1": "QueueArn"}))
        assert answer.status_code == 200, answer.text
        assert f"<Value>arn:aws:sqs:us-east-1:{ACCOUNT}:second</Value>" in answer.text
        assert ":first<" not in answer.text


async def test_a_signed_get_takes_any_action(served: tuple[str, Any], db: Any) -> None:
    """SQS takes every action over GET; a signed one is taken here too (an unsigned
    one that would change state is not: test_sqs_query_over_get.py)."""
    base, _ = served
    async with httpx.AsyncClient() as http:
        full = await make_queue(http, base, "full")
        empty = await make_queue(http, base, "empty")
        sent = await http.request(**signed("GET", full, params={
            "Action": "SendMessage", "MessageBody": "foobar"}))
        assert sent.status_code == 200 and "<MD5OfMessageBody>" in sent.text, sent.text
        nothing = await http.request(**signed("GET", empty, params={"Action": "ReceiveMessage"}))
        assert nothing.status_code == 200 and "<ReceiveMessageResult/>" in nothing.text
        got = await http.request(**signed("GET", full, params={"Action": "ReceiveMessage"}))
        assert "<Body>foobar</Body>" in got.text and "<MD5OfBody>" in got.text
        for params, code, message in [
            ({"Action": "SendMessage"}, "MissingParameter",
             "The request must contain the parameter MessageBody."),
            ({"Action": "FooBar", "Version": "2012-11-05"}, "InvalidAction",
             "The action FooBar is not valid for this endpoint."),
            ({"Action": "GetQueueAttributes", "AttributeName.1": "Foobar"},
             "InvalidAttributeName", "Unknown Attribute Foobar."),
        ]:
            refused = await http.request(**signed("GET", full, params=params))
            assert refused.status_code == 400, refused.text
            assert f"<Type>Sender</Type><Code>{code}</Code>" in refused.text
            assert f"<Message>{message}</Message>" in refused.text
        deleted = await http.request(**signed("GET", empty, params={"Action": "DeleteQueue"}))
        assert deleted.status_code == 200 and "<DeleteQueueResponse " in deleted.text
        assert await db.fetchval("SELECT count(*) FROM leaseq.queues WHERE name = 'empty'") == 0
        gone = await http.request(**signed("GET", empty, params={
            "Action": "GetQueueAttributes", "AttributeName.1": "QueueArn"}))
        assert gone.status_code == 400
        assert "<Code>AWS.SimpleQueueService.NonExistentQueue</Code>" in gone.text
        assert ("<Message>The specified queue does not exist for this wsdl version."
                "</Message>") in gone.text


async def test_a_request_naming_no_action_is_an_unknown_operation(
    served: tuple[str, Any],
) -> None:
    """No Action: 404 and `<UnknownOperationException/>`, in XML even to a client
    that accepts JSON, at a queue URL or at the root, by GET or POST."""
    base, _ = served
    async with httpx.AsyncClient() as http:
        url = await make_queue(http, base, "quiet")
        for target in (url, f"{base}/"):
            for headers in ({}, {"Accept": "application/json"}):
                for answer in (
                    await http.request(**signed("GET", target, headers=headers)),
                    await http.get(target, params={"Version": "2012-11-05"}, headers=headers),
                    await http.post(target, data={"Version": "2012-11-05"}, headers=headers),
                ):
                    assert answer.status_code == 404, (target, answer.text)
                    assert answer.text == "<UnknownOperationException/>"
                    assert answer.headers["content-type"].startswith("text/xml")


async def test_a_query_client_that_accepts_json_is_answered_in_json(
    served: tuple[str, Any],
) -> None:
    base, _ = served
    accept = {"Accept": "application/json"}
    async with httpx.AsyncClient() as http:
        url = await make_queue(http, base, "jsonish")
        answer = await http.request(**signed("GET", url, headers=accept, params={
            "Action": "GetQueueAttributes", "AttributeName.1": "All"}))
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "application/json"
        document = answer.json()
        response = document["GetQueueAttributesResponse"]
        assert response["ResponseMetadata"]["RequestId"] == answer.headers["x-amzn-requestid"]
        attributes = {a["Name"]: a["Value"]
                      for a in response["GetQueueAttributesResult"]["Attributes"]}
        assert attributes["QueueArn"] == f"arn:aws:sqs:us-east-1:{ACCOUNT}:jsonish"
        assert attributes["VisibilityTimeout"] == "30"
        # Refusals too: {"Error": {...}, "RequestId": ...}.
        refused = await http.request(**signed("GET", url, headers=accept, params={
            "Action": "ListQueues"}))
        assert refused.status_code == 400
        assert refused.headers["content-type"] == "application/json"
        assert refused.json()["Error"] == {
            "Type": "Sender", "Code": "InvalidAction",
            "Message": "The action ListQueues is not valid for this endpoint.", "Detail": None,
        }
        assert refused.json()["RequestId"] == refused.headers["x-amzn-requestid"]
        missing = await http.post(f"{base}/", headers=accept, data={
            "Action": "GetQueueUrl", "QueueName": "nope"})
        assert missing.status_code == 400
        assert missing.json()["Error"] == {
            "Type": "Sender", "Code": "AWS.SimpleQueueService.NonExistentQueue",
            "Message": "The specified queue does not exist for this wsdl version.", "Detail": None,
        }
        # Lists, a message and its attributes; an action without a result.
        await http.post(url, data={
            "Action": "SendMessage", "MessageBody": "b", "MessageAttribute.1.Name": "k",
            "MessageAttribute.1.Value.DataType": "String",
            "MessageAttribute.1.Value.StringValue": "v"})
        # ListQueues as SQS writes it in JSON (recorded by AWS.jl's authors): its
        # own member names, absent ones null. `ContentType=JSON` asks as Accept does.
        listed = await http.post(f"{base}/", headers=accept, data={"Action": "ListQueues"})
        assert listed.json()["ListQueuesResponse"]["ListQueuesResult"] == {
            "NextExclusiveStartQueueName": None, "NextToken": None, "queueUrls": [url]}
        none = await http.post(f"{base}/", data={
            "Action": "ListQueues", "QueueNamePrefix": "nothing", "ContentType": "JSON"})
        assert none.headers["content-type"] == "application/json"
        assert none.json()["ListQueuesResponse"]["ListQueuesResult"] == {
            "NextExclusiveStartQueueName": None, "NextToken": None, "queueUrls": None}
        got = await http.post(url, headers=accept, data={
            "Action": "ReceiveMessage", "MessageAttributeName.1": "All",
            "AttributeName.1": "ApproximateReceiveCount"})
        [message] = got.json()["ReceiveMessageResponse"]["ReceiveMessageResult"]["Messages"]
        assert message["Body"] == "b"
        assert message["Attributes"] == [{"Name": "ApproximateReceiveCount", "Value": "1"}]
        assert message["MessageAttributes"] == [
            {"Name": "k", "Value": {"DataType": "String", "StringValue": "v"}}]
        purged = await http.post(url, headers=accept, data={"Action": "PurgeQueue"})
        assert purged.json() == {"PurgeQueueResponse": {
            "ResponseMetadata": {"RequestId": purged.headers["x-amzn-requestid"]}}}
        # Without asking, XML as before.
        plain = await http.post(url, data={"Action": "GetQueueAttributes"})
        assert plain.headers["content-type"].startswith("text/xml")


async def test_the_json_protocol_posted_to_a_queue_url(served: tuple[str, Any]) -> None:
    """An SDK of the JSON protocol may post to the queue URL (as some PHP ones do):
    it is served as at the root, its QueueUrl naming the queue (else the path)."""
    base, _ = served
    async with httpx.AsyncClient() as http:
        url = await make_queue(http, base, "posted")
        for body in ({"QueueUrl": url, "MessageBody": "one"}, {"MessageBody": "two"}):
            sent = await http.request(**signed(
                "POST", url, body=json.dumps(body).encode(),
                headers={**JSON_HEADERS, "X-Amz-Target": "AmazonSQS.SendMessage"}))
            assert sent.status_code == 200, sent.text
            assert sent.headers["content-type"] == "application/x-amz-json-1.0"
            assert "MessageId" in sent.json()
        got = await http.post(f"{base}/", json={"QueueUrl": url, "MaxNumberOfMessages": 10},
                              headers={**JSON_HEADERS, "X-Amz-Target": "AmazonSQS.ReceiveMessage"})
        assert sorted(m["Body"] for m in got.json()["Messages"]) == ["one", "two"]


async def test_control_characters_in_a_json_request_are_refused_in_json(
    served: tuple[str, Any], client: httpx.AsyncClient,
) -> None:
    """A target or body holding control characters is refused in the JSON
    protocol's shape, never a 500 nor an XML answer. (In a header the HTTP
    server refuses them first; in process, the door sees them.)"""
    base, _ = served
    async with httpx.AsyncClient() as http:
        url = await make_queue(http, base, "controls")
        answer = await http.post(f"{base}/", json={"QueueUrl": url, "MessageBody": "x"},
                                 headers={**JSON_HEADERS, "X-Amz-Target": "AmazonSQS.Send\x01"})
        assert answer.status_code == 400
    await client.post("/", data={"Action": "CreateQueue", "QueueName": "controls"})
    url = f"http://leaseq.test/{ACCOUNT}/controls"
    for target, body, error in [
        ("AmazonSQS.Send\x01Message", json.dumps({"QueueUrl": url, "MessageBody": "x"}),
         "com.amazon.coral.service#UnknownOperationException"),
        ("AmazonSQS.SendMessage\x7f", json.dumps({"QueueUrl": url, "MessageBody": "x"}),
         "com.amazon.coral.service#UnknownOperationException"),
        # Raw control characters are not JSON (they must be escaped in a string).
        ("AmazonSQS.SendMessage", f'{{"QueueUrl": "{url}", "MessageBody": "a\x01b"}}',
         "com.amazonaws.sqs#InvalidParameterValueException"),
        ("AmazonSQS.SendMessage", f'{{"QueueUrl": "{url}",\x00 "MessageBody": "x"}}',
         "com.amazonaws.sqs#InvalidParameterValueException"),
        # Escaped, one is text SQS refuses in a message.
        ("AmazonSQS.SendMessage", json.dumps({"QueueUrl": url, "MessageBody": "a\x01b"}),
         "com.amazonaws.sqs#InvalidMessageContents"),
    ]:
        answer = await client.post("/", content=body.encode(), headers={
            **JSON_HEADERS, "X-Amz-Target": target})
        assert answer.status_code == 400, (target, body, answer.text)
        assert answer.headers["content-type"] == "application/x-amz-json-1.0"
        assert answer.json()["__type"] == error, (target, body, answer.text)
    got = await client.post("/", json={"QueueUrl": url}, headers={
        **JSON_HEADERS, "X-Amz-Target": "AmazonSQS.ReceiveMessage"})
    assert "Messages" not in got.json()  # nothing was sent


REGION_HOSTS = [
    "sqs.us-east-1.amazonaws.com",  # SQS's endpoint
    "queue.amazonaws.com",  # its legacy one (us-east-1)
    "eu-west-1.queue.amazonaws.com",  # legacy, regional
    "sqs.us-east-1.localhost.localstack.cloud:4566",  # LocalStack's standard strategy
    "localhost.localstack.cloud:4566",
]


async def test_queue_urls_under_region_host_names(serve_factory: Any) -> None:
    """A client whose endpoint is a region's host name (through a proxy, or a name
    resolving here) is told queue URLs on that host, as AWS answers on each of its
    endpoints; any of them names the queue by its path, on both protocols."""
    names = ",".join(h.rsplit(":", 1)[0] for h in REGION_HOSTS) + ",127.0.0.1"
    base, _ = await serve_factory(allowed_hosts=names)
    async with httpx.AsyncClient() as http:
        for n, host in enumerate(REGION_HOSTS):
            name = f"region-{n}"
            created = await http.post(f"{base}/", headers={"Host": host}, data={
                "Action": "CreateQueue", "QueueName": name})
            assert f"<QueueUrl>http://{host}/{ACCOUNT}/{name}</QueueUrl>" in created.text
            found = await http.post(f"{base}/", json={"QueueName": name}, headers={
                **JSON_HEADERS, "Host": host, "X-Amz-Target": "AmazonSQS.GetQueueUrl"})
            assert found.json() == {"QueueUrl": f"http://{host}/{ACCOUNT}/{name}"}
            # The queue URL itself, addressed through that host, is the queue.
            sent = await http.post(f"{base}/{ACCOUNT}/{name}", headers={"Host": host}, data={
                "Action": "SendMessage", "MessageBody": host})
            assert sent.status_code == 200, sent.text
        # Every one of these URLs names its queue wherever it is sent, and the ARNs
        # are this deployment's region's.
        for n, host in enumerate(REGION_HOSTS):
            got = await http.post(f"{base}/", json={
                "QueueUrl": f"https://{host}/{ACCOUNT}/region-{n}", "AttributeNames": ["All"]},
                headers={**JSON_HEADERS, "X-Amz-Target": "AmazonSQS.GetQueueAttributes"})
            attributes = got.json()["Attributes"]
            assert attributes["ApproximateNumberOfMessages"] == "1"
            assert attributes["QueueArn"] == f"arn:aws:sqs:us-east-1:{ACCOUNT}:region-{n}"
