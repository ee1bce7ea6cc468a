"""API keys, and the keys that sign receipt handles.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The secret itself is never stored: its SHA-256 answers a bearer check,
    # and `sealed_secret` (see app/auth/tokens.py) opens only with the
    # service's master secret, for SigV4.
    op.execute(
        """
        CREATE TABLE api_keys (
            id              text PRIMARY KEY,
            name            text NOT NULL,
            secret_hash     bytea NOT NULL,
            sealed_secret   bytea NOT NULL,
            scopes          text[] NOT NULL,
            rate_per_second double precision,
            created_at      timestamptz NOT NULL DEFAULT now(),
            expires_at      timestamptz,
            revoked_at      timestamptz,
            last_used_at    timestamptz
        )
        """
    )
    # Receipt handles name the key that signed them (a small number), so keys
    # can rotate: the newest unretired key signs, every unretired key verifies.
    op.execute(
        """
        CREATE TABLE receipt_keys (
            id         integer PRIMARY KEY CHECK (id BETWEEN 1 AND 65535),
            secret     bytea NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            retired_at timestamptz
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE receipt_keys")
    op.execute("DROP TABLE api_keys")
