"""The two wire protocols: requests into one shape, results and errors out of it.

Every action works on the JSON protocol's shapes (botocore's service model,
`protocol: json`). A Query request (`Action=...` form fields, SQS's flattened
names such as `Attribute.1.Name` or `SendMessageBatchRequestEntry.2.Id`) is
turned into that shape first, and a result is written back as Query XML.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

from app.sqs.errors import JSON_NAMES, NAMESPACES, NO_QUEUE_QUERY, SQS_NAMESPACE, SqsError

JSON_CONTENT_TYPE = "application/x-amz-json-1.0"
XML_CONTENT_TYPE = "text/xml"
# A Query answer in JSON, for a request that asked for one (`Accept: application/json`
# or `ContentType=JSON`).
QUERY_JSON_CONTENT_TYPE = "application/json"
# SQS's answer to a Query request that names no action, in XML whatever it accepts.
UNKNOWN_OPERATION = b"<UnknownOperationException/>"
NAMESPACE = "http://queue.amazonaws.com/doc/2012-11-05/"
TARGET_PREFIX = "AmazonSQS."

# Query form name -> (JSON name, key field, value field): flattened maps.
_FORM_MAPS = {
    "Attribute": ("Attributes", "Name", "Value"),
    "MessageAttribute": ("MessageAttributes", "Name", "Value"),
    "MessageSystemAttribute": ("MessageSystemAttributes", "Name", "Value"),
    "Tag": ("Tags", "Key", "Value"),
    "Tags": ("Tags", "Key", "Value"),
}
# Query form name -> JSON name: flattened lists.
_FORM_LISTS = {
    "AttributeName": "AttributeNames",
    "MessageAttributeName": "MessageAttributeNames",
    "MessageSystemAttributeName": "MessageSystemAttributeNames",
    "TagKey": "TagKeys",
    "SendMessageBatchRequestEntry": "Entries",
    "DeleteMessageBatchRequestEntry": "Entries",
    "ChangeMessageVisibilityBatchRequestEntry": "Entries",
    "StringListValue": "StringListValues",
    "BinaryListValue": "BinaryListValues",
}
# JSON name -> Query XML element of each member, for lists in results.
_XML_LISTS = {
    "QueueUrls": "QueueUrl",
    "queueUrls": "QueueUrl",
    "Messages": "Message",
    "Failed": "BatchResultErrorEntry",
    "Results": "ListMessageMoveTasksResultEntry",
}
_XML_MAPS = {
    "Attributes": ("Attribute", "Name", "Value"),
    "MessageAttributes": ("MessageAttribute", "Name", "Value"),
    "Tags": ("Tag", "Key", "Value"),
}
# Bounds on a Query request, so that a hostile one is refused before it costs
# anything. Fields: a SendMessageBatch of 10 entries with 10 message attributes
# each is some 350 fields. Names: the longest SQS builds, such as
# SendMessageBatchRequestEntry.10.MessageAttribute.10.Value.StringListValue.1,
# are under 100 characters and 7 dotted parts; the parts also bound the
# recursion of _convert. Indexes: SQS numbers list members from 1, and no SQS
# list holds more than 50 (a queue's tags); int() of a long digit string is slow
# and refused past 4,300 digits.
_MAX_FIELDS = 2_000
_MAX_NAME_CHARS = 256
_MAX_NAME_PARTS = 16
_MAX_INDEX = 1_000
# JSON: SQS's shapes nest six levels at most (Entries, an entry, its
# MessageAttributes, one of them, its StringListValues, a value). json.loads
# alone lets some 900 through; refused here, no handler has to beware of one.
_MAX_JSON_DEPTH = 16

# Actions whose Query response has no <ActionResult> element.
_NO_RESULT = {
    "ChangeMessageVisibility", "DeleteMessage", "DeleteQueue", "PurgeQueue",
    "SetQueueAttributes", "TagQueue", "UntagQueue", "AddPermission", "RemovePermission",
}


def parse_json(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        params = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise SqsError("InvalidParameterValue", "The request body is not valid JSON.") from exc
    if not isinstance(params, dict):
        raise SqsError("InvalidParameterValue", "The request body must be a JSON object.")
    _check_depth(params)
    return params


def _check_depth(params: dict[str, Any]) -> None:
    # Level by level: no recursion, and scalars are looked at once.
    level: list[Any] = [params]
    for _ in range(_MAX_JSON_DEPTH):
        nested: list[Any] = []
        for node in level:
            children = node.values() if isinstance(node, dict) else node
            nested.extend(c for c in children if isinstance(c, dict | list))
        if not nested:
            return
        level = nested
    raise SqsError(
        "InvalidParameterValue", f"The request body nests deeper than {_MAX_JSON_DEPTH} levels."
    )


def wants_json(params: dict[str, Any]) -> bool:
    """Whether a Query request asked for JSON by its parameter `ContentType=JSON`
    (the other way is its Accept header)."""
    value = params.pop("ContentType", None)
    return isinstance(value, str) and value.upper() == "JSON"


def parse_form(pairs: list[tuple[str, str]]) -> tuple[str | None, dict[str, Any]]:
    """(Action, the parameters in the JSON shape) of a Query request."""
    action = None
    tree: dict[Any, Any] = {}
    for key, value in pairs:
        if key == "Action":
            action = value
            continue
        if len(key) > _MAX_NAME_CHARS or key.count(".") >= _MAX_NAME_PARTS:
            raise SqsError("InvalidParameterValue", f"Parameter name {key[:100]!r} is too long.")
        parts = [p for p in key.split(".") if p != "member"]
        if not all(parts):
            raise SqsError("InvalidParameterValue", f"Malformed parameter name {key[:100]!r}.")
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(_index(part), {})
            if not isinstance(node, dict):
                raise SqsError("InvalidParameterValue", f"Conflicting parameter {key[:100]!r}.")
        node[_index(parts[-1])] = value
    return action, _convert(tree)


def form_pairs(body: bytes, query_string: str) -> list[tuple[str, str]]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SqsError("InvalidParameterValue", "The request body is not UTF-8.") from exc
    try:
        # parse_qsl counts the fields before it splits any.
        pairs = parse_qsl(query_string, keep_blank_values=True, max_num_fields=_MAX_FIELDS)
        return pairs + parse_qsl(
            text, keep_blank_values=True, max_num_fields=_MAX_FIELDS - len(pairs)
        )
    except ValueError as exc:
        raise SqsError(
            "InvalidParameterValue", f"A request has at most {_MAX_FIELDS} parameters."
        ) from exc


def _index(part: str) -> str | int:
    # ASCII only: str.isdigit() is true of digits, such as "²", that int() refuses.
    if not (part.isascii() and part.isdigit()):
        return part
    if len(part) > len(str(_MAX_INDEX)) or not 1 <= int(part) <= _MAX_INDEX:
        raise SqsError(
            "InvalidParameterValue",
            f"List index {part[:20]} is invalid: members are numbered from 1 to {_MAX_INDEX}.",
        )
    return int(part)


def _as_list(node: Any) -> list[Any]:
    if isinstance(node, dict) and node and all(isinstance(k, int) for k in node):
        return [node[k] for k in sorted(node)]
    raise SqsError("InvalidParameterValue", "A list parameter must be numbered from 1.")


def _convert(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    if node and all(isinstance(k, int) for k in node):
        return [_convert(item) for item in _as_list(node)]
    out: dict[str, Any] = {}
    for key, value in node.items():
        key = str(key)
        if key in _FORM_MAPS:
            name, key_field, value_field = _FORM_MAPS[key]
            mapping: dict[str, Any] = {}
            for entry in _as_list(value):
                if not isinstance(entry, dict) or key_field not in entry:
                    raise SqsError("MissingParameter", f"{key} entries need a {key_field}.")
                mapping[str(entry[key_field])] = _convert(entry.get(value_field, ""))
            out[name] = mapping
        elif key in _FORM_LISTS:
            # `Name=` alone is an empty list (botocore's Query form of []).
            items = ([value] if value else []) if isinstance(value, str) else _as_list(value)
            out[_FORM_LISTS[key]] = [_convert(item) for item in items]
        else:
            out[key] = _convert(value)
    return out


def json_result(result: dict[str, Any]) -> bytes:
    return json.dumps(result, separators=(",", ":")).encode("utf-8")


def json_error(error: SqsError) -> tuple[bytes, dict[str, str]]:
    namespace = NAMESPACES.get(error.name, SQS_NAMESPACE)
    name = JSON_NAMES.get(error.name, error.name)
    body = {"__type": f"{namespace}#{name}", "message": error.message}
    return json_result(body), {"x-amzn-query-error": f"{error.code};{error.fault}"}


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    # Carriage returns would be normalised away by XML parsers: keep them.
    return escape(str(value)).replace("\r", "&#xD;")


def _xml(name: str, value: Any, action: str, out: list[str]) -> None:
    if isinstance(value, list):
        member = f"{action}ResultEntry" if name == "Successful" else _XML_LISTS.get(name, name)
        for item in value:
            _xml(member, item, action, out)
    elif isinstance(value, dict) and name in _XML_MAPS:
        element, key_field, value_field = _XML_MAPS[name]
        for key, item in value.items():
            out.append(f"<{element}><{key_field}>{_text(key)}</{key_field}>")
            _xml(value_field, item, action, out)
            out.append(f"</{element}>")
    elif isinstance(value, dict):
        inner: list[str] = []
        for key, item in value.items():
            _xml(key, item, action, inner)
        # Nothing inside (an empty result): an empty element, as SQS writes it.
        out.append(f"<{name}>{''.join(inner)}</{name}>" if inner else f"<{name}/>")
    elif value is not None:
        out.append(f"<{name}>{_text(value)}</{name}>")


def xml_result(action: str, result: dict[str, Any], request_id: str) -> bytes:
    out = [f'<?xml version="1.0"?><{action}Response xmlns="{NAMESPACE}">']
    if action not in _NO_RESULT:
        _xml(f"{action}Result", result, action, out)
    out.append(f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata>")
    out.append(f"</{action}Response>")
    return "".join(out).encode("utf-8")


def xml_error(error: SqsError, request_id: str) -> bytes:
    # SQS's Query protocol has its own words for a queue that does not exist.
    message = NO_QUEUE_QUERY if error.name == "QueueDoesNotExist" else error.message
    return (
        f'<?xml version="1.0"?><ErrorResponse xmlns="{NAMESPACE}"><Error>'
        f"<Type>{error.fault}</Type><Code>{_text(error.code)}</Code>"
        f"<Message>{_text(message)}</Message><Detail/></Error>"
        f"<RequestId>{request_id}</RequestId></ErrorResponse>"
    ).encode()


def _query_json(value: Any, name: str = "") -> Any:
    # The JSON protocol's member names, but a map is its Query list of entries, as
    # SQS writes a Query answer in JSON (`"Attributes": [{"Name": ..., "Value": ...}]`).
    if isinstance(value, list):
        return [_query_json(item) for item in value]
    if isinstance(value, dict) and name in _XML_MAPS:
        _, key_field, value_field = _XML_MAPS[name]
        return [{key_field: key, value_field: _query_json(item)} for key, item in value.items()]
    if isinstance(value, dict):
        return {key: _query_json(item, key) for key, item in value.items() if item is not None}
    return value


def query_json_result(action: str, result: dict[str, Any], request_id: str) -> bytes:
    """A Query answer for a client that accepts JSON: the XML document's shape,
    `{"<Action>Response": {"<Action>Result": ..., "ResponseMetadata": ...}}`."""
    answer: dict[str, Any] = {}
    if action == "ListQueues":
        # As SQS writes this one in JSON: its own member names, every member present.
        answer["ListQueuesResult"] = {
            "NextExclusiveStartQueueName": None, "NextToken": result.get("NextToken"),
            "queueUrls": result.get("QueueUrls"),
        }
    elif action not in _NO_RESULT:
        answer[f"{action}Result"] = _query_json(result)
    answer["ResponseMetadata"] = {"RequestId": request_id}
    return json_result({f"{action}Response": answer})


def query_json_error(error: SqsError, request_id: str) -> bytes:
    message = NO_QUEUE_QUERY if error.name == "QueueDoesNotExist" else error.message
    return json_result({
        "Error": {"Type": error.fault, "Code": error.code, "Message": message, "Detail": None},
        "RequestId": request_id,
    })
