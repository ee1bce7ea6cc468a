-- Every statement the queue engine runs, named and written out in full.
--
-- Time: every deadline is computed here, on the database clock, with
-- statement_timestamp() -- the start of the current statement. It is stable
-- within a statement (so the claim index can be used) but, unlike now(), it is
-- not frozen for a whole transaction. Python never supplies a timestamp, only
-- durations in whole seconds.
--
-- Notifications: pg_notify('leaseq', queue_id) is issued in the transaction of
-- every write that makes a message visible sooner; PostgreSQL delivers it on
-- commit, so a woken receiver always finds the committed row.

-- name: create_queue
-- Creates a queue; returns no row when the name is already taken.
INSERT INTO queues (name, visibility_timeout, message_retention, delay, receive_wait,
                    max_message_bytes)
VALUES (:name, :visibility_timeout, :message_retention, :delay, :receive_wait,
        :max_message_bytes)
ON CONFLICT (name) DO NOTHING
RETURNING id, name, visibility_timeout, message_retention, delay, receive_wait,
          max_message_bytes, created_at, updated_at;

-- name: get_queue
-- One queue by name.
SELECT id, name, visibility_timeout, message_retention, delay, receive_wait,
       max_message_bytes, created_at, updated_at
FROM queues
WHERE name = :name;

-- name: list_queues
-- Queues whose name starts with a prefix, in name order, one page after a name.
SELECT id, name, visibility_timeout, message_retention, delay, receive_wait,
       max_message_bytes, created_at, updated_at
FROM queues
WHERE starts_with(name, :prefix) AND name > :after
ORDER BY name
LIMIT :limit;

-- name: update_queue
-- Changes the attributes given (NULL keeps the current value).
UPDATE queues
SET visibility_timeout = coalesce(CAST(:visibility_timeout AS integer), visibility_timeout),
    message_retention  = coalesce(CAST(:message_retention AS integer), message_retention),
    delay              = coalesce(CAST(:delay AS integer), delay),
    receive_wait       = coalesce(CAST(:receive_wait AS integer), receive_wait),
    max_message_bytes  = coalesce(CAST(:max_message_bytes AS integer), max_message_bytes),
    updated_at         = statement_timestamp()
WHERE name = :name
RETURNING id, name, visibility_timeout, message_retention, delay, receive_wait,
          max_message_bytes, created_at, updated_at;

-- name: delete_queue
-- Deletes a queue; its messages go with it (ON DELETE CASCADE).
DELETE FROM queues WHERE name = :name RETURNING id;

-- name: purge_queue
-- Deletes every message of a queue, whatever its state.
DELETE FROM messages WHERE queue_id = :queue_id;

-- name: queue_stats
-- Live counts by state. Messages past retention are already gone for clients.
SELECT count(*) FILTER (WHERE visible_at <= statement_timestamp()) AS visible,
       count(*) FILTER (WHERE visible_at > statement_timestamp() AND leased) AS in_flight,
       count(*) FILTER (WHERE visible_at > statement_timestamp() AND NOT leased) AS delayed,
       coalesce(extract(epoch FROM statement_timestamp() - min(sent_at)), 0)
           AS oldest_age_seconds
FROM messages
WHERE queue_id = :queue_id
  AND sent_at > statement_timestamp() - CAST(:retention AS integer) * interval '1 second';

-- name: send_messages
-- Inserts a batch in input order; :notice (see app/queue/waiting.py) wakes
-- waiting receivers once the transaction commits.
WITH sent AS (
    INSERT INTO messages (queue_id, body, attributes, visible_at)
    SELECT :queue_id, m.body, CAST(m.attributes AS jsonb),
           statement_timestamp() + m.delay * interval '1 second'
    FROM unnest(CAST(:bodies AS text[]), CAST(:attributes AS text[]),
                CAST(:delays AS integer[])) WITH ORDINALITY AS m(body, attributes, delay, ord)
    ORDER BY m.ord
    RETURNING id, message_id, sent_at
)
SELECT sent.message_id, sent.sent_at, pg_notify('leaseq', :notice) AS notified
FROM sent
ORDER BY sent.id;

-- name: claim_messages
-- The claim: one statement. A message is claimable when its deadline has
-- passed (never received, released, delay over, or lease expired: no sweeper
-- is needed) and it is within retention. The deadline moves in the same
-- UPDATE, so a row is never handed out twice; SKIP LOCKED lets concurrent
-- receivers take different rows instead of queueing on the same ones.
UPDATE messages AS m
SET visible_at        = statement_timestamp()
                        + CAST(:visibility_timeout AS integer) * interval '1 second',
    claim_token       = gen_random_uuid(),
    fencing_token     = nextval('fencing_tokens'),
    receive_count     = m.receive_count + 1,
    leased            = true,
    first_received_at = coalesce(m.first_received_at, statement_timestamp())
WHERE m.id = ANY (ARRAY(
    SELECT c.id
    FROM messages AS c
    WHERE c.queue_id = :queue_id
      AND c.visible_at <= statement_timestamp()
      AND c.sent_at > statement_timestamp() - CAST(:retention AS integer) * interval '1 second'
    ORDER BY c.visible_at
    LIMIT :max
    FOR UPDATE SKIP LOCKED))
RETURNING m.id, m.message_id, m.body, CAST(m.attributes AS text) AS attributes,
          m.receive_count, m.claim_token, m.fencing_token, m.visible_at AS lease_expires_at,
          m.sent_at, m.first_received_at, CAST(m.checkpoint AS text) AS checkpoint;

-- name: queue_outlook
-- For waiting receivers, after a claim: whether more messages are claimable
-- now, and the seconds (by the database clock) until the next one becomes
-- claimable (a delay ending or a lease expiring; NULL when none is pending).
SELECT (SELECT extract(epoch FROM min(visible_at) - statement_timestamp())
        FROM messages
        WHERE queue_id = :queue_id
          AND visible_at > statement_timestamp()
          AND sent_at > statement_timestamp() - CAST(:retention AS integer) * interval '1 second'
       ) AS due_in,
       EXISTS (SELECT 1
               FROM messages
               WHERE queue_id = :queue_id
                 AND visible_at <= statement_timestamp()
                 AND sent_at > statement_timestamp()
                               - CAST(:retention AS integer) * interval '1 second'
       ) AS more_now;

-- name: change_visibility
-- Heartbeat or release, conditional on the claim: a row changes only while the
-- handle's claim token is still the message's. A timeout of 0 releases it.
-- Returns the previous deadline too, so a change that makes a message visible
-- sooner can wake waiting receivers (an extension, the common case, does not).
UPDATE messages AS m
SET visible_at = statement_timestamp() + h.timeout * interval '1 second',
    leased     = h.timeout > 0
FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[]), CAST(:timeouts AS integer[]))
         AS h(id, token, timeout),
     messages AS before
WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id
  AND before.id = m.id
RETURNING m.id, m.visible_at AS lease_expires_at, h.timeout,
          m.visible_at < before.visible_at AS sooner;

-- name: notify_queue
-- Wakes waiting receivers of a queue once the transaction commits.
SELECT pg_notify('leaseq', :notice);

-- name: delete_messages
-- Acknowledgement, conditional on the claim.
DELETE FROM messages AS m
USING unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[])) AS h(id, token)
WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id
RETURNING m.id;

-- name: save_checkpoint
-- Records a job's cursor and renews the lease by the queue's timeout,
-- conditional on the claim.
UPDATE messages
SET checkpoint = CAST(:cursor AS jsonb),
    visible_at = statement_timestamp() + CAST(:timeout AS integer) * interval '1 second',
    leased     = true
WHERE id = :id AND claim_token = :token AND queue_id = :queue_id
RETURNING visible_at AS lease_expires_at;

-- name: sweep_expired
-- Deletes up to :limit messages older than their queue's retention, whatever
-- their state or receive count. Locked rows are left for the next round.
DELETE FROM messages
WHERE id = ANY (ARRAY(
    SELECT m.id
    FROM messages AS m
    JOIN queues AS q ON q.id = m.queue_id
    WHERE m.sent_at <= statement_timestamp() - q.message_retention * interval '1 second'
    LIMIT :limit
    FOR UPDATE OF m SKIP LOCKED));
