"""The dashboard's sign-ins, kept by the service.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06

The dashboard's cookie held the API key itself, and signing out only asked the
browser to forget it: a copy kept working. The cookie now names a row here
(app/auth/sessions.py), which signing out deletes. The row keeps only the
SHA-256 of the session's random id, and the cookie is signed under the master
secret, so a copy of this table signs no one in. The table is the service's
alone: the SQL API's role (0018) is granted nothing on it.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # No foreign key to api_keys: a key of LEASEQ_SQS_CREDENTIALS signs in too,
    # and the key is checked on every request anyway (revoked, expired, gone).
    op.execute(
        """
        CREATE TABLE leaseq.dashboard_sessions (
            id_hash    bytea PRIMARY KEY,
            key_id     text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            expires_at timestamptz NOT NULL
        )
        """
    )
    # Expired rows are deleted at each sign-in, found by this index.
    op.execute(
        "CREATE INDEX dashboard_sessions_expires_at ON leaseq.dashboard_sessions (expires_at)"
    )
    # A key's sessions, newest first: a sign-in ends those beyond the cap.
    op.execute(
        "CREATE INDEX dashboard_sessions_key_id ON leaseq.dashboard_sessions "
        "(key_id, created_at)"
    )


def downgrade() -> None:
    op.execute("DROP TABLE leaseq.dashboard_sessions")
