"""leaseq's objects move into a schema of their own, `leaseq`.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Everything the migrations before this one created, by kind. A database
# migrated from empty since alembic/env.py set its search_path already has them
# in `leaseq`; one that reached 0010 before has them in `public`, and only then
# are they moved (an application's own `public.queues` is never touched).
_TABLES = (
    "queues", "messages", "redrive_tasks", "api_keys", "receipt_keys",
    "message_groups", "message_deduplication", "receive_attempts",
)
_SEQUENCES = ("fencing_tokens", "message_sequence")
_NOTICE = "leaseq_notice(bigint, bigint, double precision)"


def _move(source: str, target: str) -> str:
    tables = ", ".join(f"'{t}'" for t in _TABLES)
    sequences = ", ".join(f"'{s}'" for s in _SEQUENCES)
    return f"""
    DO $$
    DECLARE
        name text;
    BEGIN
        FOREACH name IN ARRAY ARRAY[{tables}] LOOP
            IF to_regclass('{target}.' || name) IS NULL
               AND to_regclass('{source}.' || name) IS NOT NULL THEN
                EXECUTE format('ALTER TABLE {source}.%I SET SCHEMA {target}', name);
            END IF;
        END LOOP;
        FOREACH name IN ARRAY ARRAY[{sequences}] LOOP
            IF to_regclass('{target}.' || name) IS NULL
               AND to_regclass('{source}.' || name) IS NOT NULL THEN
                EXECUTE format('ALTER SEQUENCE {source}.%I SET SCHEMA {target}', name);
            END IF;
        END LOOP;
        IF to_regtype('{target}.redrive_status') IS NULL
           AND to_regtype('{source}.redrive_status') IS NOT NULL THEN
            ALTER TYPE {source}.redrive_status SET SCHEMA {target};
        END IF;
    END
    $$
    """


def upgrade() -> None:
    # alembic/env.py has made the schema already; this is for `alembic upgrade --sql`.
    op.execute(
        "DO $$ BEGIN IF to_regnamespace('leaseq') IS NULL THEN CREATE SCHEMA leaseq; "
        "END IF; END $$"
    )
    op.execute(_move("public", "leaseq"))
    # The notice's format function keeps its job under a name the schema now says.
    op.execute(
        f"""
        DO $$
        BEGIN
            IF to_regprocedure('public.{_NOTICE}') IS NOT NULL THEN
                ALTER FUNCTION public.{_NOTICE} SET SCHEMA leaseq;
            END IF;
        END
        $$
        """
    )
    op.execute(f"ALTER FUNCTION leaseq.{_NOTICE} RENAME TO notice")


def downgrade() -> None:
    op.execute("ALTER FUNCTION leaseq.notice(bigint, bigint, double precision) "
               "RENAME TO leaseq_notice")
    op.execute(f"ALTER FUNCTION leaseq.{_NOTICE} SET SCHEMA public")
    op.execute(_move("leaseq", "public"))
