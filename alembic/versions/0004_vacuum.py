"""Autovacuum settings for the messages table.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A queue table turns over: every message is inserted, updated at least
    # once per receive and per heartbeat, and deleted, while few rows are live.
    # None of those updates is HOT (each moves visible_at, which the claim index
    # holds), so every one leaves a dead heap tuple and dead index entries.
    # The default thresholds scale with the live row count, which says little
    # here: vacuum as soon as a few thousand tuples are dead, unthrottled, and
    # keep the statistics fresh for the claim's plan. (Fillfactor is left at
    # 100: it only pays for HOT updates, which this table never has.)
    op.execute(
        """
        ALTER TABLE messages SET (
            autovacuum_vacuum_scale_factor = 0.01,
            autovacuum_vacuum_threshold = 2000,
            autovacuum_vacuum_insert_scale_factor = 0.05,
            autovacuum_analyze_scale_factor = 0.05,
            autovacuum_vacuum_cost_delay = 0
        )
        """
    )


def downgrade() -> None:
    op.execute(
        """
        ALTER TABLE messages RESET (
            autovacuum_vacuum_scale_factor,
            autovacuum_vacuum_threshold,
            autovacuum_vacuum_insert_scale_factor,
            autovacuum_analyze_scale_factor,
            autovacuum_vacuum_cost_delay
        )
        """
    )
