"""Settings, read from the environment once and validated at start."""

from __future__ import annotations

import os
import secrets
from functools import lru_cache
from pathlib import Path

import platformdirs
from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("leaseq"))


class Settings(BaseSettings):
    """Every setting is an environment variable: `LEASEQ_<NAME>` (and `DATABASE_URL`)."""

    model_config = SettingsConfigDict(env_prefix="LEASEQ_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DATABASE_URL", "LEASEQ_DATABASE_URL"),
        description="PostgreSQL to use; unset means an embedded server in data_dir.",
    )
    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port to listen on.")
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Embedded PostgreSQL data and the generated receipt secret live here.",
    )
    secret: SecretStr | None = Field(
        default=None,
        description="HMAC key for receipt handles; generated into data_dir when unset. "
        "Set the same value on every host that serves one database.",
    )
    pool_size: int = Field(default=10, ge=1, le=200, description="Database connections.")
    retention_sweep_seconds: float = Field(
        default=60.0, gt=0, description="How often expired messages are deleted."
    )
    vacuum_check_seconds: float = Field(
        default=10.0, gt=0,
        description="How often a process checks whether the messages table needs the "
        "VACUUM that autovacuum, when it is off, does not run.",
    )
    redrive_scan_seconds: float = Field(
        default=10.0, gt=0,
        description="How often a process looks for redrive tasks whose runner died.",
    )
    redrive_hold_seconds: int = Field(
        default=30, ge=1, le=3600,
        description="How long a redrive task's runner holds it between batches; a crashed "
        "runner's task is taken over after this.",
    )
    max_batch: int = Field(
        default=100, ge=1, le=1000, description="Most entries in one batch request."
    )
    max_request_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, description="Largest accepted request body."
    )
    log_level: str = Field(default="info", description="uvicorn and leaseq log level.")
    telemetry: bool = Field(
        default=False,
        description="FastAPI's OpenTelemetry spans and metrics for every request (they "
        "report to a provider you configure). Off: checking for a provider costs each "
        "request a few percent of the service's CPU.",
    )
    sqs_account_id: str = Field(
        default="000000000000", pattern=r"^[0-9]{12}$",
        description="The account in SQS queue URLs and ARNs.",
    )
    sqs_region: str = Field(
        default="us-east-1", pattern=r"^[a-z0-9-]{1,40}$",
        description="The region in SQS queue ARNs.",
    )
    sqs_credentials: SecretStr | None = Field(
        default=None,
        description="SQS access keys and secrets, `KEY1:secret1,KEY2:secret2`; when set, "
        "SQS requests must carry a valid AWS Signature Version 4 made with one of them.",
    )

    @field_validator("sqs_credentials")
    @classmethod
    def _credential_pairs(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        from app.sqs.sigv4 import parse_credentials

        parse_credentials(value.get_secret_value())
        return value

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not value.startswith(("postgresql://", "postgres://", "postgresql+asyncpg://")):
            raise ValueError("DATABASE_URL must be a postgresql:// URL")
        return value

    def receipt_secret(self) -> bytes:
        """The configured secret, or one generated once and kept in data_dir."""
        if self.secret is not None:
            return self.secret.get_secret_value().encode()
        path = self.data_dir / "receipt-secret"
        try:
            return path.read_bytes().strip()
        except FileNotFoundError:
            pass
        self.data_dir.mkdir(parents=True, exist_ok=True)
        value = secrets.token_hex(32).encode()
        # Written aside, then linked into place: the link fails if another
        # process got there first, and then both use that process's secret.
        tmp = self.data_dir / f".receipt-secret.{secrets.token_hex(4)}"
        tmp.write_bytes(value)
        tmp.chmod(0o600)
        try:
            os.link(tmp, path)
        except FileExistsError:
            value = path.read_bytes().strip()
        finally:
            tmp.unlink()
        return value


@lru_cache
def get_settings() -> Settings:
    return Settings()
