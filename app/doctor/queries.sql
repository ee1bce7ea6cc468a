-- The doctor's statements (app/doctor/checks.py): each reads, none changes anything.

-- name: server_version
-- returns: VersionRow
SHOW server_version;

-- name: has_schema
-- returns: MigratedRow
SELECT to_regclass('leaseq.alembic_version') IS NOT NULL AS migrated;

-- name: revision
-- returns: RevisionRow
-- The revision Alembic recorded (has_schema first: before any migration the
-- table does not exist).
SELECT version_num FROM leaseq.alembic_version;

-- name: usable_api_key
-- returns: ExistsRow
SELECT EXISTS (SELECT 1 FROM leaseq.api_keys
               WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now()));

-- name: api_key_revoked
-- returns: ExistsRow
-- Whether the bootstrap key (LEASEQ_ADMIN_KEY) was revoked: leaseq serve then
-- leaves it so; absent, it is created on start.
SELECT EXISTS (SELECT 1 FROM leaseq.api_keys WHERE id = :id AND revoked_at IS NOT NULL);

-- name: connection_limits
-- returns: ConnectionLimitsRow
-- `others`: client connections that are not leaseq's (its processes, this one
-- too, name theirs leaseq...). Another role's sessions show a NULL
-- backend_type and application_name to a role without pg_read_all_stats:
-- counted as others.
SELECT current_setting('max_connections')::int AS max_connections,
       current_setting('superuser_reserved_connections')::int AS reserved,
       (SELECT count(*) FROM pg_stat_activity
        WHERE (backend_type = 'client backend' OR backend_type IS NULL)
          AND coalesce(application_name, '') NOT LIKE 'leaseq%') AS others;

-- name: autovacuum
-- returns: AutovacuumRow
SELECT current_setting('autovacuum')::boolean AS server_on,
       current_setting('track_counts')::boolean AS track_counts,
       coalesce((SELECT option_value::boolean
                 FROM pg_class AS c, pg_options_to_table(c.reloptions)
                 WHERE c.oid = to_regclass('leaseq.messages')
                   AND option_name = 'autovacuum_enabled'), true) AS table_on;

-- name: durability
-- returns: DurabilityRow
SELECT current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('fsync') AS fsync,
       current_setting('full_page_writes') AS full_page_writes;

-- name: database_clock
-- returns: ClockRow
SELECT extract(epoch FROM clock_timestamp())::float8 AS now;

-- name: server_port
-- returns: PortRow
-- NULL over a Unix socket.
SELECT inet_server_port() AS port;

-- name: receipt_keys_age
-- returns: ReceiptKeysAgeRow
SELECT count(*) AS keys,
       coalesce(extract(epoch FROM now() - max(created_at)) / 86400, 0)::float8
           AS newest_days
FROM leaseq.receipt_keys WHERE retired_at IS NULL;

-- name: superuser_definers
-- returns: DefinersRow
-- The leaseq functions that run as their owner (SECURITY DEFINER) while that
-- owner is a superuser, each with its owner's name.
SELECT coalesce(array_agg(p.oid::regprocedure::text || ' (' || r.rolname || ')'
                          ORDER BY p.proname), '{}') AS functions
FROM pg_proc AS p
JOIN pg_roles AS r ON r.oid = p.proowner
WHERE p.pronamespace = to_regnamespace('leaseq') AND p.prosecdef AND r.rolsuper;

-- name: definer_owner_members
-- returns: OwnerMembersRow
-- The roles that may act as the owner of a leaseq SECURITY DEFINER function
-- (its members, each as `member of owner`), but for the schema's owner, which
-- owns the tables anyway. A function owned by the schema's owner is left out:
-- its members own every table already.
SELECT coalesce(array_agg(DISTINCT m.rolname || ' of ' || o.rolname), '{}') AS members
FROM pg_proc AS p
JOIN pg_namespace AS n ON n.oid = p.pronamespace
JOIN pg_roles AS o ON o.oid = p.proowner
JOIN pg_auth_members AS a ON a.roleid = p.proowner
JOIN pg_roles AS m ON m.oid = a.member
WHERE n.nspname = 'leaseq' AND p.prosecdef
  AND p.proowner <> n.nspowner AND a.member <> n.nspowner;
