"""Scopes and tokens, without a database: what a scope grants, how keys are
shaped, sealed and parsed."""

from __future__ import annotations

import pytest

from app.auth import tokens
from app.auth.scopes import EVERYONE, Principal, Scope, ScopeError, parse_scopes
from app.errors import Forbidden


@pytest.mark.parametrize(("scope", "action", "queue", "granted"), [
    ("send:orders-*", "send", "orders-eu", True),
    ("send:orders-*", "send", "orders-", True),
    ("send:orders-*", "send", "order", False),
    ("send:orders-*", "receive", "orders-eu", False),
    ("send:*-dlq", "send", "billing-dlq", True),
    ("send:a*b*c", "send", "axxbyyc", True),
    ("send:a*b*c", "send", "axxbyy", False),
    ("read:jobs", "read", "jobs", True),
    ("read:jobs", "read", "jobs2", False),
    ("read:j.bs", "read", "jobs", False),  # a dot is a dot, not any character
    ("admin:team-*", "send", "team-a", True),  # admin implies the rest on its queues
    ("admin:team-*", "receive", "other", False),
    ("admin:*", "read", "anything", True),
    ("send:*", "send", "a\nb", True),
])
def test_what_a_scope_grants(scope: str, action: str, queue: str, granted: bool) -> None:
    assert Scope.parse(scope).grants(action, queue) is granted


@pytest.mark.parametrize("text", ["write:*", "send:", "send:a/b", "send:a b", "", ":x",
                                  "admin", "read",  # a scope always names its pattern
                                  "send:" + "a" * 81])
def test_malformed_scopes(text: str) -> None:
    with pytest.raises(ScopeError):
        Scope.parse(text)


def test_a_key_needs_a_scope_and_only_admin_star_manages_keys() -> None:
    with pytest.raises(ScopeError):
        parse_scopes([])
    team = Principal("LQX", "team", parse_scopes(["admin:team-*"]))
    assert not team.manages_keys
    with pytest.raises(Forbidden):
        team.require_key_admin()
    assert Principal("LQY", "ops", parse_scopes(["admin:*"])).manages_keys
    assert EVERYONE.anonymous and EVERYONE.allows("admin", "anything")
    reader = Principal("LQZ", "r", parse_scopes(["read:a-*", "send:b"]))
    assert reader.allows_any("read") and not reader.allows_any("receive")
    with pytest.raises(Forbidden, match="receive"):
        reader.require("receive", "a-1")


def test_key_ids_secrets_and_bearer_tokens() -> None:
    key_id, secret = tokens.new_key_id(), tokens.new_secret()
    assert key_id.startswith("LQ") and len(key_id) == 20 and key_id.isalnum()
    assert len(secret) == 40 and "." not in secret
    assert tokens.new_secret() != secret
    assert tokens.split_bearer(f"{key_id}.{secret}") == (key_id, secret)
    for bad in ["", key_id, f"{key_id}.", f".{secret}", f"bad id.{secret}",
                f"{key_id}.{'x' * 300}"]:
        assert tokens.split_bearer(bad) is None


def test_a_sealed_secret_opens_only_with_its_master_and_id() -> None:
    master, other = b"m" * 32, b"o" * 32
    secret = tokens.new_secret()
    digest = tokens.secret_hash(secret)
    sealed = tokens.seal(master, "LQA", secret)
    assert secret.encode() not in sealed
    assert tokens.unseal(master, "LQA", sealed, digest) == secret
    assert tokens.unseal(other, "LQA", sealed, digest) is None
    assert tokens.unseal(master, "LQB", sealed, digest) is None
    # The same secret under two ids seals differently (each pad is used once).
    assert tokens.seal(master, "LQB", secret) != sealed


@pytest.mark.parametrize(("mine", "wanted", "covered"), [
    ("admin:*", "send:anything", True),
    ("admin:*", "admin:*", True),
    ("admin:team-*", "send:team-a", True),
    ("admin:team-*", "read:team-a-*", True),
    ("admin:team-*", "read:*", False),
    ("admin:team-*", "admin:other", False),
    ("send:a", "send:a", True),
    ("send:a", "receive:a", False),
    ("read:*-dlq", "read:x-dlq", False),  # a pattern not a prefix: only itself
    ("read:*-dlq", "read:*-dlq", True),
])
def test_a_key_gives_only_scopes_its_own_cover(mine: str, wanted: str, covered: bool) -> None:
    maker = Principal("LQM", "maker", parse_scopes([mine]))
    assert Scope.parse(mine).covers(Scope.parse(wanted)) is covered
    if covered:
        maker.require_covers((Scope.parse(wanted),))
    else:
        with pytest.raises(Forbidden, match="none of its own covers it"):
            maker.require_covers((Scope.parse(wanted),))
