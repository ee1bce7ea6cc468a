"""API keys: create (the secret is shown once), list, revoke. Needs admin:*."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime

from fastapi import APIRouter, Request, Response, status
from pydantic import BaseModel, Field, field_validator

from app.api.openapi import responses
from app.auth.access import scopes
from app.auth.guard import principal_of
from app.auth.scopes import ScopeError, parse_scopes
from app.auth.store import KeyInfo, KeyStore
from app.errors import InvalidParameter, KeyNotFound

router = APIRouter(prefix="/v1/keys", tags=["keys"])


class KeyCreate(BaseModel):
    model_config = {"extra": "forbid"}

    name: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
    scopes: list[str] = Field(
        min_length=1, max_length=50,
        description="`action:pattern`, action one of send, receive, read, admin; "
        "`*` in the pattern matches any characters (`send:orders-*`).",
    )
    expires_in: int | None = Field(
        default=None, ge=60, le=10 * 365 * 86400, description="Seconds the key lives."
    )
    rate_per_second: float | None = Field(
        default=None, gt=0, le=1_000_000,
        description="Requests a second this key may make per service process.",
    )

    @field_validator("scopes")
    @classmethod
    def _scopes(cls, value: list[str]) -> list[str]:
        try:
            return [str(s) for s in parse_scopes(value)]
        except ScopeError as exc:
            raise ValueError(str(exc)) from None


class KeyOut(BaseModel):
    id: str
    name: str
    scopes: list[str]
    rate_per_second: float | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    @classmethod
    def of(cls, info: KeyInfo) -> KeyOut:
        return cls(**asdict(info))


class KeyCreated(KeyOut):
    secret: str = Field(description="Shown only in this response.")
    token: str = Field(description="`<id>.<secret>`: the bearer token for REST.")


class KeyList(BaseModel):
    keys: list[KeyOut]


def _store(request: Request) -> KeyStore:
    store: KeyStore = request.app.state.keys
    return store


@router.post("", status_code=status.HTTP_201_CREATED,
             responses=responses("validation_error", "database_unavailable"), **scopes("keys"))
async def create_key(body: KeyCreate, request: Request) -> KeyCreated:
    """A new key. Its secret is in this response only; the service keeps its hash."""
    principal_of(request).require_covers(parse_scopes(body.scopes))
    created = await _store(request).create(
        body.name, body.scopes, expires_in=body.expires_in,
        rate_per_second=body.rate_per_second,
    )
    if created is None:  # a fresh random id collided: vanishingly rare
        raise InvalidParameter("Could not allocate a key id; try again.")
    info, secret = created
    return KeyCreated(**KeyOut.of(info).model_dump(), secret=secret,
                      token=f"{info.id}.{secret}")


@router.get("", responses=responses("database_unavailable"), **scopes("keys"))
async def list_keys(request: Request) -> KeyList:
    """Every key, revoked and expired ones too; never a secret."""
    return KeyList(keys=[KeyOut.of(k) for k in await _store(request).list()])


@router.delete("/{key_id}", status_code=status.HTTP_204_NO_CONTENT,
               responses=responses("key_not_found", "database_unavailable"), **scopes("keys"))
async def revoke_key(key_id: str, request: Request) -> Response:
    """Revoke a key: every service process refuses it within a second."""
    if not await _store(request).revoke(key_id):
        raise KeyNotFound(f"No unrevoked key {key_id[:128]!r}.")
    return Response(status_code=status.HTTP_204_NO_CONTENT)
