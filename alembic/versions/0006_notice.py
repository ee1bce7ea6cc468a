"""The wake-up notification's text, formatted in one place.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # `queue_id:ready:due_in` on the `leaseq` channel: `ready` messages of the
    # queue are visible now, the next one in `due_in` seconds (empty: none).
    # Every statement that wakes receivers formats it with this function; the
    # service only reads it (app/queue/waiting.py, WaitHub.on_notification).
    op.execute(
        """
        CREATE FUNCTION leaseq_notice(queue_id bigint, ready bigint, due_in double precision)
        RETURNS text
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        AS $$
            SELECT format('%s:%s:%s', queue_id, ready,
                          coalesce(round(CAST(due_in AS numeric), 3)::text, ''))
        $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION leaseq_notice(bigint, bigint, double precision)")
