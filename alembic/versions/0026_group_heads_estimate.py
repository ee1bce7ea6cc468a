"""The planner reads a FIFO group's newest head from the top of its index.

A claim reads each group's last head seen (`group_heads_newest`, newest first,
LIMIT 1). The table holds about one live head a group (a claim deletes the one
it read once it learns the next), so PostgreSQL estimates one row a group and
reads them by a bitmap, which visits every index entry of the group: under a
held cleanup horizon, every head the group ever had (measured: 400 entries and
240 buffers a group after two minutes of the FIFO bench, where the index from
its top reads one). Told that a group has many heads (`n_distinct = 1` on
`group_id`: the physical truth whenever the horizon is held), it reads the
index from the top and stops at the first. A catalog change: SHARE UPDATE
EXCLUSIVE on the table, which sends and claims do not take and a pg_dump's
ACCESS SHARE does not conflict with.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE leaseq.group_heads ALTER COLUMN group_id SET (n_distinct = 1)")
    op.execute("ANALYZE leaseq.group_heads")


def downgrade() -> None:
    op.execute("ALTER TABLE leaseq.group_heads ALTER COLUMN group_id RESET (n_distinct)")
    op.execute("ANALYZE leaseq.group_heads")
