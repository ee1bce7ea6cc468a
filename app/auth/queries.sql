-- The statements of the key store (app/auth/store.py).

-- name: create_api_key
-- returns: KeyInfoRow
INSERT INTO leaseq.api_keys (id, name, secret_hash, sealed_secret, scopes, rate_per_second, expires_at)
VALUES (:id, :name, :secret_hash, :sealed_secret, :scopes, :rate_per_second,
        CASE WHEN CAST(:expires_in AS double precision) IS NULL THEN NULL
             ELSE now() + make_interval(secs => :expires_in) END)
ON CONFLICT (id) DO NOTHING
RETURNING id, name, scopes, rate_per_second, created_at, expires_at, revoked_at, last_used_at;

-- name: get_api_key
-- returns: KeyRow
-- A usable key, with how many seconds it has left on the database clock.
SELECT id, name, secret_hash, sealed_secret, scopes, rate_per_second,
       EXTRACT(EPOCH FROM expires_at - now())::float8 AS seconds_left
FROM leaseq.api_keys
WHERE id = :id AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now());

-- name: api_key_ids
-- returns: KeyIdRow
-- Every key's id, revoked and expired ones too (ids are never reused): an id
-- not among them is refused without a query.
SELECT id FROM leaseq.api_keys;

-- name: list_api_keys
-- returns: KeyInfoRow
SELECT id, name, scopes, rate_per_second, created_at, expires_at, revoked_at, last_used_at
FROM leaseq.api_keys
ORDER BY created_at, id;

-- name: revoke_api_key
-- returns: KeyIdRow
UPDATE leaseq.api_keys SET revoked_at = now()
WHERE id = :id AND revoked_at IS NULL
RETURNING id;

-- name: keys_required
-- returns: RequiredRow
-- Once a key has been stored, keys are required for good: revoking or expiring
-- the last one locks the doors, never opens them (docs/security.md, recovery).
SELECT EXISTS (SELECT 1 FROM leaseq.api_keys) AS required;

-- name: any_api_key
-- returns: AnyKeyRow
-- A key that works now: protected mode's check before serving a public address.
SELECT EXISTS (
    SELECT 1 FROM leaseq.api_keys
    WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
) AS any;

-- name: touch_api_key
-- At most once a minute per key: a busy key must not write on every request.
UPDATE leaseq.api_keys SET last_used_at = now()
WHERE id = :id AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute');

-- name: notify_keys
-- returns: NotifiedRow
SELECT pg_notify('leaseq', :notice);

-- name: receipt_keys
-- returns: ReceiptKeyRow
-- A new key verifies at once but signs only after :activation seconds, by
-- when every process has heard of it.
SELECT id, secret,
       EXTRACT(EPOCH FROM created_at + make_interval(secs => :activation) - now())::float8
           AS activates_in
FROM leaseq.receipt_keys WHERE retired_at IS NULL ORDER BY id;

-- name: first_receipt_key
INSERT INTO leaseq.receipt_keys (id, secret) VALUES (1, :secret) ON CONFLICT (id) DO NOTHING;

-- name: rotate_receipt_key
-- returns: ReceiptKeyIdRow
-- Serialised by the table lock: two rotations at once must not pick one id.
INSERT INTO leaseq.receipt_keys (id, secret)
SELECT COALESCE(max(id), 0) + 1, :secret FROM leaseq.receipt_keys
RETURNING id;

-- name: lock_receipt_keys
LOCK TABLE leaseq.receipt_keys IN SHARE ROW EXCLUSIVE MODE;

-- name: retire_receipt_key
-- returns: ReceiptKeyIdRow
-- The newest key is never retired: something must sign.
UPDATE leaseq.receipt_keys SET retired_at = now()
WHERE id = :id AND retired_at IS NULL
  AND id <> (SELECT max(id) FROM leaseq.receipt_keys WHERE retired_at IS NULL)
RETURNING id;

-- name: list_receipt_keys
-- returns: ListedReceiptKeyRow
SELECT id, created_at, retired_at FROM leaseq.receipt_keys ORDER BY id;

-- name: role_exists
-- returns: ExistsRow
SELECT to_regrole(quote_ident(:role)) IS NOT NULL AS exists;

-- name: add_grant
-- returns: GrantAddedRow
-- What a role may do through the SQL API (leaseq.send, leaseq.delete, ...),
-- checked there by leaseq.allowed (migration 0012).
SELECT leaseq.add_grant(:role, :scope) AS added;

-- name: remove_grant
-- returns: RemovedRow
SELECT leaseq.remove_grant(:role, :scope) AS removed;

-- name: list_grants
-- returns: GrantRow
SELECT role, action || ':' || pattern AS scope, created_at
FROM leaseq.grants
ORDER BY role, action, pattern;

-- name: start_dashboard_session
-- returns: CrowdedSessionRow
-- A dashboard sign-in (app/auth/sessions.py), on the database's clock; the
-- expired ones go first, so the table holds no more than the live sessions,
-- and the key's oldest beyond :keep besides the new one end, each returned (the
-- statement's one snapshot does not see the new row: it is never among them).
WITH expired AS (
    DELETE FROM leaseq.dashboard_sessions WHERE expires_at <= now()
), started AS (
    INSERT INTO leaseq.dashboard_sessions (id_hash, key_id, expires_at)
    VALUES (:id_hash, :key_id, now() + make_interval(secs => :lifetime))
)
DELETE FROM leaseq.dashboard_sessions
WHERE id_hash IN (SELECT id_hash FROM leaseq.dashboard_sessions
                  WHERE key_id = :key_id AND expires_at > now()
                  ORDER BY created_at DESC, id_hash
                  OFFSET :keep)
RETURNING id_hash;

-- name: get_dashboard_session
-- returns: DashboardSessionRow
-- plan: cached
SELECT key_id, EXTRACT(EPOCH FROM expires_at - now())::float8 AS seconds_left
FROM leaseq.dashboard_sessions
WHERE id_hash = :id_hash AND expires_at > now();

-- name: end_dashboard_session
-- returns: EndedSessionRow
DELETE FROM leaseq.dashboard_sessions WHERE id_hash = :id_hash
RETURNING key_id;
