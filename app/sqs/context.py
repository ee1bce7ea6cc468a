"""The context of one SQS request, and reading its parameters in SQS's shapes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from app.auth.access import Needs
from app.auth.scopes import EVERYONE, Principal
from app.queue import limits
from app.queue.receiving import Gone
from app.queue.redrive import Redrives
from app.queue.service import QueueService
from app.sqs.errors import NO_QUEUE, SqsError

ADMIN_OF_QUEUE = Needs((("admin", "queue"),))


@dataclass
class Context:
    service: QueueService
    redrives: Redrives
    base_url: str  # LEASEQ_PUBLIC_URL, else scheme://host[:port] of the request
    account: str
    region: str
    sender_id: str
    gone: Gone | None = None
    path_queue: str | None = None  # the queue of a request posted to its queue URL
    principal: Principal = EVERYONE
    needs: Needs = ADMIN_OF_QUEUE  # the action's declaration (NEEDS)

    def queue_url(self, name: str) -> str:
        """A queue's URL, the one form every action answers with (CreateQueue,
        GetQueueUrl, ListQueues, ListDeadLetterSourceQueues)."""
        return f"{self.base_url}/{self.account}/{name}"

    def arn(self, name: str) -> str:
        return f"arn:aws:sqs:{self.region}:{self.account}:{name}"

    def name_from_arn(self, arn: str, parameter: str) -> str:
        parts = arn.split(":")
        if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or not parts[5]:
            raise SqsError("InvalidParameterValue", f"{parameter} is not an SQS queue ARN.")
        if parts[4] != self.account:
            raise SqsError("QueueDoesNotExist", f"The queue {arn} does not exist.")
        return parts[5]


def is_fifo_name(name: str) -> bool:
    """Whether a queue is FIFO, from its name: the engine gives ".fifo" names to FIFO
    queues and only to them (SQS's rule), so no lookup is needed."""
    return name.endswith(limits.FIFO_SUFFIX)


def param_str(params: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = params.get(name)
    if value is None:
        if required:
            raise SqsError("MissingParameter", f"The request must contain the parameter {name}.")
        return None
    if not isinstance(value, str):
        raise SqsError("InvalidParameterValue", f"{name} must be a string.")
    return value


def param_required(params: dict[str, Any], name: str) -> str:
    value = param_str(params, name, required=True)
    assert value is not None
    return value


_NUMBER = re.compile(r"\s*(-?[0-9]{1,18})\s*", re.ASCII)


def number_in(text: str, *, negative: bool = False) -> int | None:
    """The integer `text` spells in ASCII digits (spaces around it allowed), else None.
    Neither str.isdigit() nor str.strip() will do as the check before int(): the
    first takes digits such as "²", the second strips separators such as \x1c, and
    int() refuses both (a 500, where a client's error is meant)."""
    found = _NUMBER.fullmatch(text)
    if found is None or (not negative and found[1].startswith("-")):
        return None
    return int(found[1])


def param_int(params: dict[str, Any], name: str) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool):
        raise SqsError("InvalidParameterValue", f"{name} must be an integer.")
    if isinstance(value, int):
        return value
    number = number_in(value, negative=True) if isinstance(value, str) else None
    if number is not None:
        return number
    raise SqsError(
        "InvalidParameterValue", f"Value {str(value)[:40]} for parameter {name} is invalid."
    )


def param_ranged(params: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = param_int(params, name)
    if value is not None and not low <= value <= high:
        raise SqsError(
            "InvalidParameterValue",
            f"Value {value} for parameter {name} is invalid. Reason: Must be between "
            f"{low} and {high}, if provided.",
        )
    return value


def param_str_list(params: dict[str, Any], name: str) -> list[str]:
    value = params.get(name)
    if value is None or value == "":  # "": botocore's Query form of an empty list
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SqsError("InvalidParameterValue", f"{name} must be a list of strings.")
    return value


def param_str_map(params: dict[str, Any], name: str) -> dict[str, str]:
    value = params.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise SqsError("InvalidParameterValue", f"{name} must map names to strings.")
    return value


def queue_of(ctx: Context, params: dict[str, Any]) -> str:
    """The queue a request names: its QueueUrl, else the URL it was posted to."""
    url = param_str(params, "QueueUrl")
    if url is None:
        if ctx.path_queue is not None:
            ctx.needs.require(ctx.principal, "queue", [ctx.path_queue])
            return ctx.path_queue
        raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
    # A public base URL with a path (`https://q.example.com/sqs`) puts that path in
    # front of the queue URLs handed out: they name their queue too.
    name = name_of_queue_url(url, ctx.account, prefix=urlsplit(ctx.base_url).path)
    ctx.needs.require(ctx.principal, "queue", [name])
    return name


def name_of_queue_url(url: str, account: str, prefix: str = "") -> str:
    """The queue a QueueUrl names, whatever its scheme, host, port or region: a
    bare queue name; `/{account}/{name}` (SQS's, ElasticMQ's, LocalStack's URLs);
    LocalStack's path-style `/queue/{region}/{account}/{name}`; ElasticMQ's old
    `/queue/{name}`; any of these after `prefix`, the path of the public base URL.
    Another account's queue, or anything else, does not exist."""
    if limits.is_queue_name(url):  # a bare name: no "/" nor ":" can be in one
        return url
    try:
        path = urlsplit(url).path
    except ValueError as exc:  # such as an unclosed "[" of an IPv6 host
        raise SqsError("QueueDoesNotExist", NO_QUEUE) from exc
    parts = [p for p in path.split("/") if p]
    base = [p for p in prefix.split("/") if p]
    if base and parts[: len(base)] == base and len(parts) > len(base):
        parts = parts[len(base):]
    if len(parts) == 4 and parts[0] == "queue":
        parts = parts[2:]
    if len(parts) == 2 and parts[0] == "queue":
        parts = [account, parts[1]]
    if len(parts) != 2 or parts[0] != account or not limits.is_queue_name(parts[1]):
        raise SqsError("QueueDoesNotExist", NO_QUEUE)
    return parts[1]


def check_text(text: str, what: str) -> None:
    if limits.NOT_TEXT_CHAR.search(text):  # the XML character set SQS accepts
        raise SqsError(
            "InvalidMessageContents",
            f"Invalid characters found in {what}. Valid characters are #x9 | #xA | #xD | "
            f"#x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF.",
        )


def millis(moment: datetime | None) -> str:
    return "" if moment is None else str(int(moment.timestamp() * 1000))
