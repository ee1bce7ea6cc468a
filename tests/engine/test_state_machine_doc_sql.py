"""docs/state-machine.md quotes the SQL of each transition: every line it quotes
(all but the elided ones, with `...`) stands in the query it names in
app/queue/queries.sql, so the document cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

from app.queue.sql import Q

SOURCE = Q.source

DOC = Path(__file__).resolve().parents[2] / "docs" / "state-machine.md"
_BLOCK = re.compile(r"```sql\n(.*?)```", re.DOTALL)


def _normal(text: str) -> str:
    # Without any whitespace: the document may wrap a line where the query does not.
    return "".join(text.split())


def quoted_blocks() -> list[tuple[str, str]]:
    """(the query named last before each block, the block)."""
    text = DOC.read_text()
    found = []
    for match in _BLOCK.finditer(text):
        before = text[: match.start()]
        names = [n for n in re.findall(r"`(\w+)`", before) if n in SOURCE]
        assert names, f"no query named before the block at {match.start()}"
        found.append((names[-1], match.group(1)))
    return found


def test_every_quoted_line_is_in_the_query_it_names() -> None:
    blocks = quoted_blocks()
    assert len(blocks) >= 7
    for name, block in blocks:
        query = _normal(SOURCE[name])
        for line in block.splitlines():
            if not line.strip() or "..." in line:
                continue
            assert _normal(line) in query, f"{name}: {line.strip()!r} is not in queries.sql"
