"""Typed message attributes (SQS's) stored beside the flat ones (REST's).

A message row keeps `attributes`, the flat {name: string} the REST API shows:
every attribute whose value is a string (data type String or Number, custom
suffixes included). `attribute_types` keeps only what that cannot say: the data
type of every attribute that is not a plain "String", and the value of Binary
ones (base64). A REST-sent message has no `attribute_types`: its attributes
are all Strings. Binary attributes do not appear in the REST API at all.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from app.queue.models import MessageAttribute


def split(typed: dict[str, MessageAttribute]) -> tuple[dict[str, str], str | None]:
    """(the flat string attributes, the `attribute_types` JSON or None)."""
    flat: dict[str, str] = {}
    types: dict[str, dict[str, str]] = {}
    for name, attribute in typed.items():
        if attribute.binary_value is not None:
            types[name] = {
                "DataType": attribute.data_type,
                "BinaryValue": base64.b64encode(attribute.binary_value).decode("ascii"),
            }
            continue
        flat[name] = attribute.string_value or ""
        if attribute.data_type != "String":
            types[name] = {"DataType": attribute.data_type}
    return flat, json.dumps(types) if types else None


def join(flat: dict[str, str], types: dict[str, Any] | None) -> dict[str, MessageAttribute]:
    """Every attribute of a stored message, typed."""
    types = types or {}
    typed: dict[str, MessageAttribute] = {}
    for name, value in flat.items():
        data_type = types.get(name, {}).get("DataType", "String")
        typed[name] = MessageAttribute(data_type=data_type, string_value=value)
    for name, entry in types.items():
        if "BinaryValue" in entry:
            typed[name] = MessageAttribute(
                data_type=entry["DataType"], binary_value=base64.b64decode(entry["BinaryValue"])
            )
    return typed


def size(name: str, attribute: MessageAttribute) -> int:
    """Bytes one typed attribute counts against max_message_bytes: its name, its
    data type and its value, as SQS counts them."""
    value = (
        attribute.binary_value
        if attribute.binary_value is not None
        else (attribute.string_value or "").encode("utf-8")
    )
    return len(name.encode("utf-8")) + len(attribute.data_type.encode("utf-8")) + len(value)
