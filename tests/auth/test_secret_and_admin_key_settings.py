"""Settings that would weaken the doors are refused at start, with a message
that names the variable: blank values are unset, a weak LEASEQ_SECRET and a
malformed bootstrap key stop the service before it serves."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from support import TEST_SECRET

from app.config import Settings
from app.credentials import estimated_bits

GOOD_KEY = "LQBOOTSTRAPADMIN0001.admin-secret-0123456789abcdefghij"


@pytest.fixture(autouse=True)
def no_leaseq_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LEASEQ_SECRET", "LEASEQ_ADMIN_KEY", "LEASEQ_ADMIN_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("blank", ["", "   ", "\n"])
def test_blank_settings_are_unset(monkeypatch: pytest.MonkeyPatch, blank: str) -> None:
    monkeypatch.setenv("LEASEQ_SECRET", blank)
    monkeypatch.setenv("LEASEQ_ADMIN_KEY", blank)
    monkeypatch.setenv("LEASEQ_SQS_CREDENTIALS", blank)
    settings = Settings()
    assert settings.secret is None and settings.admin_key is None
    assert settings.bootstrap_admin_key() is None and settings.sqs_credentials is None


@pytest.mark.parametrize("weak", [
    "short", "a" * 100, "correct horse battery staple", "0123456789abcdef" * 3,
    "test-secret-0123456789abcdef", "Passw0rd!Passw0rd!",
])
def test_a_weak_secret_is_refused(weak: str) -> None:
    with pytest.raises(ValidationError, match="at least 32 bytes of entropy"):
        Settings(secret=weak)


@pytest.mark.parametrize("strong", [
    TEST_SECRET,  # openssl rand -hex 32
    "Zq3_x8VbN1-kPf0wYt7uLr2sHc9aJe4dMg6iWo5nBv8",  # secrets.token_urlsafe(32)
])
def test_a_strong_secret_is_taken(strong: str) -> None:
    assert estimated_bits(strong) >= 256
    settings = Settings(secret=strong)
    assert settings.master_secret() == strong.encode()


@pytest.mark.parametrize("bad", [
    "no-dot-at-all", "LQID.short", ".missing-the-id-0123456789", "bad id.0123456789abcdefghijk",
])
def test_a_malformed_admin_key_is_refused(bad: str) -> None:
    with pytest.raises(ValidationError, match="LEASEQ_ADMIN_KEY"):
        Settings(admin_key=bad)


def test_an_admin_key_file_must_hold_a_key(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValidationError, match="is empty"):
        Settings(admin_key_file=empty)
    with pytest.raises(ValidationError, match="cannot be read"):
        Settings(admin_key_file=tmp_path / "missing")
    good = tmp_path / "key"
    good.write_text(GOOD_KEY + "\n")
    assert Settings(admin_key_file=good).bootstrap_admin_key() == GOOD_KEY


AWS_STYLE = "AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize("weak", [
    "any:any", "AKIDONE:secret-one", "AKIDONE:" + "ab" * 20, "AKIDONE:passwordpassword1234",
    "AKIDONE:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "AKIDONE:0123456789abcdef01234",
])
def test_weak_sqs_credentials_are_refused_without_showing_them(weak: str) -> None:
    with pytest.raises(ValidationError, match="LEASEQ_SQS_CREDENTIALS") as info:
        Settings(sqs_credentials=f"{AWS_STYLE},{weak}")
    # What `leaseq serve` prints (the messages, never pydantic's echo of the input).
    shown = " ".join(str(error["msg"]) for error in info.value.errors())
    assert "pair 2" in shown and weak.partition(":")[2] not in shown


@pytest.mark.parametrize("bad_id", ["bad id", "AKID/ONE", "ключ", "x" * 129])
def test_sqs_credentials_need_a_key_id_shape(bad_id: str) -> None:
    with pytest.raises(ValidationError, match=r"LEASEQ_SQS_CREDENTIALS.*key id"):
        Settings(sqs_credentials=f"{bad_id}:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")


def test_strong_sqs_credentials_are_taken() -> None:
    generated = "LQGENERATEDKEY000001:Zq3_x8VbN1-kPf0wYt7uLr2sHc9aJe4dMg6iWo5n"
    settings = Settings(sqs_credentials=f"{AWS_STYLE}, {generated}")
    assert settings.sqs_credentials is not None


def test_a_weak_admin_key_secret_is_refused() -> None:
    with pytest.raises(ValidationError, match="LEASEQ_ADMIN_KEY"):
        Settings(admin_key="LQWEAKADMIN.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
