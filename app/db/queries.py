"""Named statements: a package's queries.sql, parsed once into Query objects.

A statement is written with `:name` parameters, as a reader expects; the
driver (asyncpg) takes `$1, $2, ...`. Each Query carries both forms and its
parameter names in order, so the connector passes a dict of parameters.

Fragments: what several statements share is written once, as a section
headed `-- fragment: name`, and used on a line of its own as `{{name}}`
(a `,` may follow it); the statement is read with the fragment in its place.

Typed rows: a statement that returns rows says so in its header
(`-- returns: ClaimRow`), naming the TypedDict of its package's rows.py that
lists its columns. The package declares its statements as a `Queries`
subclass with one annotation each (`claim_messages: Query[ClaimRow]`), which
`load` checks against the file; the connector's `fetch` then answers
`list[ClaimRow]`, and mypy sees a misspelt column. A test prepares every
statement on PostgreSQL and compares the columns it answers with its row's
(tests/engine/test_typed_rows.py).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any, Generic, TypeVar

_HEADER = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
_USE = re.compile(r"^([ \t]*)\{\{(\w+)\}\}(,?)[ \t]*$", re.MULTILINE)
_CACHED_PLAN = re.compile(r"^-- plan: cached\b", re.MULTILINE)
_RETURNS = re.compile(r"^-- returns: (\w+)\s*$", re.MULTILINE)

R = TypeVar("R", covariant=True)

# `:name` not after a word character, a backslash or another colon, nor before
# a colon: `::type` casts and `a:b` in comments stay as they are.
_PARAMETER = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")


@dataclass(frozen=True, slots=True)
class Query(Generic[R]):
    """One statement; `R` is the row it returns (None: it returns none)."""

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
    returns: str | None = None
    """The name of its row's TypedDict (`-- returns:`), None when it returns no rows."""
    routed: bool = False
    """Its tables already chosen (app/db/connector.py's Router leaves it as it is)."""

    def renamed(self, text: str) -> Query[R]:
        """This statement with `text` in place of its own (the same parameters,
        the tables chosen): compiled once per text."""
        return _renamed(self, text)


@functools.cache
def _renamed(query: Query[Any], text: str) -> Query[Any]:
    return dataclasses.replace(compile_query(query.name, text), routed=True)


def parse(source: str) -> dict[str, str]:
    """`-- name: x` headed sections of a queries.sql, name -> statement text,
    with the fragments they use in place."""
    parts = _HEADER.split(source)
    # parts = [preamble, kind1, name1, body1, kind2, name2, body2, ...]
    statements: dict[str, str] = {}
    fragments: dict[str, str] = {}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        sections = statements if kind == "name" else fragments
        if name in statements or name in fragments:
            raise ValueError(f"queries.sql: {name!r} is named twice")
        sections[name] = body.strip()
    return {name: _with_fragments(text, fragments) for name, text in statements.items()}


def _with_fragments(text: str, fragments: dict[str, str]) -> str:
    def use(match: re.Match[str]) -> str:
        indent, name, comma = match.groups()
        if name not in fragments:
            raise ValueError(f"queries.sql: no fragment named {name!r}")
        # The fragment's own comments say why it exists; its users need none.
        lines = [line for line in fragments[name].splitlines() if not line.startswith("--")]
        # A fragment may use others (the claims' candidates share one range).
        inner = _with_fragments("\n".join(lines), fragments)
        return "\n".join(indent + line for line in inner.splitlines()) + comma

    return _USE.sub(use, text)


def compile_query(name: str, text: str) -> Query[Any]:
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    returns = _RETURNS.search(text)
    return Query(name=name, text=text, sql=_PARAMETER.sub(number, text), params=tuple(names),
                 cached_plan=_CACHED_PLAN.search(text) is not None,
                 returns=None if returns is None else returns.group(1))


class Queries:
    """A package's statements by attribute (`Q.claim_messages`). A subclass
    declares each one with its row type, for the type checker; `load` holds
    the declarations and the file to each other."""

    def __init__(self, source: dict[str, str]) -> None:
        self.source = source
        self._compiled = {name: compile_query(name, text) for name, text in source.items()}

    def __getattr__(self, name: str) -> Query[Any]:
        try:
            return self._compiled[name]
        except KeyError:
            raise AttributeError(f"no query named {name!r} in queries.sql") from None

    def __iter__(self) -> Iterator[Query[Any]]:
        return iter(self._compiled.values())


Declared = TypeVar("Declared", bound=Queries)


def load(package: str, declared: type[Declared]) -> Declared:
    """The named statements of `package`/queries.sql, as `declared` types them.
    Each statement must be declared, each declaration a statement, and each
    row type the one its header names (or none where it returns no rows)."""
    source = resources.files(package).joinpath("queries.sql").read_text(encoding="utf-8")
    return declare(declared, parse(source), package)


def declare(declared: type[Declared], source: dict[str, str], package: str) -> Declared:
    """`source`'s statements as `declared` types them, checked as `load` says."""
    queries = declared(source)
    hints = typing.get_type_hints(declared, vars(sys.modules[declared.__module__]))
    hints = {name: hint for name, hint in hints.items() if name != "source"}
    if set(hints) != set(queries.source):
        raise TypeError(
            f"{package}: statements without a declaration: "
            f"{sorted(set(queries.source) - set(hints))}; declarations without a "
            f"statement: {sorted(set(hints) - set(queries.source))}"
        )
    for name, hint in hints.items():
        (row,) = typing.get_args(hint)
        declared_row = None if row is type(None) else row.__name__
        header = queries._compiled[name].returns
        if declared_row != header:
            raise TypeError(
                f"{package}.{name}: declared as returning {declared_row}, its header "
                f"says {header}"
            )
    return queries
