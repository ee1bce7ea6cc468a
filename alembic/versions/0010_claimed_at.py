"""When the current claim of a message was made: the lease held time (claim to
acknowledgement) is measured by the database, for the metrics and the lease advice.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Set by every claim, in the row the claim updates anyway; NULL for a
    # message claimed before this migration (its held time is not known).
    op.execute("ALTER TABLE messages ADD COLUMN claimed_at timestamptz")


def downgrade() -> None:
    op.execute("ALTER TABLE messages DROP COLUMN claimed_at")
