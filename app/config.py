"""Settings, read from the environment once and validated at start."""

from __future__ import annotations

import ipaddress
import math
import os
import secrets
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import platformdirs
from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.credentials import SECRET_BITS, check_admin_key, estimated_bits, parse_credentials

MAX_MESSAGE_BYTES = 1_048_576  # the largest max_message_bytes (app/queue/limits.py)

PgBouncerMode = Literal["off", "session", "transaction"]
"""LEASEQ_PGBOUNCER: the pool mode of a PgBouncer in front of DATABASE_URL (docs/deploy.md)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("leaseq"))


class Settings(BaseSettings):
    """Every setting is an environment variable: `LEASEQ_<NAME>` (and `DATABASE_URL`)."""

    model_config = SettingsConfigDict(env_prefix="LEASEQ_", extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _blank_is_unset(cls, values: object) -> object:
        # `LEASEQ_ADMIN_KEY=` in a compose file or a unit means "not set": an empty
        # or blank value must never pass for a configured one (an empty secret, an
        # admin key that creates nothing).
        if isinstance(values, dict):
            return {
                k: v for k, v in values.items() if not (isinstance(v, str) and not v.strip())
            }
        return values

    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DATABASE_URL", "LEASEQ_DATABASE_URL"),
        description="PostgreSQL to use; unset means an embedded server in data_dir.",
    )
    listen_url: str | None = Field(
        default=None,
        description="A direct connection to the same database for the LISTEN connection "
        "(a LISTEN needs a server session of its own, which PgBouncer's transaction "
        "pooling does not give); unset: DATABASE_URL.",
    )
    pgbouncer: PgBouncerMode = Field(
        default="off",
        description="The PgBouncer pool mode DATABASE_URL goes through (docs/deploy.md). "
        "`session`: plan_cache_mode is SET after connecting instead of sent as a startup "
        "parameter, which PgBouncer refuses; `transaction`: also no prepared statement "
        "outlives its transaction (asyncpg's and SQLAlchemy's statement caches off).",
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
    pool_wait_seconds: float = Field(
        # A worker beats every third of its lease: with a 30 s lease a beat refused
        # after 5 s still leaves it 15 s for two more tries, and a request that found
        # no connection in 5 s is better answered 503 than left holding its socket.
        default=5.0, gt=0, le=60,
        description="Longest a request waits for a database connection (visibility "
        "changes: for their share of the pool) before answering 503.",
    )
    db_connect_timeout_seconds: float = Field(
        default=5.0, gt=0, le=300,
        description="Longest a connection attempt waits for one database host before "
        "trying the next of DATABASE_URL's hosts (libpq's connect_timeout, per host).",
    )
    db_dead_peer_seconds: float = Field(
        default=10.0, ge=3, le=3600,
        description="A database connection whose server stops answering at the TCP level "
        "(its host vanished) fails after about this long: TCP keepalives and "
        "TCP_USER_TIMEOUT. A slow statement is never cut by it.",
    )
    retention_sweep_seconds: float = Field(
        default=60.0, gt=0, description="How often expired messages are deleted."
    )
    vacuum_check_seconds: float = Field(
        default=10.0, gt=0,
        description="How often a process checks whether the messages table needs the "
        "VACUUM that autovacuum, when it is off, does not run.",
    )
    rotate_after: int = Field(
        default=300_000, ge=0,
        description="Row versions (updated or deleted messages) that no VACUUM may remove "
        "yet (settled while something holds the cleanup horizon) the live generation of "
        "the messages leaves behind before the rotation moves what it still holds into "
        "another and empties it by TRUNCATE, freeing its storage whatever the cleanup "
        "horizon (docs/operations.md); 0: never.",
    )
    horizon_warn_seconds: float = Field(
        default=300.0, gt=0, le=7 * 86400,
        description="A transaction, replication slot or prepared transaction holding "
        "PostgreSQL's cleanup horizon back this long is named in a warning (once a minute "
        "at most, by the process holding the maintenance lock, checking every "
        "LEASEQ_VACUUM_CHECK_SECONDS), in /metrics and by `leaseq doctor`: no VACUUM "
        "removes a dead row version meanwhile.",
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
        default=10, ge=1, le=1000,
        description="Most entries in one REST batch request (SQS's 10 by default).",
    )
    max_request_bytes: int | None = Field(
        default=None, ge=1024,
        description="Largest accepted request body, refused while it is read. Default: "
        "derived from the queue limits, room for a full batch of 1 MiB messages.",
    )
    # A parked long poll costs about 30 KB (2,000 of them added 60 MB of RSS, see
    # docs/performance.md) and a socket. 5,000 keeps a full process near 250 MB,
    # inside the 300 MB budget, and well below the file descriptors a service is
    # usually given; 1,000 per queue lets one queue's clients take a fifth of that.
    max_waiters: int = Field(
        default=5000, ge=1,
        description="Most long polls one process keeps waiting at once; more are "
        "refused with 503 overloaded (a receive with wait=0 never is).",
    )
    max_waiters_per_queue: int = Field(
        default=1000, ge=1,
        description="Most long polls one process keeps waiting on one queue at once.",
    )
    key_waiter_share: float = Field(
        default=0.5, gt=0, le=1,
        description="The share of a process's long-poll seats (LEASEQ_MAX_WAITERS), and of "
        "one queue's (LEASEQ_MAX_WAITERS_PER_QUEUE, less one seat), one API key may hold; "
        "past it, its long polls get 503 overloaded while other keys' do not.",
    )
    key_concurrency: int | None = Field(
        default=None, ge=1,
        description="Requests one API key may have in progress per process (long polls "
        "included); more get 429 rate_limited. Unset: half of LEASEQ_LIMIT_CONCURRENCY.",
    )
    limit_concurrency: int | None = Field(
        default=None, ge=1,
        description="Connections and requests uvicorn takes at once before it answers "
        "503 itself (plain text); unset: max_waiters + 1000, so that long polls meet "
        "leaseq's own 503 overloaded first.",
    )
    header_timeout_seconds: float = Field(
        default=10.0, ge=0.1, le=300,
        description="A connection must send the whole headers of a request within this "
        "long of opening (or of the request's first byte); else it is closed.",
    )
    max_header_bytes: int = Field(
        default=65536, ge=1024, le=1_048_576,
        description="Largest request headers taken (request line included); more is "
        "answered 431 and the connection closed.",
    )
    max_unfinished_headers: int = Field(
        default=100, ge=1,
        description="Most connections per process whose request headers are not whole "
        "yet; one more closes the oldest of them.",
    )
    body_timeout_seconds: float = Field(
        default=30.0, ge=0.5, le=3600,
        description="A request's body must be whole within this long of its headers; "
        "else it is answered 408 and the connection closed.",
    )
    body_min_bytes_per_second: int = Field(
        default=4096, ge=0,
        description="After a grace of 2 seconds (a quarter of LEASEQ_BODY_TIMEOUT_SECONDS "
        "if less), a request's body must arrive at this many bytes a second on average; "
        "else it is answered 408 and the connection closed. 0: no minimum.",
    )
    unproven_body_bytes: int | None = Field(
        default=None, ge=1024,
        description="Most body bytes one process holds at once for SQS requests whose "
        "signature is not checked yet (a request whose body may exceed 64 KiB reserves its "
        "Content-Length before its body is read; one client address holds at most one "
        "full request of it). Unset: two full requests (LEASEQ_MAX_REQUEST_BYTES); never "
        "below one.",
    )
    unproven_body_wait_seconds: float = Field(
        default=2.0, ge=0, le=60,
        description="How long an SQS request may wait for its share of "
        "LEASEQ_UNPROVEN_BODY_BYTES; then it is answered RequestThrottled, its body unread.",
    )
    keep_alive_seconds: int = Field(
        default=5, ge=1, le=3600,
        description="How long an idle HTTP connection is kept open (uvicorn's "
        "default); behind a load balancer, set it above the balancer's idle timeout.",
    )
    shutdown_grace_seconds: int = Field(
        default=10, ge=0, le=3600,
        description="On SIGTERM: how long requests in progress have to finish once the "
        "service stops accepting (parked long polls answer at once).",
    )
    log_level: str = Field(default="info", description="uvicorn and leaseq log level.")
    log_format: Literal["json", "text"] | None = Field(
        default=None,
        description="`json`: one JSON object per line; `text`: plain lines for a "
        "person. Unset: text on a terminal, JSON otherwise (a file, a pipe, a collector).",
    )
    access_log: bool = Field(
        default=True,
        description="One line per request: method, route, queue (SQS: the action), "
        "status, latency and request id. Never a header, a body or a query string.",
    )
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
    public_url: str | None = Field(
        default=None,
        description="The base of the SQS queue URLs clients are told (CreateQueue, "
        "GetQueueUrl, ListQueues), such as https://q.example.com or "
        "https://q.example.com/sqs behind a proxy that strips that path; unset: the "
        "request's scheme and Host header. The service itself still serves at its root.",
    )
    sqs_credentials: SecretStr | None = Field(
        default=None,
        description="SQS access keys and secrets, `KEY1:secret1,KEY2:secret2`; when set, "
        "SQS requests must carry a valid AWS Signature Version 4 made with one of them.",
    )

    allowed_hosts: str | None = Field(
        default=None,
        description="Comma-separated host names the service answers to (the Host header), "
        "against DNS rebinding; `*` for any. Default: the loopback names when bound to a "
        "loopback address, any otherwise.",
    )
    cors_origins: str = Field(
        default="",
        description="Comma-separated web origins whose pages may call the API (CORS). "
        "Empty: no page of another origin may.",
    )
    open_metrics: bool = Field(
        default=False, description="Serve /metrics without an API key even when keys exist."
    )
    open_docs: bool = Field(
        default=False,
        description="Serve /docs and /openapi.json without an API key even when keys exist.",
    )
    admin_key: SecretStr | None = Field(
        default=None,
        description="`<key id>.<secret>`: an admin:* key created on start if its id is not "
        "stored yet (bootstrapping a container).",
    )
    admin_key_file: Path | None = Field(
        default=None, description="A file holding LEASEQ_ADMIN_KEY (a mounted secret)."
    )
    key_rate: float = Field(
        default=0.0, ge=0,
        description="Requests a second each API key may make per process, unless the key "
        "sets its own (bursts of twice that); 0: unlimited.",
    )
    forwarded_allow_ips: str = Field(
        default="127.0.0.1",
        description="Comma-separated addresses (or `*`) of the TLS proxies whose "
        "X-Forwarded-Proto and X-Forwarded-For are believed: a request through them "
        "counts as https (the dashboard's cookie gets Secure) from the client's address.",
    )
    dashboard_session_seconds: float = Field(
        default=43200.0, ge=1, le=31 * 86400,
        description="How long a dashboard sign-in lasts at most, on the database's clock; "
        "signing out, or revoking the key, ends it sooner on every process.",
    )

    @field_validator("secret")
    @classmethod
    def _strong_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        text = value.get_secret_value().strip()
        if estimated_bits(text) < SECRET_BITS:
            raise ValueError(
                "LEASEQ_SECRET is too weak: it needs at least 32 bytes of entropy, such as "
                "64 hex digits (make one: openssl rand -hex 32)"
            )
        return SecretStr(text)

    @field_validator("admin_key")
    @classmethod
    def _admin_key_shape(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            check_admin_key(value.get_secret_value().strip(), "LEASEQ_ADMIN_KEY")
        return value

    @field_validator("admin_key_file")
    @classmethod
    def _admin_key_file_shape(cls, value: Path | None) -> Path | None:
        if value is not None:
            try:
                text = value.read_text().strip()
            except OSError as exc:
                raise ValueError(f"LEASEQ_ADMIN_KEY_FILE cannot be read: {exc}") from None
            if not text:
                raise ValueError(f"LEASEQ_ADMIN_KEY_FILE {value} is empty")
            check_admin_key(text, f"LEASEQ_ADMIN_KEY_FILE {value}")
        return value

    @field_validator("sqs_credentials")
    @classmethod
    def _credential_pairs(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:  # blank is unset (_blank_is_unset)
            return None
        parse_credentials(value.get_secret_value())
        return value

    @field_validator("public_url")
    @classmethod
    def _public_base_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        if any(c.isspace() for c in value):
            raise ValueError("LEASEQ_PUBLIC_URL is not a URL: it has a space in it")
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 -- parsing the port is the check: a bad one raises
        except ValueError as exc:
            raise ValueError(f"LEASEQ_PUBLIC_URL is not a URL: {exc}") from None
        # Queue URLs are this base, then /{account}/{queue}: a query, a fragment or
        # credentials in it would end up in the middle of every queue URL.
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("LEASEQ_PUBLIC_URL must be an http:// or https:// URL with a host")
        if parts.query or parts.fragment or "?" in value or "#" in value:
            raise ValueError("LEASEQ_PUBLIC_URL may not have a query or a fragment")
        if parts.username is not None or parts.password is not None:
            raise ValueError("LEASEQ_PUBLIC_URL may not carry credentials")
        return value.rstrip("/")

    @field_validator("database_url", "listen_url")
    @classmethod
    def _postgres_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if not value.startswith(("postgresql://", "postgres://", "postgresql+asyncpg://")):
            name = "DATABASE_URL" if info.field_name == "database_url" else "LEASEQ_LISTEN_URL"
            raise ValueError(f"{name} must be a postgresql:// URL")
        return value

    @model_validator(mode="after")
    def _transaction_pooling_listens_directly(self) -> Settings:
        # Through transaction pooling a LISTEN stays on whichever server
        # connection ran it, and the notifications go nowhere, silently.
        if self.pgbouncer == "transaction" and self.listen_url is None:
            raise ValueError(
                "LEASEQ_PGBOUNCER=transaction needs LEASEQ_LISTEN_URL: a direct "
                "connection for LISTEN, which transaction pooling cannot carry"
            )
        return self

    def request_limit(self) -> int:
        """The largest request body: a full batch of the largest messages, plus
        room for their JSON (names, attributes, escaping)."""
        if self.max_request_bytes is not None:
            return self.max_request_bytes
        return self.max_batch * MAX_MESSAGE_BYTES + 64 * 1024

    def unproven_body_limit(self) -> int:
        """LEASEQ_UNPROVEN_BODY_BYTES, never below one full request: a legitimate
        full batch must always be able to prove itself. Unset, two: one client
        address holds at most one, so a full batch from anyone else still fits
        beside a caller holding its share."""
        if self.unproven_body_bytes is None:
            return 2 * self.request_limit()
        return max(self.unproven_body_bytes, self.request_limit())

    def connection_limit(self) -> int:
        """uvicorn's limit_concurrency: connections and requests at once per process."""
        return self.limit_concurrency or self.max_waiters + 1000

    def unfinished_headers_limit(self) -> int:
        """LEASEQ_MAX_UNFINISHED_HEADERS, never above half of uvicorn's connection limit
        (slow connections must leave room for whole requests)."""
        return min(self.max_unfinished_headers, max(1, self.connection_limit() // 2))

    def waiters_per_key(self) -> int:
        return max(1, math.ceil(self.max_waiters * self.key_waiter_share))

    def waiters_per_key_on_a_queue(self) -> int:
        """A key's share of one queue's long-poll seats: LEASEQ_KEY_WAITER_SHARE of
        LEASEQ_MAX_WAITERS_PER_QUEUE, at least 1, and below that cap whenever it is
        above 1, so that no key fills a queue it shares, even at a share of 1.0."""
        cap = self.max_waiters_per_queue
        return max(1, min(math.ceil(cap * self.key_waiter_share), cap - 1))

    def requests_per_key(self) -> int:
        return self.key_concurrency or max(1, self.connection_limit() // 2)

    def is_loopback(self) -> bool:
        return is_loopback(self.host)

    def host_allow_list(self) -> list[str] | None:
        """The Host names to answer to; None: any."""
        if self.allowed_hosts is not None:
            names = [h.strip() for h in self.allowed_hosts.split(",") if h.strip()]
            return None if "*" in names else names
        if self.is_loopback():
            # *.localhost names resolve to loopback only (RFC 6761), as SQS
            # clients build them (sqs.us-east-1.localhost): no rebinding risk.
            return ["localhost", "*.localhost", "127.0.0.1", "[::1]"]
        return None

    def origins(self) -> list[str]:
        return [o.strip() for o in self.cors_origins.split(",") if o.strip()]

    def bootstrap_admin_key(self) -> str | None:
        """LEASEQ_ADMIN_KEY (or its file), checked for shape when settings were read."""
        if self.admin_key is not None:
            return self.admin_key.get_secret_value().strip()
        if self.admin_key_file is not None:
            return check_admin_key(self.admin_key_file.read_text().strip(),
                                   f"LEASEQ_ADMIN_KEY_FILE {self.admin_key_file}")
        return None

    def master_secret(self) -> bytes:
        """The master secret (LEASEQ_SECRET): it seals the SigV4 secrets of API keys
        and verifies version-1 receipt handles. Generated once into
        data_dir/receipt-secret (its name from before keys rotated) when unset."""
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
        # Created 0600 before a byte is in it: no moment where others may read it.
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            with open(fd, "wb") as file:
                file.write(value)
            os.link(tmp, path)
        except FileExistsError:
            value = path.read_bytes().strip()
        finally:
            tmp.unlink()
        return value
