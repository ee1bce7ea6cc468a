"""The operator commands' output helpers (clients/python/leaseq/terminal.py): what a
message or a server carries is shown, never obeyed by the terminal."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from leaseq.terminal import safe, table, to_json

pytestmark = pytest.mark.unit


def test_control_and_format_characters_are_escaped() -> None:
    assert safe("a\nb\tc\rd") == "a\\nb\\tc\\rd"
    assert safe("\x1b[2J\x07") == "\\x1b[2J\\x07"
    assert safe("\x7f\x9b31m") == "\\x7f\\x9b31m"
    assert safe("abc\u202edcba\u2066x\u2028") == "abc\\u202edcba\\u2066x\\u2028"
    assert safe("plain ünïcode ✓") == "plain ünïcode ✓"


def test_text_is_cut_to_the_width_given() -> None:
    assert safe("x" * 50, 10) == "x" * 9 + "…"
    assert safe("\n" * 10, 5) == "\\n\\n…"
    assert safe("short", 10) == "short"


def test_tables_read_no_markup_and_json_stays_ascii() -> None:
    out = io.StringIO()
    Console(file=out, width=120, force_terminal=False).print(
        table(["name", "body"], [("[bold red]q[/]", "[link=http://x]y[/link]")]))
    assert "[bold red]q[/]" in out.getvalue() and "[link=http://x]y[/link]" in out.getvalue()
    text = to_json({"body": "\x9b2J\u202e"})
    assert text.isascii() and json.loads(text) == {"body": "\x9b2J\u202e"}
