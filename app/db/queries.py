"""Named statements: a package's queries.sql, parsed once into Query objects.

A statement is written with `:name` parameters, as a reader expects; the
driver (asyncpg) takes `$1, $2, ...`. Each Query carries both forms and its
parameter names in order, so the connector passes a dict of parameters.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_CACHED_PLAN = re.compile(r"^-- plan: cached\b", re.MULTILINE)

# `:name` not after a word character, a backslash or another colon, nor before
# a colon: `::type` casts and `a:b` in comments stay as they are.
_PARAMETER = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")


@dataclass(frozen=True, slots=True)
class Query:
    name: str
    text: str
    """The statement as written in queries.sql."""
    sql: str
    """The statement in the driver's `$n` form."""
    params: tuple[str, ...]
    """The parameter names, in `$n` order."""
    cached_plan: bool = False
    """Marked `-- plan: cached`: a statement whose plan does not depend on its
    parameters or the table's size (rows found by primary key, an INSERT), run
    on connections that keep PostgreSQL's cached plans (app/db/connector.py)."""


def parse(source: str) -> dict[str, str]:
    """`-- name: x` headed sections of a queries.sql, name -> statement text."""
    parts = _HEADER.split(source)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def compile_query(name: str, text: str) -> Query:
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return Query(name=name, text=text, sql=_PARAMETER.sub(number, text), params=tuple(names),
                 cached_plan=_CACHED_PLAN.search(text) is not None)


class Queries:
    """A package's statements by attribute: `Q.claim_messages`."""

    def __init__(self, source: dict[str, str]) -> None:
        self.source = source
        self._compiled = {name: compile_query(name, text) for name, text in source.items()}

    def __getattr__(self, name: str) -> Query:
        try:
            return self._compiled[name]
        except KeyError:
            raise AttributeError(f"no query named {name!r} in queries.sql") from None

    def __iter__(self) -> Iterator[Query]:
        return iter(self._compiled.values())


def load(package: str) -> Queries:
    """The named statements of `package`/queries.sql."""
    source = resources.files(package).joinpath("queries.sql").read_text(encoding="utf-8")
    return Queries(parse(source))
