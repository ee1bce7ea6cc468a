"""Output for the operator's commands (`leaseq queues`, `leaseq top`): tables that fit
the terminal, JSON for scripts, text from the queue shown safely.

rich is imported here, and this module only by those commands: `leaseq --help` and
`leaseq worker` do not pay for it. rich leaves colour out when the output is not a
terminal or NO_COLOR is set.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

# C0 and C1 controls and DEL: a body could move the cursor, clear the screen or
# retitle the window of whoever peeks at it. And Unicode's format characters and
# line separators: bidirectional overrides could reorder what a table shows.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200b-\u200f"
                      r"\u202a-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def safe(text: str, width: int | None = None) -> str:
    """`text` with its control and format characters escaped (\\n, \\x1b,
    \\u202e), cut to `width`."""
    shown = _CONTROL.sub(_escape, text)
    if width is not None and len(shown) > width:
        return shown[: max(width - 1, 0)] + "…"
    return shown


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def console(*, stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *,
          numeric: Iterable[str] = (), whole: Iterable[str] = (),
          title: str | None = None) -> Table:
    """A table of plain values: nothing in them is read as rich markup. `whole`:
    columns never cut short (an id to copy)."""
    right, kept = set(numeric), set(whole)
    shown = Table(box=box.SIMPLE_HEAD, title=None if title is None else Text(title),
                  pad_edge=False, expand=False)
    for name in columns:
        shown.add_column(Text(safe(name)), justify="right" if name in right else "left",
                         overflow="fold" if name in kept else "ellipsis",
                         no_wrap=name not in kept)
    for row in rows:
        shown.add_row(*(value if isinstance(value, Text) else Text(_cell(value))
                        for value in row))
    return shown


def alarming(value: int | None) -> Text | int | None:
    """A count that should be zero (messages in a dead-letter queue): red when it
    is not, on a terminal that shows colour."""
    return Text(_cell(value), style="bold red") if value else value


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return safe(str(value))


def age(seconds: float | None) -> str:
    if not seconds:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def to_json(value: Any) -> str:
    # ASCII: a body's DEL and C1 characters, which JSON leaves as they are, would
    # reach the terminal of whoever reads the output there.
    return json.dumps(_plain(value), indent=2, ensure_ascii=True)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def confirm(question: str, *, yes: bool) -> bool:
    """Asks on the terminal; True at once with `yes`. Without a terminal to ask
    on, and without `yes`, refuses: a script must say --yes."""
    if yes:
        return True
    if not sys.stdin.isatty():
        return False
    # On standard error: with the output piped, the question still shows.
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")
