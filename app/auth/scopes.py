"""Scopes: an action on the queues whose names match a pattern (`send:orders-*`).

    send     send messages
    receive  receive, change visibility, release, checkpoint, delete messages
    read     list queues, read a queue and its stats, peek, dead-letter sources
    admin    create, change, delete and purge queues, redrive; with the
             pattern `*`, manage API keys. Admin of a queue also grants the
             other three actions on it.

A pattern is a queue name in which `*` stands for any run of characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from app.errors import Forbidden

ACTIONS = ("send", "receive", "read", "admin")
_PATTERN = re.compile(r"^[A-Za-z0-9_*.-]{1,80}$")


class ScopeError(ValueError):
    """A scope that is not `action:pattern`."""


@dataclass(frozen=True)
class Scope:
    action: str
    pattern: str
    _regex: re.Pattern[str] = field(compare=False, repr=False)
    _prefix: str | None = field(default=None, compare=False, repr=False)
    _star: bool = field(default=False, compare=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> Scope:
        action, sep, pattern = text.strip().partition(":")
        if not sep:
            # `admin` alone read as `admin:*` handed out every queue to a key whose
            # maker may have meant one: the pattern is always written out.
            raise ScopeError(
                f"scope {text[:100]!r}: write action:pattern, such as {action or 'read'}:* "
                f"for every queue or {action or 'read'}:orders-* for some"
            )
        if action not in ACTIONS:
            raise ScopeError(
                f"scope {text[:100]!r}: the action must be one of {', '.join(ACTIONS)}"
            )
        if not _PATTERN.fullmatch(pattern):
            raise ScopeError(
                f"scope {text[:100]!r}: the pattern is a queue name in which * matches "
                "any characters"
            )
        regex = re.compile(
            "^" + ".*".join(re.escape(p) for p in pattern.split("*")) + "$", re.DOTALL
        )
        stars = pattern.count("*")
        if stars == 0:
            return cls(action, pattern, regex, pattern, False)
        if stars == 1 and pattern.endswith("*"):
            return cls(action, pattern, regex, pattern[:-1], True)
        return cls(action, pattern, regex)

    def grants(self, action: str, queue: str) -> bool:
        if self.action != action and self.action != "admin":
            return False
        # The common shapes without the regex (every request checks one or more):
        # a name, or a prefix and one star.
        prefix = self._prefix
        if prefix is not None:
            return queue.startswith(prefix) if self._star else queue == prefix
        return self._regex.fullmatch(queue) is not None

    def covers(self, other: Scope) -> bool:
        """Whether this scope grants everything `other` does: its action (or admin),
        on every queue `other`'s pattern can match."""
        if self.action != other.action and self.action != "admin":
            return False
        if self.pattern == "*" or self.pattern == other.pattern:
            return True
        return self._star and self._prefix is not None and other.pattern.startswith(
            self._prefix)

    def __str__(self) -> str:
        return f"{self.action}:{self.pattern}"


def parse_scopes(texts: list[str] | tuple[str, ...]) -> tuple[Scope, ...]:
    scopes = tuple(Scope.parse(t) for t in texts)
    if not scopes:
        raise ScopeError("a key needs at least one scope")
    return scopes


@dataclass(frozen=True)
class Principal:
    """Whoever made a request: an API key, or everyone when no key is required."""

    key_id: str | None
    name: str
    scopes: tuple[Scope, ...]
    rate_per_second: float | None = None

    @property
    def anonymous(self) -> bool:
        return self.key_id is None

    def allows(self, action: str, queue: str) -> bool:
        for scope in self.scopes:
            if scope.grants(action, queue):
                return True
        return False

    def require(self, action: str, queue: str) -> None:
        if not self.allows(action, queue):
            raise Forbidden(f"This key may not {action} on queue {queue[:80]!r}.")

    def require_any(self, action: str) -> None:
        if not self.allows_any(action):
            raise Forbidden(f"This key may not {action} on any queue.")

    def require_covers(self, scopes: tuple[Scope, ...]) -> None:
        """A key may only make keys whose every scope one of its own covers."""
        for wanted in scopes:
            if not any(mine.covers(wanted) for mine in self.scopes):
                raise Forbidden(f"This key may not give the scope {str(wanted)[:100]!r}: "
                                "none of its own covers it.")

    def require_key_admin(self) -> None:
        if not self.manages_keys:
            raise Forbidden("Managing API keys needs the scope admin:*.")

    def allows_any(self, action: str) -> bool:
        """Holds `action` on some queue (listing then shows only those)."""
        return any(s.action in (action, "admin") for s in self.scopes)

    def patterns(self, action: str) -> list[str] | None:
        """The patterns of the queues `action` is granted on (None: every queue),
        for a listing that shows only those."""
        patterns = sorted({s.pattern for s in self.scopes if s.action in (action, "admin")})
        return None if "*" in patterns else patterns

    @property
    def reads_every_queue(self) -> bool:
        return any(s.action in ("read", "admin") and s.pattern == "*" for s in self.scopes)

    @property
    def manages_keys(self) -> bool:
        return any(s.action == "admin" and s.pattern == "*" for s in self.scopes)


EVERYONE = Principal(key_id=None, name="anonymous", scopes=parse_scopes(["admin:*"]))
"""The caller when the service runs open (loopback, no key)."""
