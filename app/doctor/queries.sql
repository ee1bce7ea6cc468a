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
-- Of the live generation of the messages: the rotation turns autovacuum off on
-- a drained one until it is emptied (app/queue/rotation.py).
SELECT current_setting('autovacuum')::boolean AS server_on,
       current_setting('track_counts')::boolean AS track_counts,
       l.live_table,
       coalesce((SELECT option_value::boolean
                 FROM pg_class AS c, pg_options_to_table(c.reloptions)
                 WHERE c.oid = to_regclass(l.live_table)
                   AND option_name = 'autovacuum_enabled'), true) AS table_on
FROM (SELECT format('leaseq.messages_g%s', r.live) AS live_table FROM leaseq.rotation AS r) AS l;

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

-- name: horizon_holder
-- returns: HorizonRow
-- Who holds back this database's cleanup horizon the furthest: the engine's
-- statement database_horizon (app/queue/queries.sql says what it counts and
-- why), word for word (each file's names are its own); tests/operations/test_horizon.py holds the two equal.
SELECT now() AS now,
       pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid,
       h.kind, h.xid_age, h.since, h.pid, h.application_name, h.username,
       h.client_addr, h.state, h.backend_type, h.database, h.query,
       h.slot_name, h.slot_type, h.gid
FROM (SELECT) AS reading
LEFT JOIN LATERAL (
    SELECT 'backend' AS kind,
           greatest(age(a.backend_xid), age(a.held_xmin))::bigint AS xid_age,
           a.backend_xid IS NOT NULL
               AND age(a.backend_xid) >= coalesce(age(a.held_xmin), 0) AS holds_the_id,
           a.xact_start AS since, a.pid, a.application_name,
           a.usename::text AS username, host(a.client_addr) AS client_addr, a.state,
           a.backend_type, a.datname::text AS database, left(a.query, 400) AS query,
           NULL AS slot_name, NULL AS slot_type, NULL AS gid
    FROM (SELECT s.*,
                 CASE WHEN s.datname = current_database() OR s.datid IS NULL
                           OR current_setting('server_version_num')::int < 140000
                      THEN s.backend_xmin END AS held_xmin
          FROM pg_stat_activity AS s
          WHERE s.pid <> pg_backend_pid()
            AND s.backend_type IS DISTINCT FROM 'autovacuum worker'
            AND NOT (s.backend_type = 'walsender' AND s.datid IS NOT NULL)
            AND NOT (s.state = 'active' AND s.query ~* '^\s*vacuum\M'
                     AND s.query !~* '\mfull\M')) AS a
    WHERE a.backend_xid IS NOT NULL OR a.held_xmin IS NOT NULL
    UNION ALL
    SELECT 'slot', age(s.xmin)::bigint, true, NULL, s.active_pid, NULL, NULL, NULL,
           NULL, NULL, s.database::text, NULL, s.slot_name::text, s.slot_type, NULL
    FROM pg_replication_slots AS s
    WHERE s.xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared', age(p.transaction)::bigint, true, p.prepared, NULL, NULL,
           p.owner::text, NULL, NULL, NULL, p.database::text, NULL, NULL, NULL, p.gid
    FROM pg_prepared_xacts AS p
    ORDER BY xid_age DESC, holds_the_id DESC, since NULLS LAST
    LIMIT 1
) AS h ON true;
