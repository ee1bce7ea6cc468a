-- Every statement the queue engine runs, named and written out in full.
--
-- Time: every deadline is computed here, on the database clock, with
-- statement_timestamp() -- the start of the current statement. It is stable
-- within a statement (so the claim index can be used) but, unlike now(), it is
-- not frozen for a whole transaction. Python never supplies a timestamp, only
-- durations in whole seconds.
--
-- Plans: statements run on connections that plan every execution for its
-- parameters and the table's current size (app/db/engine.py), except those
-- marked `-- plan: cached`, whose plan cannot turn bad (rows found by primary
-- key, an INSERT): they run on connections that keep PostgreSQL's cached plans.
--
-- Notifications: pg_notify('leaseq', leaseq_notice(queue, ready, due_in)) is
-- issued in the transaction of every write that makes a message visible sooner
-- (the text is formatted only by that function, migration 0006); PostgreSQL
-- delivers it on commit, so a woken receiver always finds the committed row.

-- name: create_queue
-- Creates a queue; returns no row when the name is already taken.
WITH created AS (
    INSERT INTO queues (name, visibility_timeout, message_retention, delay, receive_wait,
                        max_message_bytes, dead_letter_queue_id, max_receive_count,
                        retry_initial, retry_multiplier, retry_max, retry_jitter, tags)
    VALUES (:name, :visibility_timeout, :message_retention, :delay, :receive_wait,
            :max_message_bytes, :dead_letter_queue_id, :max_receive_count,
            :retry_initial, :retry_multiplier, :retry_max, :retry_jitter,
            CAST(:tags AS jsonb))
    ON CONFLICT (name) DO NOTHING
    RETURNING *
)
SELECT q.id, q.name, q.visibility_timeout, q.message_retention, q.delay, q.receive_wait,
       q.max_message_bytes, q.dead_letter_queue_id, d.name AS dead_letter_queue,
       q.max_receive_count, q.retry_initial, q.retry_multiplier, q.retry_max, q.retry_jitter,
       q.created_at, q.updated_at
FROM created AS q
LEFT JOIN queues AS d ON d.id = q.dead_letter_queue_id;

-- name: get_queue
-- One queue by name, with its dead-letter queue's name.
SELECT q.id, q.name, q.visibility_timeout, q.message_retention, q.delay, q.receive_wait,
       q.max_message_bytes, q.dead_letter_queue_id, d.name AS dead_letter_queue,
       q.max_receive_count, q.retry_initial, q.retry_multiplier, q.retry_max, q.retry_jitter,
       q.created_at, q.updated_at
FROM queues AS q
LEFT JOIN queues AS d ON d.id = q.dead_letter_queue_id
WHERE q.name = :name;

-- name: get_queue_for_update
-- The same, locked: a change reads and writes one version of the queue.
SELECT q.id, q.name, q.visibility_timeout, q.message_retention, q.delay, q.receive_wait,
       q.max_message_bytes, q.dead_letter_queue_id, d.name AS dead_letter_queue,
       q.max_receive_count, q.retry_initial, q.retry_multiplier, q.retry_max, q.retry_jitter,
       q.created_at, q.updated_at
FROM queues AS q
LEFT JOIN queues AS d ON d.id = q.dead_letter_queue_id
WHERE q.name = :name
FOR UPDATE OF q;

-- name: queue_id_by_name
-- A queue's id, to resolve a dead-letter queue named in a redrive policy;
-- FOR SHARE keeps it from being deleted before the policy is committed.
SELECT id FROM queues WHERE name = :name FOR SHARE;

-- name: list_queues
-- Queues whose name starts with a prefix, in name order, one page after a name.
SELECT q.id, q.name, q.visibility_timeout, q.message_retention, q.delay, q.receive_wait,
       q.max_message_bytes, q.dead_letter_queue_id, d.name AS dead_letter_queue,
       q.max_receive_count, q.retry_initial, q.retry_multiplier, q.retry_max, q.retry_jitter,
       q.created_at, q.updated_at
FROM queues AS q
LEFT JOIN queues AS d ON d.id = q.dead_letter_queue_id
WHERE starts_with(q.name, :prefix) AND q.name > :after
ORDER BY q.name
LIMIT :limit;

-- name: update_queue
-- Writes every attribute (the caller merged the change into the current ones).
WITH updated AS (
    UPDATE queues
    SET visibility_timeout   = :visibility_timeout,
        message_retention    = :message_retention,
        delay                = :delay,
        receive_wait         = :receive_wait,
        max_message_bytes    = :max_message_bytes,
        dead_letter_queue_id = :dead_letter_queue_id,
        max_receive_count    = :max_receive_count,
        retry_initial        = :retry_initial,
        retry_multiplier     = :retry_multiplier,
        retry_max            = :retry_max,
        retry_jitter         = :retry_jitter,
        updated_at           = statement_timestamp()
    WHERE id = :id
    RETURNING *
)
SELECT q.id, q.name, q.visibility_timeout, q.message_retention, q.delay, q.receive_wait,
       q.max_message_bytes, q.dead_letter_queue_id, d.name AS dead_letter_queue,
       q.max_receive_count, q.retry_initial, q.retry_multiplier, q.retry_max, q.retry_jitter,
       q.created_at, q.updated_at
FROM updated AS q
LEFT JOIN queues AS d ON d.id = q.dead_letter_queue_id;

-- name: dead_letter_sources
-- Queues that name this one as their dead-letter queue.
SELECT name FROM queues WHERE dead_letter_queue_id = :queue_id ORDER BY name;

-- name: delete_queue
-- Deletes a queue; its messages go with it (ON DELETE CASCADE).
DELETE FROM queues WHERE name = :name RETURNING id;

-- name: get_queue_tags
-- A queue's tags (a JSON object of strings).
SELECT CAST(tags AS text) FROM queues WHERE id = :id;

-- name: change_queue_tags
-- Adds (or overwrites) tags and removes keys, in one statement; returns the tags after.
UPDATE queues
SET tags = (tags || CAST(:add AS jsonb)) - CAST(:remove AS text[])
WHERE id = :id
RETURNING CAST(tags AS text);

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
-- plan: cached (an INSERT from arrays)
-- Inserts a batch in input order. The notification (app/queue/waiting.py:
-- queue:ready-now:next-due-in) wakes waiting receivers once the transaction
-- commits; every row carries the same payload, which PostgreSQL sends once.
-- A `not_before` schedule becomes an interval here, measured on the database's
-- clock at this statement (between now and the end of retention); the
-- deadline is still statement_timestamp() plus an interval.
WITH sent AS (
    INSERT INTO messages (queue_id, body, attributes, attribute_types, sender_id, visible_at)
    SELECT :queue_id, m.body, CAST(m.attributes AS jsonb), CAST(m.attribute_types AS jsonb),
           m.sender_id,
           statement_timestamp() + CASE
               WHEN m.not_before IS NULL THEN m.delay * interval '1 second'
               ELSE greatest(interval '0',
                             least(m.not_before - statement_timestamp(),
                                   CAST(:retention AS integer) * interval '1 second'))
           END
    FROM unnest(CAST(:bodies AS text[]), CAST(:attributes AS text[]),
                CAST(:attribute_types AS text[]), CAST(:sender_ids AS text[]),
                CAST(:delays AS integer[]), CAST(:not_befores AS timestamptz[]))
         WITH ORDINALITY AS m(body, attributes, attribute_types, sender_id, delay, not_before,
                              ord)
    ORDER BY m.ord
    RETURNING id, message_id, sent_at,
              extract(epoch FROM visible_at - statement_timestamp()) AS due_in
)
SELECT sent.message_id, sent.sent_at, sent.due_in,
       pg_notify('leaseq', leaseq_notice(CAST(:queue_id AS bigint),
           count(*) FILTER (WHERE sent.due_in <= 0) OVER (),
           CAST(min(sent.due_in) FILTER (WHERE sent.due_in > 0) OVER () AS double precision)))
           AS notified
FROM sent
ORDER BY sent.id;

-- name: claim_messages
-- The claim: one statement. A message is claimable when its deadline has
-- passed (never received, released, delay over, or lease expired: no sweeper
-- is needed) and it is within retention. The deadline moves in the same
-- UPDATE, so a row is never handed out twice; SKIP LOCKED lets concurrent
-- receivers take different rows instead of queueing on the same ones.
-- Under a redrive policy, a candidate already received max_receive_count
-- times is moved to the dead-letter queue by the same statement instead: it
-- is never delivered once more, and never between the two queues. The
-- receive count is read from the locked row, so concurrent receivers agree.
-- The acknowledgements a receive brings (`ack_ids`, `ack_tokens`; empty
-- arrays for none) are deleted by the same statement, conditional on each
-- claim as delete_messages is, and their rows are never candidates: one
-- statement must not change a row twice. `acked` lists the rows deleted.
-- Always one row at least: `dead` counts the moved ones; `id` is NULL when
-- nothing was claimed.
WITH acked AS (
    DELETE FROM messages AS m
    USING unnest(CAST(:ack_ids AS bigint[]), CAST(:ack_tokens AS uuid[])) AS h(id, token)
    WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id
    RETURNING m.id
),
candidates AS (
    SELECT c.id, c.receive_count
    FROM messages AS c
    WHERE c.queue_id = :queue_id
      AND c.visible_at <= statement_timestamp()
      AND c.sent_at > statement_timestamp() - CAST(:retention AS integer) * interval '1 second'
      AND c.id <> ALL (CAST(:ack_ids AS bigint[]))
    ORDER BY c.visible_at
    LIMIT :max
    FOR UPDATE SKIP LOCKED
),
dead AS (
    UPDATE messages AS m
    SET queue_id              = CAST(:dead_letter_queue_id AS bigint),
        dead_letter_source_id = m.queue_id,
        visible_at            = statement_timestamp(),
        leased                = false
    FROM candidates AS c
    WHERE m.id = c.id AND c.receive_count >= CAST(:max_receive_count AS integer)
    RETURNING m.id
),
claimed AS (
    UPDATE messages AS m
    SET visible_at        = statement_timestamp()
                            + CAST(:visibility_timeout AS integer) * interval '1 second',
        claim_token       = gen_random_uuid(),
        fencing_token     = nextval('fencing_tokens'),
        receive_count     = m.receive_count + 1,
        leased            = true,
        first_received_at = coalesce(m.first_received_at, statement_timestamp())
    FROM candidates AS c
    WHERE m.id = c.id
      AND (CAST(:max_receive_count AS integer) IS NULL
           OR c.receive_count < CAST(:max_receive_count AS integer))
    RETURNING m.id, m.message_id, m.body, CAST(m.attributes AS text) AS attributes,
              CAST(m.attribute_types AS text) AS attribute_types, m.sender_id,
              m.receive_count, m.claim_token, m.fencing_token,
              m.visible_at AS lease_expires_at, m.sent_at, m.first_received_at,
              CAST(m.checkpoint AS text) AS checkpoint
)
SELECT (SELECT count(*) FROM dead) AS dead,
       (SELECT coalesce(array_agg(id), '{}') FROM acked) AS acked,
       claimed.*
FROM (SELECT 1) AS always_one_row
LEFT JOIN claimed ON true;

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
-- plan: cached (rows by primary key)
-- Heartbeat or release, conditional on the claim: a row changes only while the
-- handle's claim token is still the message's. A visibility timeout of 0 releases it.
-- Returns the previous deadline too, so a change that makes a message visible
-- sooner can wake waiting receivers (an extension, the common case, does not).
UPDATE messages AS m
SET visible_at = statement_timestamp() + h.visibility_timeout * interval '1 second',
    leased     = h.visibility_timeout > 0
FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[]),
            CAST(:visibility_timeouts AS integer[])) AS h(id, token, visibility_timeout),
     messages AS before
WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id
  AND before.id = m.id
RETURNING m.id, m.visible_at AS lease_expires_at, h.visibility_timeout,
          m.visible_at < before.visible_at AS sooner;

-- name: give_back_claims
-- plan: cached (rows by primary key)
-- Undoes claims that reached no one: a grouped claim's share whose receiver
-- stopped waiting before it was answered. Conditional on the claim like every
-- write on a claimed message; visible again at once, and the receive the
-- claim counted taken back (nobody received it, so it must not bring the
-- message nearer its dead-letter queue). Wakes waiting receivers on commit.
WITH given AS (
    UPDATE messages AS m
    SET visible_at        = statement_timestamp(),
        leased            = false,
        receive_count     = m.receive_count - 1,
        first_received_at = CASE WHEN m.receive_count = 1 THEN NULL
                                 ELSE m.first_received_at END
    FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[])) AS h(id, token)
    WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id
    RETURNING m.id
)
SELECT count(*) AS given,
       pg_notify('leaseq', leaseq_notice(CAST(:queue_id AS bigint), count(*), NULL)) AS notified
FROM given
HAVING count(*) > 0;

-- name: notify_ready
-- plan: cached (no table)
-- Wakes waiting receivers of a queue once the transaction commits: `ready`
-- messages are visible now, the next one in `due_in` seconds (NULL: none known).
SELECT pg_notify('leaseq', leaseq_notice(:queue_id, :ready, :due_in));

-- name: notify_queue_changed
-- Tells every process that a queue's attributes changed or that it was deleted.
SELECT pg_notify('leaseq', format('%s:%s', CAST(:queue_id AS bigint), 'changed'));

-- name: release_message
-- A worker gives a message back after a failure, conditional on the claim.
-- The delay is the one asked for, else the queue's retry ladder for the
-- message's receive count (initial * multiplier^(count-1), at most max, less
-- up to `jitter` of it at random), else 0: visible at once.
UPDATE messages AS m
SET visible_at = statement_timestamp() + make_interval(secs => coalesce(
        CAST(:delay AS double precision),
        least(q.retry_max,
              q.retry_initial * power(q.retry_multiplier, least(greatest(m.receive_count - 1, 0), 64)))
            * (1 - q.retry_jitter * random()),
        0)),
    leased = false
FROM queues AS q
WHERE m.id = :id AND m.claim_token = :token AND m.queue_id = :queue_id AND q.id = m.queue_id
RETURNING extract(epoch FROM m.visible_at - statement_timestamp()) AS delay,
          m.visible_at;

-- name: delete_messages
-- plan: cached (rows by primary key)
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
    visible_at = statement_timestamp() + CAST(:visibility_timeout AS integer) * interval '1 second',
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

-- name: peek_messages
-- Messages of a queue for an operator, without claiming them: by state, in
-- id order, one page after an id; bodies cut to :body_chars characters.
SELECT m.id, m.message_id, left(m.body, :body_chars) AS body,
       length(m.body) > :body_chars AS truncated,
       CAST(m.attributes AS text) AS attributes, m.receive_count, m.sent_at,
       m.first_received_at, m.visible_at, CAST(m.checkpoint AS text) AS checkpoint,
       source.name AS dead_letter_source,
       CASE WHEN m.visible_at <= statement_timestamp() THEN 'visible'
            WHEN m.leased THEN 'in_flight'
            ELSE 'delayed' END AS state
FROM messages AS m
LEFT JOIN queues AS source ON source.id = m.dead_letter_source_id
WHERE m.queue_id = :queue_id
  AND m.sent_at > statement_timestamp() - CAST(:retention AS integer) * interval '1 second'
  AND m.id > :after
  AND (CAST(:state AS text) IS NULL
       OR CAST(:state AS text) = CASE WHEN m.visible_at <= statement_timestamp() THEN 'visible'
                                      WHEN m.leased THEN 'in_flight'
                                      ELSE 'delayed' END)
ORDER BY m.id
LIMIT :limit;

-- name: create_redrive_task
-- Starts moving a dead-letter queue's messages back; fails on the unique index
-- when a task for that queue is already running.
INSERT INTO redrive_tasks (source_queue_id, destination_queue_id, max_per_second,
                           to_move_at_start)
SELECT :source_queue_id, :destination_queue_id, :max_per_second, count(*)
FROM messages
WHERE queue_id = :source_queue_id
RETURNING id;

-- name: get_redrive_task
-- A task with its queues' names and what is left to move, counted live.
SELECT t.id, t.status, t.moved, t.to_move_at_start, t.max_per_second, t.failure,
       t.created_at, t.updated_at, source.name AS source, destination.name AS destination,
       (SELECT count(*) FROM messages AS m
        WHERE m.queue_id = t.source_queue_id
          AND coalesce(t.destination_queue_id, m.dead_letter_source_id) IS NOT NULL
       ) AS remaining
FROM redrive_tasks AS t
JOIN queues AS source ON source.id = t.source_queue_id
LEFT JOIN queues AS destination ON destination.id = t.destination_queue_id
WHERE t.id = :task_id;

-- name: list_redrive_tasks
-- The tasks of one dead-letter queue, newest first.
SELECT t.id
FROM redrive_tasks AS t
WHERE t.source_queue_id = :source_queue_id
ORDER BY t.created_at DESC
LIMIT :limit;

-- name: cancel_redrive_task
-- Stops a running task; what it moved stays moved.
UPDATE redrive_tasks
SET status = 'cancelled', updated_at = statement_timestamp()
WHERE id = :task_id AND status = 'running'
RETURNING id;

-- name: take_redrive_task
-- A running task nobody holds (its runner finished a batch or died), taken
-- for :hold seconds.
UPDATE redrive_tasks
SET runner_until = statement_timestamp() + CAST(:hold AS integer) * interval '1 second'
WHERE id = (SELECT id FROM redrive_tasks
            WHERE status = 'running' AND runner_until <= statement_timestamp()
            ORDER BY created_at
            LIMIT 1
            FOR UPDATE SKIP LOCKED)
RETURNING id, max_per_second;

-- name: redrive_batch
-- Moves up to :batch visible messages of a task's dead-letter queue back to
-- their source queue (or the task's destination), with a fresh receive count,
-- and counts them on the task, all in one transaction: a crash rolls back a
-- whole batch, so nothing is lost or duplicated. Messages being inspected
-- (in flight) wait for a later batch; ones with nowhere to go stay.
WITH task AS (
    SELECT * FROM redrive_tasks WHERE id = :task_id AND status = 'running' FOR UPDATE
),
batch AS (
    SELECT m.id, coalesce(task.destination_queue_id, m.dead_letter_source_id) AS destination
    FROM messages AS m, task
    WHERE m.queue_id = task.source_queue_id
      AND m.visible_at <= statement_timestamp()
      AND coalesce(task.destination_queue_id, m.dead_letter_source_id) IS NOT NULL
    ORDER BY m.id
    LIMIT :batch
    FOR UPDATE OF m SKIP LOCKED
),
moved AS (
    UPDATE messages AS m
    SET queue_id = batch.destination,
        dead_letter_source_id = NULL,
        receive_count = 0,
        claim_token = NULL,
        fencing_token = NULL,
        leased = false,
        first_received_at = NULL,
        visible_at = statement_timestamp()
    FROM batch
    WHERE m.id = batch.id
    RETURNING m.queue_id
),
counted AS (
    UPDATE redrive_tasks AS t
    SET moved = t.moved + (SELECT count(*) FROM moved),
        updated_at = statement_timestamp(),
        runner_until = statement_timestamp() + CAST(:hold AS integer) * interval '1 second',
        status = CASE WHEN (SELECT count(*) FROM batch) < :batch THEN 'completed'
                      ELSE t.status END
    FROM task
    WHERE t.id = task.id
    RETURNING t.status
)
SELECT (SELECT status FROM counted) AS status,
       (SELECT count(*) FROM moved) AS moved,
       (SELECT array_agg(DISTINCT queue_id) FROM moved) AS destinations;

-- name: messages_vacuum_state
-- Whether autovacuum looks after the messages table (the server's setting and
-- the table's own), and its dead and live tuples by the cumulative statistics.
SELECT current_setting('autovacuum')::boolean
       AND coalesce((SELECT option_value::boolean
                     FROM pg_options_to_table(c.reloptions)
                     WHERE option_name = 'autovacuum_enabled'), true) AS autovacuum,
       coalesce(s.n_dead_tup, 0) AS dead,
       coalesce(s.n_live_tup, 0) AS live
FROM pg_class AS c
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid = CAST('messages' AS regclass);

-- name: try_vacuum_lock
-- One process of a deployment vacuums at a time; the others skip their turn.
SELECT pg_try_advisory_lock(hashtext('leaseq: vacuum messages')) AS locked;

-- name: vacuum_unlock
SELECT pg_advisory_unlock(hashtext('leaseq: vacuum messages'));

-- name: vacuum_messages
VACUUM (ANALYZE) messages;
