"""Loads the named statements of queries.sql once, at import."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _parse(source: str) -> dict[str, str]:
    parts = _HEADER.split(source)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


SOURCE: dict[str, str] = _parse(
    resources.files("app.queue").joinpath("queries.sql").read_text(encoding="utf-8")
)


class _Queries:
    """Attribute access to the compiled statements: `Q.claim_messages`."""

    def __init__(self, source: dict[str, str]) -> None:
        self._compiled: dict[str, TextClause] = {name: text(sql) for name, sql in source.items()}

    def __getattr__(self, name: str) -> TextClause:
        try:
            return self._compiled[name]
        except KeyError:
            raise AttributeError(f"no query named {name!r} in queries.sql") from None


Q = _Queries(SOURCE)


def load(package: str) -> _Queries:
    """The named statements of another package's queries.sql."""
    text_ = resources.files(package).joinpath("queries.sql").read_text(encoding="utf-8")
    return _Queries(_parse(text_))


def _positional(sql: str) -> tuple[str, tuple[str, ...]]:
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    # The same rule as SQLAlchemy's text(): `:name` not after a word character,
    # a backslash or another colon (so `::type` casts and `a:b` in comments stay).
    return re.sub(r"(?<![:\w\\]):(\w+)(?!:)", number, sql), tuple(names)


DRIVER: dict[str, tuple[str, tuple[str, ...]]] = {
    name: _positional(sql) for name, sql in SOURCE.items()
}
"""Each statement in asyncpg's `$n` form, with its parameter names in order."""


async def fetch(conn: AsyncConnection, name: str, params: dict[str, Any]) -> list[Any]:
    """Runs a named statement on the driver itself (asyncpg), past SQLAlchemy's
    execution layer: the hot path's statements are plain and their results are
    read by name (`row.id`)."""
    sql, names = DRIVER[name]
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    assert driver is not None
    rows: list[Any] = await driver.fetch(sql, *(params[n] for n in names))
    return [_Row(row) for row in rows]


def first(rows: list[Any]) -> Any:
    return rows[0] if rows else None


class _Row:
    __slots__ = ("_record",)

    def __init__(self, record: Any) -> None:
        self._record = record

    def __getattr__(self, name: str) -> Any:
        return self._record[name]
