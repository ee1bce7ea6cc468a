"""What each operation may touch: the declarations both doors authorize by.

Every REST route and every SQS action declares, as data beside its handler,
each queue it touches and the scope action it needs there: a list of
`action:target` strings (`send:queue`, `send:dead_letter_queue`, ...). A REST
route carries them in its decorator (`**scopes(...)`, which also puts them in
the OpenAPI document as `x-leaseq-scopes`); an SQS action in `NEEDS`
(app/sqs/actions.py).

Targets:
    queue             the queue the path or QueueUrl (or CreateQueue's name) names
    name              the queue named in the body (REST create)
    dead_letter_queue the dead-letter queue a redrive policy being set names
    redrive_targets   where a redrive writes: its destination, or the queues its
                      messages return to
    task              the dead-letter queue of a stored redrive task
    listed            the queues a list shows: the key needs the action on some
                      queue, and sees only those it has it on
Two declarations stand alone: `keys` (key management: admin:*), and `any`
(any valid key: the API description, the dashboard's session).

The doors check a declaration in two places: what the request line tells
(`queue`, `listed`, `keys`, `any`) before any handler runs, the rest where the
handler has read it, through `require`, which refuses to check a target the
operation did not declare. A route or action without a declaration is
refused to every key (default deny).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.auth.scopes import ACTIONS, Principal
from app.errors import Forbidden

TARGETS = ("queue", "name", "dead_letter_queue", "redrive_targets", "task", "listed")
OPENAPI_KEY = "x-leaseq-scopes"


class Undeclared(RuntimeError):
    """A handler checked a target its operation does not declare: the declaration
    and the code disagree (a bug, never a client's fault)."""


@dataclass(frozen=True)
class Needs:
    """One operation's declaration: (action, target) pairs, or `keys` / `any`."""

    pairs: tuple[tuple[str, str], ...]
    keys: bool = False
    any_key: bool = False

    @classmethod
    def parse(cls, texts: Iterable[str]) -> Needs:
        texts = tuple(texts)
        if texts == ("keys",):
            return cls((), keys=True)
        if texts == ("any",):
            return cls((), any_key=True)
        pairs = []
        for text in texts:
            action, _, target = text.partition(":")
            if action not in ACTIONS or target not in TARGETS:
                raise ValueError(f"not a declaration: {text!r} (action:target, keys or any)")
            pairs.append((action, target))
        if not pairs:
            raise ValueError("an operation declares at least one scope")
        return cls(tuple(pairs))

    def on(self, target: str) -> str | None:
        """The action needed on `target`, or None if the operation does not touch one."""
        for action, declared in self.pairs:
            if declared == target:
                return action
        return None

    def texts(self) -> list[str]:
        if self.keys:
            return ["keys"]
        if self.any_key:
            return ["any"]
        return [f"{action}:{target}" for action, target in self.pairs]

    def check_request_line(self, principal: Principal, named: str | None) -> None:
        """What can be checked before the handler runs: the named queue, a list's
        action on some queue, key management. The anonymous caller of an open
        service holds admin:* and passes."""
        if self.any_key:
            return
        if self.keys:
            principal.require_key_admin()
            return
        action = self.on("queue")
        if action is not None and named is not None:
            principal.require(action, named)
        listed = self.on("listed")
        if listed is not None:
            principal.require_any(listed)

    def require(self, principal: Principal, target: str, queues: Iterable[str]) -> None:
        """Forbidden unless the key has the declared action on every one of
        `queues`; Undeclared if this operation does not touch `target`."""
        action = self.on(target)
        if action is None:
            raise Undeclared(f"the operation does not declare {target!r}: {self.texts()}")
        for queue in sorted(set(queues)):
            principal.require(action, queue)

    def require_unnamed(self, principal: Principal, target: str, queues: Iterable[str]) -> None:
        """`require`, of queues the caller did not name (a redrive back to the
        sources of its messages): a refusal names only a queue the key may read."""
        action = self.on(target)
        if action is None:
            raise Undeclared(f"the operation does not declare {target!r}: {self.texts()}")
        refused = [q for q in sorted(set(queues)) if not principal.allows(action, q)]
        for queue in refused:
            if principal.allows("read", queue):
                principal.require(action, queue)
        if refused:
            raise Forbidden(
                f"This key may not {action} on {len(refused)} of the queues this request "
                f"reaches, which it may not read."
            )


def dead_letter_queues(changes: Mapping[str, Any]) -> list[str]:
    """The queue a redrive policy being set sends exhausted messages to, if any."""
    dead_letter_queue = changes.get("dead_letter_queue")
    return [dead_letter_queue] if dead_letter_queue else []


def scopes(*texts: str) -> dict[str, Any]:
    """A REST route's declaration, for its decorator: `@router.get(..., **scopes(
    "read:queue"))`. Kept with the route and published in its OpenAPI operation."""
    Needs.parse(texts)  # a malformed declaration fails at import, not per request
    return {"openapi_extra": {OPENAPI_KEY: list(texts)}}


def needs_of_route(route: Any) -> Needs | None:
    """A route's declaration (None: it has none)."""
    extra = getattr(route, "openapi_extra", None) or {}
    texts = extra.get(OPENAPI_KEY)
    return None if texts is None else _parsed(tuple(texts))


@functools.cache
def _parsed(texts: tuple[str, ...]) -> Needs:
    # The routes' declarations are a few dozen tuples of strings: each is parsed
    # once, not on every request that checks one.
    return Needs.parse(texts)


def needs_of_request(scope: Any) -> Needs:
    """The declaration of the route serving this request."""
    needs = needs_of_route(scope.get("route"))
    if needs is None:
        raise Undeclared(f"{scope.get('method')} {scope.get('path')} has no declaration")
    return needs
