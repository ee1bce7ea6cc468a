"""The SQL API, version 1: send, delete and change visibility inside the
caller's own transaction, and the grants that say which roles may.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03

docs/transactions.md is the interface's documentation; tests/engine/test_sql_api.py
holds it to the REST door's rules. A later version replaces these functions
with CREATE OR REPLACE in a migration of its own and bumps `leaseq.api_version()`.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Every function below that runs with the owner's rights fixes its search_path
# and names every object with its schema, so nothing a caller creates can stand
# in for one of ours.
_DEFINER = "SECURITY DEFINER SET search_path = pg_catalog, pg_temp"

_STATEMENTS = [
    # -- grants -------------------------------------------------------------
    # A role may act on the queues whose names match a pattern, with the scope
    # words of API keys (app/auth/scopes.py): `send:orders-*`, `receive:*`,
    # and `admin`, which grants the others. `like_pattern` is the pattern as
    # LIKE reads it (`*` any run of characters, `_` only itself).
    """
    CREATE TABLE leaseq.grants (
        role         text NOT NULL,
        action       text NOT NULL CHECK (action IN ('send', 'receive', 'read', 'admin')),
        pattern      text NOT NULL CHECK (pattern ~ '^[A-Za-z0-9_*.-]{1,80}$'),
        like_pattern text NOT NULL
                     GENERATED ALWAYS AS (replace(replace(pattern, '_', '\\_'), '*', '%')) STORED,
        created_at   timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (role, action, pattern)
    )
    """,
    # The role a call is made by: the one SET ROLE chose, else the session's.
    # (Inside a SECURITY DEFINER function current_user is the owner.)
    """
    CREATE FUNCTION leaseq.caller() RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
        SELECT CASE WHEN current_setting('role') = 'none' THEN session_user::text
                    ELSE current_setting('role') END
    $$
    """,
    # Superusers and members of the schema's owner (the role the service runs
    # as) may do anything, as they could on the tables themselves; any other
    # role needs a grant, to itself or to a role whose rights it inherits.
    """
    CREATE FUNCTION leaseq.allowed(action text, queue text) RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $$
    BEGIN
        -- PL/pgSQL, not SQL: its plan is kept for the session, where a SQL
        -- function's with a WITH would be planned again on every call.
        RETURN EXISTS (
            SELECT 1
            FROM pg_catalog.pg_roles AS who
            WHERE who.rolname = leaseq.caller()
              AND (who.rolsuper
                   OR pg_catalog.pg_has_role(
                          who.oid, (SELECT n.nspowner FROM pg_catalog.pg_namespace AS n
                                    WHERE n.nspname = 'leaseq'), 'USAGE')
                   OR EXISTS (
                          SELECT 1
                          FROM leaseq.grants AS g
                          JOIN pg_catalog.pg_roles AS granted ON granted.rolname = g.role
                          WHERE (g.action = allowed.action OR g.action = 'admin')
                            AND allowed.queue LIKE g.like_pattern
                            AND pg_catalog.pg_has_role(who.oid, granted.oid, 'USAGE'))));
    END
    $$
    """,
    """
    CREATE FUNCTION leaseq.add_grant(role text, scope text) RETURNS void
    LANGUAGE plpgsql
    AS $$
    DECLARE
        action text := split_part(scope, ':', 1);
        pattern text := substr(scope, length(split_part(scope, ':', 1)) + 2);
    BEGIN
        IF to_regrole(quote_ident(add_grant.role)) IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'undefined_object',
                MESSAGE = format('role %s does not exist', add_grant.role);
        END IF;
        IF position(':' IN scope) = 0
           OR action NOT IN ('send', 'receive', 'read', 'admin')
           OR pattern !~ '^[A-Za-z0-9_*.-]{1,80}$' THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ002',
                MESSAGE = format('scope %s: write action:pattern, the action one of send, '
                                 'receive, read, admin, the pattern a queue name in which '
                                 '* matches any characters', scope);
        END IF;
        INSERT INTO leaseq.grants (role, action, pattern)
        VALUES (add_grant.role, action, pattern)
        ON CONFLICT DO NOTHING;
    END
    $$
    """,
    """
    CREATE FUNCTION leaseq.remove_grant(role text, scope text) RETURNS boolean
    LANGUAGE sql
    AS $$
        WITH removed AS (
            DELETE FROM leaseq.grants AS g
            WHERE g.role = $1 AND g.action = split_part($2, ':', 1)
              AND g.pattern = substr($2, length(split_part($2, ':', 1)) + 2)
            RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM removed)
    $$
    """,
    # The queue a call acts on, once the caller may: refused before the name is
    # looked up, so a refusal says nothing of which queues exist.
    """
    CREATE FUNCTION leaseq.queue_for(action text, queue text) RETURNS leaseq.queues
    LANGUAGE plpgsql STABLE
    AS $$
    DECLARE
        chosen leaseq.queues;
    BEGIN
        IF NOT leaseq.allowed(action, queue) THEN
            RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
                MESSAGE = format('role %s may not %s on queue %s', leaseq.caller(), action, queue),
                HINT = format('leaseq grants add %s %s:%s', leaseq.caller(), action, queue);
        END IF;
        SELECT * INTO chosen FROM leaseq.queues AS q WHERE q.name = queue_for.queue;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ001',
                MESSAGE = format('queue %s does not exist', queue);
        END IF;
        RETURN chosen;
    END
    $$
    """,
    # -- receipt handles ----------------------------------------------------
    # The HMAC-SHA256 of app/queue/receipts.py, with PostgreSQL's sha256(): the
    # key is derived from the secret as there, and its inner and outer blocks
    # are kept beside it, computed once when the key is stored.
    """
    CREATE FUNCTION leaseq.receipt_block(secret bytea, pad integer) RETURNS bytea
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
        SELECT pg_catalog.decode(pg_catalog.string_agg(
                   pg_catalog.lpad(pg_catalog.to_hex(pg_catalog.get_byte(k.block, i) # $2), 2, '0'),
                   '' ORDER BY i), 'hex')
        FROM (SELECT pg_catalog.sha256(pg_catalog.convert_to('leaseq receipt v1', 'UTF8')
                                       || '\\x00'::bytea || $1)
                     || pg_catalog.decode(pg_catalog.repeat('00', 32), 'hex') AS block) AS k,
             pg_catalog.generate_series(0, 63) AS i
    $$
    """,
    """
    ALTER TABLE leaseq.receipt_keys
        ADD COLUMN inner_block bytea GENERATED ALWAYS AS (leaseq.receipt_block(secret, 54)) STORED,
        ADD COLUMN outer_block bytea GENERATED ALWAYS AS (leaseq.receipt_block(secret, 92)) STORED
    """,
    # The claim a handle names, if leaseq signed it for this queue with a key
    # not retired (a version 2 handle: 51 bytes in 68 base64url characters).
    """
    CREATE FUNCTION leaseq.open_receipt(queue_id bigint, handle text,
                                 OUT message_row bigint, OUT claim_token uuid)
    LANGUAGE plpgsql STABLE
    AS $$
    DECLARE
        raw bytea;
        signer leaseq.receipt_keys;
    BEGIN
        IF handle IS NULL OR length(handle) <> 68 OR handle !~ '^[A-Za-z0-9_-]+$' THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ004',
                MESSAGE = 'the receipt handle is not one leaseq issued for this queue';
        END IF;
        raw := decode(translate(handle, '-_', '+/'), 'base64');
        SELECT * INTO signer FROM leaseq.receipt_keys AS k
        WHERE k.id = get_byte(raw, 1) * 256 + get_byte(raw, 2) AND k.retired_at IS NULL;
        IF get_byte(raw, 0) <> 2 OR NOT FOUND
           OR substring(sha256(signer.outer_block
                               || sha256(signer.inner_block || substring(raw FROM 1 FOR 35)))
                        FROM 1 FOR 16) <> substring(raw FROM 36 FOR 16) THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ004',
                MESSAGE = 'the receipt handle is not one leaseq issued for this queue';
        END IF;
        IF ('x' || encode(substring(raw FROM 4 FOR 8), 'hex'))::bit(64)::bigint <> queue_id THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ004',
                MESSAGE = 'the receipt handle belongs to another queue';
        END IF;
        message_row := ('x' || encode(substring(raw FROM 12 FOR 8), 'hex'))::bit(64)::bigint;
        claim_token := encode(substring(raw FROM 20 FOR 16), 'hex')::uuid;
    END
    $$
    """,
    # -- sending ------------------------------------------------------------
    "CREATE TYPE leaseq.sent AS (message_id uuid, sequence_number bigint)",
    # The REST send's checks (app/api/message_schemas.py, app/queue/sending.py),
    # for one message: its text, attributes and size, its delay, and on a FIFO
    # queue its group and deduplication id. Returns the deduplication id to
    # store (a FIFO queue's content-based one is the body's SHA-256).
    """
    CREATE FUNCTION leaseq.check_message(q leaseq.queues, entry integer, body text, attributes jsonb,
                                  delay integer, message_group text, deduplication_id text)
    RETURNS text
    LANGUAGE plpgsql STABLE
    AS $$
    DECLARE
        size bigint;
        attribute record;
        prefix text := CASE WHEN entry IS NULL THEN '' ELSE format('message %s: ', entry) END;
    BEGIN
        IF body IS NULL OR body = '' THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ002', MESSAGE = prefix || 'body must not be empty';
        END IF;
        -- SQS's characters (XML 1.0's Char) less what a PostgreSQL text cannot hold anyway.
        IF body ~ '[\\x01-\\x08\\x0B\\x0C\\x0E-\\x1F\\uFFFE\\uFFFF]' THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ002',
                MESSAGE = prefix || 'body contains a character SQS does not allow';
        END IF;
        size := octet_length(body);
        IF attributes IS NOT NULL THEN
            IF jsonb_typeof(attributes) <> 'object' THEN
                RAISE EXCEPTION USING ERRCODE = 'LQ002',
                    MESSAGE = prefix || 'attributes must be a JSON object of strings';
            END IF;
            FOR attribute IN SELECT a.key, a.value FROM jsonb_each(attributes) AS a LOOP
                -- (A bound above 255 is more than PostgreSQL's regular expressions take.)
                IF attribute.key !~ '^[A-Za-z0-9_.-]+$' OR length(attribute.key) > 256 THEN
                    RAISE EXCEPTION USING ERRCODE = 'LQ002',
                        MESSAGE = prefix || format('attribute name %s must be 1-256 of A-Z a-z 0-9 _ . -',
                                               left(attribute.key, 40));
                END IF;
                IF jsonb_typeof(attribute.value) <> 'string' THEN
                    RAISE EXCEPTION USING ERRCODE = 'LQ002',
                        MESSAGE = prefix || format('attribute %s must be a string', attribute.key);
                END IF;
                IF attribute.value #>> '{}' ~ '[\\x01-\\x08\\x0B\\x0C\\x0E-\\x1F\\uFFFE\\uFFFF]' THEN
                    RAISE EXCEPTION USING ERRCODE = 'LQ002',
                        MESSAGE = prefix || format('attribute %s contains a character SQS does not allow',
                                               attribute.key);
                END IF;
                size := size + octet_length(attribute.key) + octet_length(attribute.value #>> '{}');
            END LOOP;
            IF (SELECT count(*) FROM jsonb_object_keys(attributes)) > 10 THEN
                RAISE EXCEPTION USING ERRCODE = 'LQ002', MESSAGE = prefix || 'at most 10 attributes';
            END IF;
        END IF;
        IF size > q.max_message_bytes THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ003',
                MESSAGE = prefix || format('message is larger than the queue''s max_message_bytes (%s)',
                                       q.max_message_bytes);
        END IF;
        IF NOT q.fifo THEN
            IF delay IS NOT NULL AND delay NOT BETWEEN 0 AND 900 THEN
                RAISE EXCEPTION USING ERRCODE = 'LQ002',
                    MESSAGE = prefix || 'delay must be between 0 and 900';
            END IF;
            IF message_group IS NOT NULL OR deduplication_id IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'LQ002',
                    MESSAGE = prefix || 'group and deduplication_id are for FIFO queues; this queue '
                                    'is a standard one';
            END IF;
            RETURN NULL;
        END IF;
        IF delay IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ002',
                MESSAGE = prefix || 'a message sent to a FIFO queue has no delay of its own (the '
                                'queue''s delay applies to every message): leave out delay';
        END IF;
        IF message_group IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ002',
                MESSAGE = prefix || 'a message sent to a FIFO queue needs a group';
        END IF;
        -- Letters, digits and punctuation: the printable ASCII characters.
        IF message_group !~ '^[!-~]{1,128}$' THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ002',
                MESSAGE = prefix || 'group must be 1-128 letters, digits and punctuation';
        END IF;
        IF deduplication_id IS NULL THEN
            IF NOT q.content_based_deduplication THEN
                RAISE EXCEPTION USING ERRCODE = 'LQ002',
                    MESSAGE = prefix || 'this FIFO queue has no content-based deduplication: a '
                                    'message sent to it needs a deduplication_id';
            END IF;
            RETURN encode(sha256(convert_to(body, 'UTF8')), 'hex');
        END IF;
        IF deduplication_id !~ '^[!-~]{1,128}$' THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ002',
                MESSAGE = prefix || 'deduplication_id must be 1-128 letters, digits and punctuation';
        END IF;
        RETURN deduplication_id;
    END
    $$
    """,
    # A FIFO message, as send_fifo_messages (app/queue/queries.sql) sends one:
    # its group's row created or locked and its version moved on, a sequence
    # number, the deduplication id accepted or answered with the message it
    # named, and the message stored only if accepted.
    """
    CREATE FUNCTION leaseq.send_fifo(q leaseq.queues, message_body text,
                                     message_attributes jsonb, message_group text,
                                     message_deduplication_id text)
    RETURNS leaseq.sent
    LANGUAGE plpgsql
    AS $$
    DECLARE
        answer leaseq.sent;
        stored boolean;
    BEGIN
        WITH grouped AS (
            INSERT INTO leaseq.message_groups AS g (queue_id, group_id, visible_at)
            VALUES (q.id, message_group, statement_timestamp() + q.delay * interval '1 second')
            ON CONFLICT (queue_id, group_id) DO UPDATE
            SET visible_at = least(g.visible_at, EXCLUDED.visible_at),
                version    = g.version + 1
            RETURNING g.group_id
        ),
        numbered AS MATERIALIZED (
            SELECT gen_random_uuid() AS message_id,
                   nextval('leaseq.message_sequence') AS sequence_number
            FROM grouped
        ),
        accepted AS (
            INSERT INTO leaseq.message_deduplication AS d
                   (queue_id, scope, deduplication_id, message_id, sequence_number, expires_at)
            SELECT q.id,
                   CASE WHEN q.deduplication_scope = 'message_group' THEN message_group ELSE '' END,
                   message_deduplication_id, n.message_id, n.sequence_number,
                   statement_timestamp() + interval '5 minutes'
            FROM numbered AS n
            ON CONFLICT (queue_id, scope, deduplication_id) DO UPDATE
            SET message_id      = CASE WHEN d.expires_at <= statement_timestamp()
                                       THEN EXCLUDED.message_id ELSE d.message_id END,
                sequence_number = CASE WHEN d.expires_at <= statement_timestamp()
                                       THEN EXCLUDED.sequence_number ELSE d.sequence_number END,
                expires_at      = CASE WHEN d.expires_at <= statement_timestamp()
                                       THEN EXCLUDED.expires_at ELSE d.expires_at END
            RETURNING d.message_id, d.sequence_number
        ),
        kept AS (
            INSERT INTO leaseq.messages (queue_id, message_id, body, attributes, group_id,
                                         sequence_number, deduplication_id, visible_at)
            SELECT q.id, n.message_id, message_body, coalesce(message_attributes, '{}'),
                   message_group, n.sequence_number, message_deduplication_id,
                   statement_timestamp()
            FROM numbered AS n
            JOIN accepted AS a ON a.message_id = n.message_id
            RETURNING 1
        )
        SELECT a.message_id, a.sequence_number, EXISTS (SELECT 1 FROM kept)
        INTO answer.message_id, answer.sequence_number, stored
        FROM accepted AS a;
        IF stored THEN
            PERFORM pg_notify('leaseq', leaseq.notice(
                q.id, CASE WHEN q.delay = 0 THEN 1 ELSE 0 END,
                CASE WHEN q.delay > 0 THEN q.delay::double precision END));
        END IF;
        RETURN answer;
    END
    $$
    """,
    # The public send, for a batch: every message checked before any is stored,
    # stored in input order, and the answers in that order. Receivers waiting
    # on the queue are woken when the caller's transaction commits (a NOTIFY,
    # which a rollback discards); the notices of many sends to a queue in one
    # transaction are alike and PostgreSQL delivers them once.
    f"""
    CREATE FUNCTION leaseq.send_batch(queue text, bodies text[], attributes jsonb[] DEFAULT NULL,
                               delays integer[] DEFAULT NULL, groups text[] DEFAULT NULL,
                               deduplication_ids text[] DEFAULT NULL)
    RETURNS SETOF leaseq.sent
    LANGUAGE plpgsql {_DEFINER}
    AS $$
    DECLARE
        q leaseq.queues := leaseq.queue_for('send', queue);
        n integer := coalesce(cardinality(bodies), 0);
        deduplication text[] := array_fill(NULL::text, ARRAY[n]);
        waits integer[] := array_fill(q.delay, ARRAY[n]);
        ready bigint;
        due_in double precision;
    BEGIN
        IF n = 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ002', MESSAGE = 'bodies: give at least one message';
        END IF;
        IF cardinality(attributes) <> n OR cardinality(delays) <> n
           OR cardinality(groups) <> n OR cardinality(deduplication_ids) <> n THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ002',
                MESSAGE = 'attributes, delays, groups and deduplication_ids: each NULL or '
                          'an array as long as bodies';
        END IF;
        FOR i IN 1 .. n LOOP
            deduplication[i] := leaseq.check_message(
                q, CASE WHEN n > 1 THEN i END, bodies[i], attributes[i], delays[i], groups[i],
                deduplication_ids[i]);
            waits[i] := coalesce(delays[i], q.delay);
        END LOOP;
        IF q.fifo THEN
            FOR i IN 1 .. n LOOP
                RETURN NEXT leaseq.send_fifo(q, bodies[i], attributes[i], groups[i],
                                             deduplication[i]);
            END LOOP;
            RETURN;
        END IF;
        RETURN QUERY
        WITH kept AS (
            INSERT INTO leaseq.messages (queue_id, body, attributes, visible_at)
            SELECT q.id, m.body, coalesce(m.attributes, '{{}}'),
                   statement_timestamp() + m.wait * interval '1 second'
            FROM unnest(bodies, send_batch.attributes, waits)
                 WITH ORDINALITY AS m(body, attributes, wait, ord)
            ORDER BY m.ord
            RETURNING id, message_id
        )
        SELECT kept.message_id, NULL::bigint FROM kept ORDER BY kept.id;
        SELECT count(*) FILTER (WHERE w = 0), min(w) FILTER (WHERE w > 0)
        INTO ready, due_in
        FROM unnest(waits) AS w;
        PERFORM pg_notify('leaseq', leaseq.notice(q.id, ready, due_in));
    END
    $$
    """,
    f"""
    CREATE FUNCTION leaseq.send(queue text, body text, attributes jsonb DEFAULT NULL,
                                delay integer DEFAULT NULL, "group" text DEFAULT NULL,
                                deduplication_id text DEFAULT NULL)
    RETURNS leaseq.sent
    LANGUAGE plpgsql {_DEFINER}
    AS $$
    DECLARE
        q leaseq.queues := leaseq.queue_for('send', queue);
        deduplication text := leaseq.check_message(
            q, NULL, body, attributes, delay, "group", deduplication_id);
        wait integer := coalesce(delay, q.delay);
        answer leaseq.sent;
    BEGIN
        -- send_batch's work for one message, without its arrays: the common
        -- call, made once per transaction of the caller's. Through send_batch
        -- it cost about 6 % more PostgreSQL CPU a send (16 clients, PostgreSQL 15).
        IF q.fifo THEN
            RETURN leaseq.send_fifo(q, body, attributes, "group", deduplication);
        END IF;
        INSERT INTO leaseq.messages AS m (queue_id, body, attributes, visible_at)
        VALUES (q.id, send.body, coalesce(send.attributes, '{{}}'),
                statement_timestamp() + wait * interval '1 second')
        RETURNING m.message_id INTO answer.message_id;
        PERFORM pg_notify('leaseq', leaseq.notice(
            q.id, CASE WHEN wait = 0 THEN 1 ELSE 0 END,
            CASE WHEN wait > 0 THEN wait::double precision END));
        RETURN answer;
    END
    $$
    """,
    # -- settling -----------------------------------------------------------
    # An acknowledgement, conditional on the claim as the REST delete is; on a
    # FIFO queue the message's group may be claimable now, and its waiting
    # receivers are woken on commit.
    f"""
    CREATE FUNCTION leaseq.delete(queue text, receipt_handle text) RETURNS void
    LANGUAGE plpgsql {_DEFINER}
    AS $$
    DECLARE
        q leaseq.queues := leaseq.queue_for('receive', queue);
        claim record := leaseq.open_receipt(q.id, receipt_handle);
        message_group text;
    BEGIN
        DELETE FROM leaseq.messages AS m
        WHERE m.id = claim.message_row AND m.claim_token = claim.claim_token
          AND m.queue_id = q.id
        RETURNING m.group_id INTO message_group;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ005',
                MESSAGE = 'the lease is lost: the message was deleted or claimed again by '
                          'another receive';
        END IF;
        IF message_group IS NOT NULL THEN
            UPDATE leaseq.message_groups AS g
            SET visible_at = least(g.visible_at, statement_timestamp()),
                version    = g.version + 1
            WHERE g.queue_id = q.id AND g.group_id = message_group;
            PERFORM pg_notify('leaseq', leaseq.notice(q.id, 1, NULL));
        END IF;
    END
    $$
    """,
    # A heartbeat or a release, conditional on the claim: the lease ends
    # `seconds` from now on the database's clock. Returns that deadline.
    f"""
    CREATE FUNCTION leaseq.change_visibility(queue text, receipt_handle text, seconds integer)
    RETURNS timestamptz
    LANGUAGE plpgsql {_DEFINER}
    AS $$
    DECLARE
        q leaseq.queues := leaseq.queue_for('receive', queue);
        claim record := leaseq.open_receipt(q.id, receipt_handle);
        deadline timestamptz;
        previous timestamptz;
        message_group text;
    BEGIN
        IF seconds IS NULL OR seconds NOT BETWEEN 0 AND 43200 THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ002',
                MESSAGE = 'seconds must be between 0 and 43200';
        END IF;
        UPDATE leaseq.messages AS m
        SET visible_at = statement_timestamp() + seconds * interval '1 second',
            leased     = seconds > 0
        FROM leaseq.messages AS prior
        WHERE m.id = claim.message_row AND m.claim_token = claim.claim_token
          AND m.queue_id = q.id AND prior.id = m.id
        RETURNING m.visible_at, prior.visible_at, m.group_id
        INTO deadline, previous, message_group;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'LQ005',
                MESSAGE = 'the lease is lost: the message was deleted or claimed again by '
                          'another receive';
        END IF;
        IF deadline < previous THEN
            IF message_group IS NOT NULL THEN
                UPDATE leaseq.message_groups AS g
                SET visible_at = least(g.visible_at, statement_timestamp()),
                    version    = g.version + 1
                WHERE g.queue_id = q.id AND g.group_id = message_group;
            END IF;
            PERFORM pg_notify('leaseq', leaseq.notice(
                q.id, CASE WHEN seconds = 0 THEN 1 ELSE 0 END,
                CASE WHEN seconds > 0 THEN seconds::double precision END));
        END IF;
        RETURN deadline;
    END
    $$
    """,
    """
    CREATE FUNCTION leaseq.api_version() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS 'SELECT 1'
    """,
    # -- who may call what --------------------------------------------------
    # Any role may call the public functions (they check the grants); nothing
    # else in the schema is any role's but the owner's: the tables (the
    # receipt keys among them) stay unreadable, the helpers uncallable.
    "GRANT USAGE ON SCHEMA leaseq TO PUBLIC",
    """
    REVOKE EXECUTE ON FUNCTION
        leaseq.allowed(text, text), leaseq.add_grant(text, text),
        leaseq.remove_grant(text, text), leaseq.queue_for(text, text),
        leaseq.receipt_block(bytea, integer), leaseq.open_receipt(bigint, text),
        leaseq.check_message(leaseq.queues, integer, text, jsonb, integer, text, text),
        leaseq.send_fifo(leaseq.queues, text, jsonb, text, text),
        leaseq.notice(bigint, bigint, double precision)
    FROM PUBLIC
    """,
]


def upgrade() -> None:
    for statement in _STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    for function in (
        "api_version()", "change_visibility(text, text, integer)", "delete(text, text)",
        "send(text, text, jsonb, integer, text, text)",
        "send_batch(text, text[], jsonb[], integer[], text[], text[])",
        "send_fifo(leaseq.queues, text, jsonb, text, text)",
        "check_message(leaseq.queues, integer, text, jsonb, integer, text, text)",
        "open_receipt(bigint, text)", "queue_for(text, text)", "remove_grant(text, text)",
        "add_grant(text, text)", "allowed(text, text)", "caller()",
    ):
        op.execute(f"DROP FUNCTION leaseq.{function}")
    op.execute("DROP TYPE leaseq.sent")
    op.execute("ALTER TABLE leaseq.receipt_keys DROP COLUMN outer_block, DROP COLUMN inner_block")
    op.execute("DROP FUNCTION leaseq.receipt_block(bytea, integer)")
    op.execute("DROP TABLE leaseq.grants")
    op.execute("REVOKE USAGE ON SCHEMA leaseq FROM PUBLIC")
    op.execute("GRANT EXECUTE ON FUNCTION leaseq.notice(bigint, bigint, double precision) "
               "TO PUBLIC")
