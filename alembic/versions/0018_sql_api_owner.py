"""The SQL API's SECURITY DEFINER functions run as a role of their own, never a
superuser.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06

`leaseq.send`, `send_batch`, `delete` and `change_visibility` run with their
owner's rights, and their owner was whoever ran the migrations: a superuser in
the embedded setup, the compose file and many a first install, so every call ran
as one. A flaw in a function body (or in a PostgreSQL function it calls) would
then be a superuser's. They now belong to `leaseq_sql_api_<12 hex digits of the
md5 of the database's name>`: NOLOGIN, no superuser, no attribute, holding only
what the four functions and their helpers touch. The role is per database
because roles belong to the server and SET ROLE works in every database: one
role shared by two databases would carry both databases' table grants, so
whoever is a member of it through one (the owner that created it, without being
a superuser) could use it on the other. docs/decisions.md says more.

Made only when the migrating role may make roles (a superuser, or CREATEROLE);
otherwise the functions stay the migrating owner's, which is no superuser, as
before. Two migrations of two databases never make the same role; the same
database's replicas take turns on the migration lock; a CREATE ROLE that lost a
race all the same is taken as done. CREATE OR REPLACE, which later migrations
use (app/db/function_edits.py), keeps the owner; a migration that drops and
creates one of these functions again must give it back to this role
(`leaseq doctor` says when a superuser owns one).
"""

from collections.abc import Sequence

from sqlalchemy import text

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DEFINERS = (
    "leaseq.send(text, text, jsonb, integer, text, text)",
    "leaseq.send_batch(text, text[], jsonb[], integer[], text[], text[])",
    "leaseq.delete(text, text)",
    "leaseq.change_visibility(text, text, integer)",
)

# What the functions do as their owner, and nothing more. The helpers run as the
# caller of them, here the owner: EXECUTE on each (PUBLIC has none).
_GRANTS = (
    "GRANT USAGE ON SCHEMA leaseq TO {role}",
    # queue_for reads the queue, allowed the grants, open_receipt a key's blocks,
    # announce the watches; make_fair marks a queue fair.
    "GRANT SELECT ON leaseq.queues, leaseq.grants, leaseq.receipt_keys, leaseq.watches "
    "TO {role}",
    "GRANT UPDATE (fair, updated_at) ON leaseq.queues TO {role}",
    # Sends insert, delete deletes, change_visibility moves the lease, make_fair
    # names the tenant '' of a queue's messages that named none.
    "GRANT SELECT, INSERT, DELETE ON leaseq.messages TO {role}",
    "GRANT UPDATE (visible_at, leased, tenant) ON leaseq.messages TO {role}",
    # A FIFO send's group and deduplication id; a settle frees the group.
    "GRANT SELECT, INSERT ON leaseq.message_groups, leaseq.message_deduplication TO {role}",
    "GRANT UPDATE (visible_at, version) ON leaseq.message_groups TO {role}",
    "GRANT UPDATE (message_id, sequence_number, expires_at) "
    "ON leaseq.message_deduplication TO {role}",
    "GRANT USAGE ON SEQUENCE leaseq.message_sequence TO {role}",
    "GRANT EXECUTE ON FUNCTION leaseq.allowed(text, text), leaseq.queue_for(text, text), "
    "leaseq.open_receipt(bigint, text), "
    "leaseq.check_message(leaseq.queues, integer, text, jsonb, integer, text, text), "
    "leaseq.send_fifo(leaseq.queues, text, jsonb, text, text), "
    "leaseq.notice(bigint, bigint, double precision), leaseq.announce(text, text), "
    "leaseq.make_fair(bigint) TO {role}",
)

_ROLE = "SELECT 'leaseq_sql_api_' || left(md5(current_database()), 12)"


def _may_make_roles() -> tuple[bool, bool]:
    """(whether the migrating role may make roles, whether it is a superuser)."""
    row = op.get_bind().exec_driver_sql(
        "SELECT rolsuper, rolcreaterole FROM pg_catalog.pg_roles "
        "WHERE rolname = current_user").one()
    return bool(row[0] or row[1]), bool(row[0])


# What a role of that name holds beyond what the migration gives it. Its name
# is predictable, so anyone able to make roles could have made it first: every
# member of it could then SET ROLE to the functions' owner and read every message
# and receipt key past leaseq.grants. Adopted it is (a CREATE ROLE that lost a
# race) only bare: NOLOGIN, no attribute, no member but the migrating role (a
# CREATEROLE role is made an admin of the roles it makes, and is granted this one
# below; it owns the schema anyway), a member of none, and no privilege or
# object in any database of the server (pg_shdepend covers them all, databases
# and tablespaces too).
_BEYOND = """
    SELECT rolsuper OR rolcanlogin OR rolcreaterole OR rolcreatedb OR rolbypassrls
               OR rolreplication AS attributes,
           ARRAY(SELECT m.rolname FROM pg_catalog.pg_auth_members AS a
                 JOIN pg_catalog.pg_roles AS m ON m.oid = a.member
                 WHERE a.roleid = r.oid AND m.rolname <> current_user
                 ORDER BY 1) AS members,
           ARRAY(SELECT g.rolname FROM pg_catalog.pg_auth_members AS a
                 JOIN pg_catalog.pg_roles AS g ON g.oid = a.roleid
                 WHERE a.member = r.oid ORDER BY 1) AS member_of,
           ARRAY(SELECT DISTINCT coalesce(d.datname, 'the server (a database or tablespace)')
                 FROM pg_catalog.pg_shdepend AS s
                 LEFT JOIN pg_catalog.pg_database AS d ON d.oid = s.dbid
                 WHERE s.refclassid = 'pg_catalog.pg_authid'::regclass
                   AND s.refobjid = r.oid ORDER BY 1) AS holds_in
    FROM pg_catalog.pg_roles AS r WHERE r.rolname = :role
"""


def _refuse_unless_bare(role: str) -> None:
    row = op.get_bind().execute(text(_BEYOND), {"role": role}).one()
    found = []
    if row.attributes:
        found.append("may log in or holds an attribute (SUPERUSER, CREATEROLE, ...)")
    if row.members:
        found.append(f"has members ({', '.join(row.members)})")
    if row.member_of:
        found.append(f"is a member of {', '.join(row.member_of)}")
    if row.holds_in:
        found.append(f"holds privileges or owns objects in {', '.join(row.holds_in)}")
    if found:
        raise RuntimeError(
            f"role {role} exists already and {'; '.join(found)}. The SQL API's functions "
            f"would run as it, so whoever may act as it could read every queue past "
            f"leaseq.grants. leaseq adopts such a role only as it makes it (NOLOGIN, no "
            f"attribute, no member, nothing held): check who made it, then drop it (in "
            f"each database named: REASSIGN OWNED BY \"{role}\" TO <owner>; DROP OWNED "
            f"BY \"{role}\"; then DROP ROLE \"{role}\") or revoke what it has, and "
            f"migrate again (docs/security.md, \"The SQL API\")")


def upgrade() -> None:
    may, superuser = _may_make_roles()
    if not may:
        return  # the migrating owner keeps them: no superuser, as `may` says
    bind = op.get_bind()
    role = bind.exec_driver_sql(_ROLE).scalar_one()
    # Replicas of another database cannot race on this name (it is this
    # database's); a lost race on pg_authid's unique index is taken as done too.
    op.execute(f"""
        DO $$
        BEGIN
            CREATE ROLE "{role}" NOLOGIN NOSUPERUSER NOINHERIT NOCREATEDB NOCREATEROLE
                NOREPLICATION NOBYPASSRLS;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END
        $$
    """)
    _refuse_unless_bare(role)
    op.execute(bind.execute(text(
        "SELECT format('COMMENT ON ROLE %I IS %L', CAST(:role AS text), "
        "'owns the leaseq SQL API functions (SECURITY DEFINER) of database ' "
        "|| current_database())"), {"role": role}).scalar_one())
    for grant in _GRANTS:
        op.execute(grant.format(role=f'"{role}"'))
    if not superuser:
        # A CREATEROLE owner gives a function away only to a role it may SET ROLE
        # to, and that holds CREATE on the schema for the moment it is given.
        op.execute(f'GRANT "{role}" TO current_user')
        op.execute(f'GRANT CREATE ON SCHEMA leaseq TO "{role}"')
    for function in _DEFINERS:
        op.execute(f'ALTER FUNCTION {function} OWNER TO "{role}"')
    if not superuser:
        op.execute(f'REVOKE CREATE ON SCHEMA leaseq FROM "{role}"')


def downgrade() -> None:
    bind = op.get_bind()
    role = bind.exec_driver_sql(_ROLE).scalar_one()
    if bind.execute(text("SELECT to_regrole(:role)"), {"role": role}).scalar() is None:
        return  # never made: the functions are the migrating owner's
    owner = bind.exec_driver_sql(
        "SELECT nspowner::regrole::text FROM pg_catalog.pg_namespace "
        "WHERE nspname = 'leaseq'").scalar_one()
    for function in _DEFINERS:
        op.execute(f"ALTER FUNCTION {function} OWNER TO {owner}")
    for grant in reversed(_GRANTS):
        revoke = grant.replace("GRANT ", "REVOKE ", 1).replace(" TO {role}", " FROM {role}")
        op.execute(revoke.format(role=f'"{role}"'))
    # Another database copied from this one (CREATE DATABASE ... TEMPLATE) may
    # still hold the role's functions: the role then stays.
    op.execute(f"""
        DO $$
        BEGIN
            DROP ROLE "{role}";
        EXCEPTION WHEN dependent_objects_still_exist THEN
            NULL;
        END
        $$
    """)
