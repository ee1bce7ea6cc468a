-- Every statement the queue engine runs, named and written out in full.
--
-- Time: every deadline is computed here, on the database clock. A deadline is
-- compared with statement_timestamp() -- the start of the current statement,
-- stable within a statement (so the claim index can be used) but, unlike
-- now(), not frozen for a whole transaction -- and written from the moment of
-- the write (the fragment written). Python never supplies a timestamp, only
-- durations in whole seconds and, back to the claims, the floors they reported
-- (app/queue/floors.py).
--
-- Tables: `leaseq.messages` is partitioned by generation (migration 0022). The
-- statements on one message or one claim name the generation,
-- `leaseq.messages_g0`, as cheap as a plain table; through the parent a claim
-- costs twice as much to plan and to run. What reads a queue whole, and seldom,
-- reads the parent, so that it will see every generation.
--
-- Plans: statements run on connections that plan every execution for its
-- parameters and the table's current size (app/db/engine.py), except those
-- marked `-- plan: cached`, whose plan cannot turn bad (rows found by primary
-- key, an INSERT): they run on connections that keep PostgreSQL's cached plans.
--
-- Notifications: pg_notify('leaseq', leaseq.notice(queue, ready, due_in)) is
-- issued in the transaction of every write that makes a message visible sooner
-- (the text is formatted only by that function, migration 0006); PostgreSQL
-- delivers it on commit, so a woken receiver always finds the committed row.

-- fragment: queue_columns
-- A queue as app/queue/rows.py QueueRow reads it (`q`, its dead-letter queue `d`).
q.id, q.name, q.visibility_timeout, q.message_retention, q.delay, q.receive_wait,
q.max_message_bytes, q.dead_letter_queue_id, d.name AS dead_letter_queue,
q.max_receive_count, q.retry_initial, q.retry_multiplier, q.retry_max, q.retry_jitter,
q.fifo, q.content_based_deduplication, q.deduplication_scope, q.fifo_throughput_limit,
q.deduplicates_by, q.policy, q.kms_master_key_id, q.kms_data_key_reuse_period, q.sqs_managed_sse,
q.redrive_allow_policy, q.redrive_sources,
q.fair, q.fair_in_flight_share, q.fair_in_flight_min, q.fair_processing_share,
q.created_at, q.updated_at

-- name: create_queue
-- returns: QueueRow
-- Creates a queue; returns no row when the name is already taken.
WITH created AS (
    INSERT INTO leaseq.queues (name, visibility_timeout, message_retention, delay, receive_wait,
                        max_message_bytes, dead_letter_queue_id, max_receive_count,
                        retry_initial, retry_multiplier, retry_max, retry_jitter, tags,
                        fifo, content_based_deduplication, deduplication_scope,
                        deduplicates_by, fifo_throughput_limit, policy, kms_master_key_id,
                        kms_data_key_reuse_period, sqs_managed_sse, redrive_allow_policy,
                        redrive_sources, fair_in_flight_share, fair_in_flight_min,
                        fair_processing_share)
    VALUES (:name, :visibility_timeout, :message_retention, :delay, :receive_wait,
            :max_message_bytes, :dead_letter_queue_id, :max_receive_count,
            :retry_initial, :retry_multiplier, :retry_max, :retry_jitter,
            CAST(:tags AS jsonb), :fifo, :content_based_deduplication, :deduplication_scope,
            :deduplication_scope, :fifo_throughput_limit, :policy, :kms_master_key_id, :kms_data_key_reuse_period,
            :sqs_managed_sse, :redrive_allow_policy, :redrive_sources, :fair_in_flight_share,
            :fair_in_flight_min, :fair_processing_share)
    ON CONFLICT (name) DO NOTHING
    RETURNING *
)
SELECT
{{queue_columns}}
FROM created AS q
LEFT JOIN leaseq.queues AS d ON d.id = q.dead_letter_queue_id;

-- name: get_queue
-- returns: QueueRow
-- One queue by name, with its dead-letter queue's name.
SELECT
{{queue_columns}}
FROM leaseq.queues AS q
LEFT JOIN leaseq.queues AS d ON d.id = q.dead_letter_queue_id
WHERE q.name = :name;

-- name: get_queue_for_update
-- returns: QueueRow
-- The same, locked: a change reads and writes one version of the queue.
SELECT
{{queue_columns}}
FROM leaseq.queues AS q
LEFT JOIN leaseq.queues AS d ON d.id = q.dead_letter_queue_id
WHERE q.name = :name
FOR UPDATE OF q;

-- name: queue_id_by_name
-- returns: QueueIdRow
-- A queue's id, type and allowed sources, to resolve a dead-letter queue named
-- in a redrive policy; FOR SHARE keeps it from being deleted, or its allowed
-- sources changed, before the policy is committed.
SELECT id, fifo, redrive_sources FROM leaseq.queues WHERE name = :name FOR SHARE;

-- name: list_queues
-- returns: QueueRow
-- Queues whose name starts with a prefix, in name order, one page after a name;
-- with :like (LIKE patterns), only the names matching one of them: a key's page
-- is full of queues it may read, and its last name, the next page's cursor, is one.
SELECT
{{queue_columns}}
FROM leaseq.queues AS q
LEFT JOIN leaseq.queues AS d ON d.id = q.dead_letter_queue_id
WHERE starts_with(q.name, :prefix) AND q.name > :after
  AND (CAST(:like AS text[]) IS NULL OR q.name LIKE ANY(CAST(:like AS text[])))
ORDER BY q.name
LIMIT :limit;

-- name: update_queue
-- returns: QueueRow
-- Writes every attribute (the caller merged the change into the current ones).
WITH updated AS (
    UPDATE leaseq.queues
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
        content_based_deduplication = :content_based_deduplication,
        deduplication_scope  = :deduplication_scope,
        fifo_throughput_limit = :fifo_throughput_limit,
        policy               = :policy,
        kms_master_key_id    = :kms_master_key_id,
        kms_data_key_reuse_period = :kms_data_key_reuse_period,
        sqs_managed_sse      = :sqs_managed_sse,
        redrive_allow_policy = :redrive_allow_policy,
        redrive_sources      = :redrive_sources,
        fair_in_flight_share = :fair_in_flight_share,
        fair_in_flight_min   = :fair_in_flight_min,
        fair_processing_share = :fair_processing_share,
        updated_at           = statement_timestamp()
    WHERE id = :id
    RETURNING *
)
SELECT
{{queue_columns}}
FROM updated AS q
LEFT JOIN leaseq.queues AS d ON d.id = q.dead_letter_queue_id;

-- name: queue_names
-- returns: QueueNameRow
-- Queues' names by id (the sources of dead-lettered messages, for SQS's
-- DeadLetterQueueSourceArn).
SELECT id, name FROM leaseq.queues WHERE id = ANY(CAST(:ids AS bigint[]));

-- name: existing_queue_names
-- returns: NameRow
-- Which of these names are queues now (/metrics leaves out the series of the
-- rest: queues deleted since their series were made).
SELECT name FROM leaseq.queues WHERE name = ANY(CAST(:names AS text[]));

-- name: dead_letter_sources
-- returns: NameRow
-- Queues that name this one as their dead-letter queue.
SELECT name FROM leaseq.queues WHERE dead_letter_queue_id = :queue_id ORDER BY name;

-- name: redrive_return_queues
-- returns: NameRow
-- The queues a redrive without a destination writes into: where the messages now
-- in the dead-letter queue came from, and every queue whose policy names it
-- (messages it dead-letters meanwhile go back there too).
SELECT name FROM leaseq.queues WHERE dead_letter_queue_id = :queue_id
UNION
SELECT q.name FROM leaseq.queues AS q
WHERE q.id IN (SELECT m.dead_letter_source_id FROM leaseq.messages AS m WHERE m.queue_id = :queue_id);

-- name: lock_redrive_tasks_of_queue
-- returns: TaskIdRow
-- Before a queue is deleted: the redrive tasks moving from or to it, locked
-- first. A redrive batch locks its task, then (moving rows between queues) the
-- queues' rows; the delete takes the same locks in the same order, so it waits
-- for a running batch instead of deadlocking with it.
SELECT id FROM leaseq.redrive_tasks
WHERE source_queue_id = :queue_id OR destination_queue_id = :queue_id
ORDER BY id
FOR UPDATE;

-- name: delete_queue
-- returns: IdRow
-- Deletes a queue; its messages go with it (ON DELETE CASCADE).
DELETE FROM leaseq.queues WHERE name = :name RETURNING id;

-- name: get_queue_tags
-- returns: TagsRow
-- A queue's tags (a JSON object of strings).
SELECT CAST(tags AS text) FROM leaseq.queues WHERE id = :id;

-- name: change_queue_tags
-- returns: TagsRow
-- Adds (or overwrites) tags and removes keys, in one statement; returns the tags after.
UPDATE leaseq.queues
SET tags = (tags || CAST(:add AS jsonb)) - CAST(:remove AS text[])
WHERE id = :id
RETURNING CAST(tags AS text);

-- name: purge_queue
-- Deletes every message of a queue, whatever its state.
DELETE FROM leaseq.messages WHERE queue_id = :queue_id;

-- name: queue_stats
-- returns: QueueStatsRow
-- Live counts by state. Messages past retention are already gone for clients.
-- A FIFO queue's messages wait out its delay from their sent_at (:fifo_delay;
-- 0 for a standard queue, whose messages have their delay in visible_at).
SELECT count(*) FILTER (WHERE visible_at <= statement_timestamp()
                          AND sent_at <= statement_timestamp()
                                         - CAST(:fifo_delay AS integer) * interval '1 second')
           AS visible,
       count(*) FILTER (WHERE visible_at > statement_timestamp() AND leased) AS in_flight,
       count(*) FILTER (WHERE NOT leased
                          AND (visible_at > statement_timestamp()
                               OR sent_at > statement_timestamp()
                                            - CAST(:fifo_delay AS integer) * interval '1 second'))
           AS delayed,
       coalesce(extract(epoch FROM statement_timestamp() - min(sent_at)), 0)
           AS oldest_age_seconds
FROM leaseq.messages
WHERE queue_id = :queue_id
  AND sent_at > statement_timestamp() - CAST(:retention AS integer) * interval '1 second';

-- name: send_messages
-- returns: SentRow
-- plan: cached (an INSERT from arrays)
-- Inserts a batch in input order. The notification (app/queue/waiting.py:
-- queue:ready-now:next-due-in) wakes waiting receivers once the transaction
-- commits; every row carries the same payload, which PostgreSQL sends once.
-- A message is sent at the moment of the write (the fragment written), its
-- deadline that moment plus its delay; a `not_before` schedule is kept
-- between that moment and the end of retention.
WITH
{{written}},
{{sent}},
turned AS (
    -- A fair queue's tenants: a turn at each deadline its new messages have
    -- (one, unless they were sent with delays), which no claim that missed
    -- this send deletes (claim_fair_messages). Nothing on a queue whose
    -- messages name no tenant.
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT DISTINCT :queue_id, sent.tenant, sent.visible_at
    FROM sent
    WHERE sent.tenant IS NOT NULL
)
{{sent_answer}}

-- name: send_untenanted_messages
-- returns: SentRow
-- plan: cached (an INSERT from arrays)
-- send_messages for a batch in which no message names a tenant (a standard
-- queue's, nearly always): no tenant's bound to lower, so no second pass
-- over what was inserted.
WITH
{{written}},
{{sent}}
{{sent_answer}}

-- fragment: sent
-- The messages send_messages inserts, in input order.
sent AS (
    INSERT INTO leaseq.messages_g0 (queue_id, body, attributes, attribute_types, sender_id, trace_header,
                          tenant, sent_at, visible_at)
    SELECT :queue_id, m.body, CAST(m.attributes AS jsonb), CAST(m.attribute_types AS jsonb),
           m.sender_id, m.trace_header, m.tenant, written.at,
           CASE
               WHEN m.not_before IS NULL THEN written.at + m.delay * interval '1 second'
               -- No later than the end of its retention.
               ELSE greatest(written.at, least(m.not_before,
                                         written.at + CAST(:retention AS integer) * interval '1 second'))
           END
    FROM written, unnest(CAST(:bodies AS text[]), CAST(:attributes AS text[]),
                CAST(:attribute_types AS text[]), CAST(:sender_ids AS text[]),
                CAST(:delays AS integer[]), CAST(:not_befores AS timestamptz[]),
                CAST(:trace_headers AS text[]), CAST(:tenants AS text[]))
         WITH ORDINALITY AS m(body, attributes, attribute_types, sender_id, delay, not_before,
                              trace_header, tenant, ord)
    ORDER BY m.ord
    RETURNING id, message_id, sent_at, tenant, visible_at,
              extract(epoch FROM visible_at - (SELECT written.at FROM written)) AS due_in
)

-- fragment: sent_answer
-- What send_messages returns: each message's id and times, and the notice.
SELECT sent.message_id, sent.sent_at, sent.due_in,
       pg_notify('leaseq', leaseq.notice(CAST(:queue_id AS bigint),
           count(*) FILTER (WHERE sent.due_in <= 0) OVER (),
           CAST(min(sent.due_in) FILTER (WHERE sent.due_in > 0) OVER () AS double precision)))
           AS notified
FROM sent
ORDER BY sent.id;

-- fragment: written
-- The moment a write happens, on the database's clock, read only once the
-- writing transaction holds its transaction ID (the CASE asks for the ID
-- first): every deadline that a standard queue's claim can reach from below
-- (a send, a release, a give-back, a move to a dead-letter queue, a redrive,
-- a lease) is measured from it. A transaction whose ID was handed out after a
-- snapshot was taken therefore writes no deadline earlier than that snapshot,
-- which is what lets a claim's floor pass everything older
-- (app/queue/floors.py). A CTE, so that no UPDATE calls a volatile function
-- itself (Citus, docs/scaling.md).
written AS MATERIALIZED (
    SELECT CASE WHEN pg_current_xact_id() IS NOT NULL THEN clock_timestamp() END AS at
)

-- fragment: claim
-- What a claim writes to each message it takes (claim_messages,
-- claim_ready_messages, claim_fair_messages, claim_fifo_messages): a lease
-- from the moment of the write (the fragment written, in the statement's
-- FROM), a fresh claim token and fencing token, one more receive; the first
-- receive and the claim timed for the metrics and the lease advice.
SET visible_at        = written.at + CAST(:visibility_timeout AS integer) * interval '1 second',
    claim_token       = gen_random_uuid(),
    fencing_token     = nextval('leaseq.fencing_tokens'),
    receive_count     = m.receive_count + 1,
    leased            = true,
    first_received_at = coalesce(m.first_received_at, written.at),
    claimed_at        = written.at

-- fragment: waiting
-- A standard queue's waiting range of the index messages_by_state (never
-- received, released, delay over) from :ready_floor (NULL: from the start),
-- oldest first, locked with SKIP LOCKED. Below a floor lie only index entries
-- of row versions no claim can take, which a transaction holding back the
-- cleanup horizon keeps from VACUUM: walking them is what made a claim's cost
-- grow with the queue's history.
waiting AS (
    SELECT c.id, c.visible_at, c.receive_count, false AS lapsed
    FROM leaseq.messages_g0 AS c
    WHERE c.queue_id = :queue_id AND NOT c.leased
      AND c.visible_at >= coalesce(CAST(:ready_floor AS timestamptz), '-infinity')
      AND c.visible_at <= statement_timestamp()
      AND c.sent_at > statement_timestamp() - CAST(:retention AS integer) * interval '1 second'
      AND c.id <> ALL (CAST(:ack_ids AS bigint[]))
    ORDER BY c.visible_at
    LIMIT :max
    FOR UPDATE SKIP LOCKED
)

-- fragment: waiting_candidates
-- The claim most claims are (app/queue/floors.py, Floors.report_due): the
-- waiting range alone, a statement as cheap to plan as a claim of one range
-- was, and no floors reported (NULL), only the claim's mark (claim_xid and
-- looked_at). Leases run out are read by the claims that report.
{{waiting}},
candidates AS (
    SELECT waiting.id, waiting.receive_count, waiting.lapsed FROM waiting
),
floors AS (
    SELECT
        {{unreported_floors}}
)

-- fragment: unreported_floors
-- The floor columns of a claim that reports none (FloorColumns): NULL floors
-- and xmin, with the floors it read from and the time its transaction began.
CAST(NULL AS timestamptz) AS ready_floor, CAST(NULL AS timestamptz) AS lease_floor,
CAST(:ready_floor AS timestamptz) AS ready_from,
CAST(:lease_floor AS timestamptz) AS lease_from,
CAST(NULL AS bigint) AS snapshot_xmin, now() AS looked_at

-- fragment: floored_candidates
-- A standard queue's claimable messages, from its two ranges of the index
-- messages_by_state: waiting from :ready_floor, and leases run out from
-- :lease_floor (NULL: from the start). Each range is taken oldest first,
-- locked with SKIP LOCKED, and the oldest of both claimed (a range's rows
-- beyond them stay locked only until the commit). With the floors this
-- claim reports (floors.py decides whether they are taken).
{{waiting}},
run_out AS (
    SELECT c.id, c.visible_at, c.receive_count, true AS lapsed
    FROM leaseq.messages_g0 AS c
    WHERE c.queue_id = :queue_id AND c.leased
      AND c.visible_at >= coalesce(CAST(:lease_floor AS timestamptz), '-infinity')
      AND c.visible_at <= statement_timestamp()
      AND c.sent_at > statement_timestamp() - CAST(:retention AS integer) * interval '1 second'
      AND c.id <> ALL (CAST(:ack_ids AS bigint[]))
    ORDER BY c.visible_at
    LIMIT :max
    FOR UPDATE SKIP LOCKED
),
candidates AS (
    SELECT both_ranges.id, both_ranges.receive_count, both_ranges.lapsed
    FROM (SELECT * FROM waiting UNION ALL SELECT * FROM run_out) AS both_ranges
    ORDER BY both_ranges.visible_at
    LIMIT :max
),
floors AS (
    -- What the next claim may start from (app/queue/floors.py decides when it
    -- may): the oldest deadline come of each range as this statement's
    -- snapshot sees it, whoever holds the row and whatever its retention (a
    -- message past it is claimable again if the retention grows before the
    -- sweep), else now. With the floors it read from, the snapshot's xmin and
    -- the time this claim's transaction began.
    SELECT least(
               (SELECT min(f.visible_at) FROM leaseq.messages_g0 AS f
                WHERE f.queue_id = :queue_id AND NOT f.leased
                  AND f.visible_at >= coalesce(CAST(:ready_floor AS timestamptz), '-infinity')
                  AND f.visible_at <= statement_timestamp()),
               statement_timestamp()) AS ready_floor,
           least(
               (SELECT min(f.visible_at) FROM leaseq.messages_g0 AS f
                WHERE f.queue_id = :queue_id AND f.leased
                  AND f.visible_at >= coalesce(CAST(:lease_floor AS timestamptz), '-infinity')
                  AND f.visible_at <= statement_timestamp()),
               statement_timestamp()) AS lease_floor,
           CAST(:ready_floor AS timestamptz) AS ready_from,
           CAST(:lease_floor AS timestamptz) AS lease_from,
           CAST(CAST(pg_snapshot_xmin(pg_current_snapshot()) AS text) AS bigint) AS snapshot_xmin,
           now() AS looked_at
)

-- fragment: claim_xid
-- The claim's own transaction ID, read once its rows are written (NULL when it
-- wrote none): handed out after its snapshot was taken and after its
-- transaction began (floors.py: the mark a later claim's xmin must pass).
CAST(CAST(pg_current_xact_id_if_assigned() AS text) AS bigint) AS claim_xid

-- fragment: received_columns
-- A claimed message as its receiver gets it (app/queue/rows.py MessageColumns):
-- what every claim returns, and a replayed receive attempt.
m.id, m.message_id, m.body, CAST(m.attributes AS text) AS attributes,
CAST(m.attribute_types AS text) AS attribute_types, m.sender_id,
m.trace_header, m.receive_count, m.claim_token, m.fencing_token,
m.visible_at AS lease_expires_at, m.sent_at, m.first_received_at,
CAST(m.checkpoint AS text) AS checkpoint, m.tenant, m.dead_letter_source_id

-- fragment: dead_letter
-- What a claim writes to a message it moves to the dead-letter queue instead
-- (claim_messages, claim_fair_messages, claim_fifo_messages): claimable there
-- from the moment of the write (the fragment written, in the statement's
-- FROM), its source remembered for a redrive back. Into a fair queue, a
-- message naming no tenant is its own tenant '', as a send there makes it, so
-- that the fair claim reaches it at once (the statement then lowers the
-- tenants a turn there: dead_letter_turns).
SET queue_id              = CAST(:dead_letter_queue_id AS bigint),
    dead_letter_source_id = m.queue_id,
    visible_at            = written.at,
    leased                = false,
    tenant                = CASE WHEN (SELECT d.fair FROM leaseq.queues AS d
                                       WHERE d.id = CAST(:dead_letter_queue_id AS bigint))
                                 THEN coalesce(m.tenant, '') ELSE m.tenant END

-- name: claim_messages
-- returns: StandardClaimRow
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
-- nothing was claimed; every row carries the floors (floored_candidates).
WITH
{{written}},
{{acked}},
{{floored_candidates}},
{{claim_tail}}

-- name: claim_waiting_messages
-- returns: StandardClaimRow
-- claim_messages from the waiting range alone, reporting no floors
-- (waiting_candidates): what most claims are (floors.py, Floors.report_due).
WITH
{{written}},
{{acked}},
{{waiting_candidates}},
{{claim_tail}}

-- fragment: acked
-- The acknowledgements riding on a claim (claim_messages), deleted by it.
acked AS (
    DELETE FROM leaseq.messages_g0 AS m
    USING unnest(CAST(:ack_ids AS bigint[]), CAST(:ack_tokens AS uuid[])) AS h(id, token)
    WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id
    RETURNING m.id, CAST(extract(epoch FROM statement_timestamp() - m.claimed_at)
                         AS double precision) AS held
)

-- fragment: claim_tail
-- What claim_messages does with its candidates and floors: dead-letters those
-- received max_receive_count times, claims the others, and answers.
dead AS (
    UPDATE leaseq.messages_g0 AS m
    {{dead_letter}}
    FROM candidates AS c, written
    WHERE m.id = c.id AND c.receive_count >= CAST(:max_receive_count AS integer)
    RETURNING m.id, m.tenant
),
dead_letter_turns AS (
    {{dead_letter_turns}}
),
claimed AS (
    UPDATE leaseq.messages_g0 AS m
    {{claim}}
    FROM candidates AS c, written
    WHERE m.id = c.id
      AND (CAST(:max_receive_count AS integer) IS NULL
           OR c.receive_count < CAST(:max_receive_count AS integer))
    RETURNING
        {{received_columns}},
        c.lapsed
)
SELECT (SELECT count(*) FROM dead) AS dead,
       (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM acked) AS acked,
       (SELECT coalesce(array_agg(held ORDER BY id), '{}') FROM acked) AS acked_held,
       claimed.*, floors.*,
       {{claim_xid}}
FROM floors
LEFT JOIN claimed ON true;

-- name: claim_ready_messages
-- returns: ReadyClaimRow
-- claim_messages for the common case, in a statement a third as costly to
-- plan (planned on every execution, as the claim must be): no
-- acknowledgements ride on it and the queue has no redrive policy, so
-- nothing is deleted or moved to a dead-letter queue. A row per claimed
-- message, or one with a NULL `id` when none was claimed; every row carries
-- the floors (floored_candidates).
WITH
{{written}},
{{floored_candidates}},
{{ready_claim_tail}}

-- name: claim_ready_waiting_messages
-- returns: ReadyClaimRow
-- claim_ready_messages from the waiting range alone, reporting no floors: the
-- cheapest claim to plan, and the commonest (floors.py, Floors.report_due). A
-- row per claimed message, none when none was claimed.
WITH
{{written}},
{{waiting}}
UPDATE leaseq.messages_g0 AS m
{{claim}}
FROM waiting AS c, written
WHERE m.id = c.id
RETURNING
    {{received_columns}},
    c.lapsed,
    {{unreported_floors}},
    {{claim_xid}}
;

-- fragment: ready_claim_tail
-- What claim_ready_messages does with its candidates and floors.
claimed AS (
    UPDATE leaseq.messages_g0 AS m
    {{claim}}
    FROM candidates AS c, written
    WHERE m.id = c.id
    RETURNING
        {{received_columns}},
        c.lapsed
)
SELECT claimed.*, floors.*,
       {{claim_xid}}
FROM floors
LEFT JOIN claimed ON true;

-- name: claim_fair_messages
-- returns: FairClaimRow
-- claim_messages on a fair queue (docs/fair-queues.md): the same candidates,
-- acknowledgements and dead-letter rounds, chosen tenant by tenant. It finds
-- the tenants through their turns (leaseq.turns: a tenant may have a message
-- claimable from a turn's time on), read from the claims' floor of the queue's
-- turns (app/queue/floors.py): the quiet tenants' first turns due, as many
-- as the claim could take from and ten more, and each noisy tenant's (few:
-- each holds a share of the queue); never the queue's every tenant, nor any
-- backlog. Each gives its oldest claimable messages from its first turn on,
-- and they are taken quiet tenants first, oldest first across them, then
-- noisy tenants, the one with the fewest in flight first (the fairness round
-- counts them, and judges who is noisy, once a second). The candidates are
-- locked in that order with SKIP LOCKED as claim_messages locks its own, from
-- a list a little longer than the claim so that rows another claim holds are
-- passed.
-- The turns it read are deleted, each one it can lock (another claim may
-- hold it: that claim then writes the tenant's next turn), and for each
-- tenant whose turn it deleted it inserts the next: the tenant's earliest
-- message claimable now that it did not take, as its snapshot shows it
-- (none: nothing claimable left); and for each tenant it claimed from, a turn
-- at the end of the lease it gave. A turn is only
-- ever inserted or deleted, never updated: a write committed after this
-- claim's snapshot (a send, a release) inserts a turn of its own, which this
-- claim neither sees nor deletes, so nothing it missed is lost; and no row
-- is rewritten by every claim, whose versions a held cleanup horizon would
-- keep (docs/decisions.md, "History costs nothing, step three").
-- Every row carries the floor of the queue's turns it saw (as ready_floor and
-- lease_floor) and its mark, and the tenants of the acknowledgements it
-- carried, for the processing time this process sums (app/queue/tally.py).
WITH
{{written}},
acked AS (
    DELETE FROM leaseq.messages_g0 AS m
    USING unnest(CAST(:ack_ids AS bigint[]), CAST(:ack_tokens AS uuid[])) AS h(id, token)
    WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id
    RETURNING m.id, m.tenant,
              CAST(extract(epoch FROM statement_timestamp() - m.claimed_at)
                   AS double precision) AS held
),
noisy AS MATERIALIZED (
    -- As the fairness round last judged them, and those this process counts
    -- noisy itself from what it handed out in the current second, merged by
    -- the process (app/queue/tally.py): a burst is told at the claim that
    -- passes the thresholds, not at the next round. Not read from the
    -- tenants' rows: each takes versions every second, which a held horizon
    -- keeps, and every claim would visit them all.
    SELECT l.tenant, l.in_flight
    FROM unnest(CAST(:noisy_tenants AS text[]), CAST(:noisy_in_flight AS integer[]))
         AS l(tenant, in_flight)
),
walked AS MATERIALIZED (
    (SELECT u.ctid AS turn, u.tenant, u.at, false AS noisy
     FROM leaseq.turns AS u
     WHERE u.queue_id = :queue_id
       AND u.at >= coalesce(CAST(:ready_floor AS timestamptz), '-infinity')
       AND u.at <= statement_timestamp()
       AND u.tenant <> ALL (ARRAY(SELECT n.tenant FROM noisy AS n))
     ORDER BY u.at
     LIMIT CAST(:max AS integer) + 10)
    UNION ALL
    -- A noisy tenant's turns due (the sends' since the last claim that read
    -- it, which the quiet tenants' walk passes), as many, collapsed into one.
    SELECT u.turn, n.tenant, u.at, true
    FROM noisy AS n
    CROSS JOIN LATERAL (
        SELECT d.ctid AS turn, d.at
        FROM leaseq.turns AS d
        WHERE d.queue_id = :queue_id AND d.tenant = n.tenant
          AND d.at >= coalesce(CAST(:ready_floor AS timestamptz), '-infinity')
          AND d.at <= statement_timestamp()
        ORDER BY d.at
        LIMIT CAST(:max AS integer) + 10
    ) AS u
),
firsts AS MATERIALIZED (
    -- Each tenant walked, from its first turn: none of its messages below it
    -- is claimable (every write that makes one claimable inserts a turn at or
    -- below its deadline, and a claim deletes one only for its next).
    SELECT w.tenant, min(w.at) AS at, bool_or(w.noisy) AS noisy,
           (SELECT n.in_flight FROM noisy AS n WHERE n.tenant = w.tenant) AS in_flight
    FROM walked AS w
    GROUP BY w.tenant
),
heads AS (
    -- Each tenant's first messages claimable now, from its first turn on, one
    -- more than a claim takes: its candidates, and the first this statement
    -- leaves is its next turn. None later than now is read: each message
    -- whose deadline is to come has a turn of its own at or below it (its
    -- send's, the lease's that its claim or its last heartbeat gave, its
    -- release's), so no claim reads the leases run since (under a held
    -- horizon, every message settled in the last visibility timeout).
    SELECT f.tenant, f.noisy, f.in_flight, h.id, h.visible_at
    FROM firsts AS f
    CROSS JOIN LATERAL (
        SELECT c.id, c.visible_at
        FROM leaseq.messages_g0 AS c
        WHERE c.queue_id = :queue_id AND c.tenant = f.tenant
          AND c.visible_at >= f.at AND c.visible_at <= statement_timestamp()
          AND c.sent_at > statement_timestamp()
                          - CAST(:retention AS integer) * interval '1 second'
        ORDER BY c.visible_at
        LIMIT CAST(:max AS integer) + 1
    ) AS h
),
candidates AS (
    -- The ranked ids as an array, each then found by its primary key: a join
    -- would be planned from the estimate of `heads` (tenants times a
    -- receive's count), which can make it read the whole table instead. The
    -- state is checked as a filter (IS TRUE), never an index condition: read
    -- through messages_by_state, the claimable range holds an entry for each
    -- version a held horizon keeps.
    SELECT c.id, c.receive_count, c.leased AS lapsed
    FROM unnest(ARRAY(
             SELECT h.id
             FROM heads AS h
             ORDER BY h.noisy, CASE WHEN h.noisy THEN h.in_flight END, h.visible_at, h.id
             LIMIT 2 * CAST(:max AS integer) + 10))
         WITH ORDINALITY AS r(id, place)
    JOIN leaseq.messages_g0 AS c ON c.id = r.id
    WHERE (c.queue_id = :queue_id
           AND c.visible_at <= statement_timestamp()
           AND c.sent_at > statement_timestamp()
                           - CAST(:retention AS integer) * interval '1 second') IS TRUE
      AND c.id <> ALL (CAST(:ack_ids AS bigint[]))
    ORDER BY r.place
    LIMIT :max
    FOR UPDATE OF c SKIP LOCKED
),
dead AS (
    UPDATE leaseq.messages_g0 AS m
    {{dead_letter}}
    FROM candidates AS c, written
    WHERE m.id = c.id AND c.receive_count >= CAST(:max_receive_count AS integer)
    RETURNING m.id, m.tenant
),
dead_letter_turns AS (
    {{dead_letter_turns}}
),
claimed AS (
    UPDATE leaseq.messages_g0 AS m
    {{claim}}
    FROM candidates AS c, written
    WHERE m.id = c.id
      AND (CAST(:max_receive_count AS integer) IS NULL
           OR c.receive_count < CAST(:max_receive_count AS integer))
    RETURNING
        {{received_columns}},
        c.lapsed
),
taken AS MATERIALIZED (
    SELECT id FROM claimed UNION ALL SELECT id FROM dead UNION ALL SELECT id FROM acked
),
nexts AS (
    -- Each tenant walked: its first message read that this statement did not
    -- take (every one claimable from its first turn was read when fewer than
    -- a claim's count and one came back; none: nothing claimable is left).
    SELECT h.tenant, min(h.visible_at) AS at
    FROM heads AS h
    WHERE h.id NOT IN (SELECT id FROM taken)
    GROUP BY h.tenant
),
gone AS (
    DELETE FROM leaseq.turns AS u
    WHERE u.ctid = ANY (ARRAY(
        SELECT l.ctid
        FROM leaseq.turns AS l
        WHERE l.ctid = ANY (ARRAY(SELECT w.turn FROM walked AS w))
        FOR UPDATE SKIP LOCKED))
    RETURNING u.tenant, u.at
),
turned AS (
    -- No earlier than the first turn it deleted of the tenant: what lies
    -- below is another claim's (it holds that turn, and writes the next from
    -- a snapshot that saw as much), and a turn inserted below every one its
    -- writer deleted could fall under a floor another claim reports meanwhile
    -- (floors.py).
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT :queue_id, n.tenant, greatest(n.at, g.at)
    FROM nexts AS n
    JOIN (SELECT g.tenant, min(g.at) AS at FROM gone AS g GROUP BY g.tenant) AS g
      ON g.tenant = n.tenant
    UNION ALL
    -- And the end of the lease it gave each tenant it claimed from, whatever
    -- turn it deleted: a message whose lease lapses is claimable then.
    SELECT DISTINCT :queue_id, c.tenant,
           written.at + CAST(:visibility_timeout AS integer) * interval '1 second'
    FROM claimed AS c, written
    WHERE c.tenant IS NOT NULL
),
{{turn_floors}}
SELECT (SELECT count(*) FROM dead) AS dead,
       (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM acked) AS acked,
       (SELECT coalesce(array_agg(held ORDER BY id), '{}') FROM acked) AS acked_held,
       (SELECT coalesce(array_agg(tenant ORDER BY id), '{}') FROM acked) AS acked_tenants,
       claimed.*,
       floors.ready_floor, floors.ready_floor AS lease_floor,
       floors.ready_from, floors.ready_from AS lease_from,
       floors.snapshot_xmin, floors.looked_at,
       {{claim_xid}}
FROM floors
LEFT JOIN claimed ON true;

-- fragment: turn_floors
-- A fair or FIFO claim's report (claim_fair_messages, claim_fifo_messages):
-- the earliest turn due at or above the floor given, as this statement's
-- snapshot sees it, else now (floors.py takes it when it may): one range,
-- reported as both of a standard claim's.
floors AS (
    SELECT least((SELECT min(u.at) FROM leaseq.turns AS u
                  WHERE u.queue_id = :queue_id
                    AND u.at >= coalesce(CAST(:ready_floor AS timestamptz), '-infinity')
                    AND u.at <= statement_timestamp()),
                 statement_timestamp()) AS ready_floor,
           CAST(:ready_floor AS timestamptz) AS ready_from,
           CAST(CAST(pg_snapshot_xmin(pg_current_snapshot()) AS text) AS bigint) AS snapshot_xmin,
           now() AS looked_at
)

-- fragment: dead_letter_turns
-- The tenants of the messages a claim moved (`dead`) to a fair dead-letter
-- queue: a turn each there, from the moment of the write.
INSERT INTO leaseq.turns (queue_id, tenant, at)
SELECT CAST(:dead_letter_queue_id AS bigint), d.tenant, written.at
FROM (SELECT DISTINCT dead.tenant FROM dead WHERE dead.tenant IS NOT NULL) AS d, written
WHERE (SELECT q.fair FROM leaseq.queues AS q
       WHERE q.id = CAST(:dead_letter_queue_id AS bigint))

-- name: delete_fair_messages
-- returns: FairDeletedRow
-- plan: cached (rows by primary key, index probes by tenant and deadline)
-- delete_messages on a fair queue, with each message's tenant for the
-- processing time this process sums (app/queue/tally.py). No tenant's row is
-- written; the turn at the end of a lease goes with the last message it was
-- for (ended_turns).
WITH deleted AS (
    DELETE FROM leaseq.messages_g0 AS m
    USING unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[])) AS h(id, token)
    WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id
    RETURNING m.id, m.tenant, m.visible_at,
              CAST(extract(epoch FROM statement_timestamp() - m.claimed_at) AS double precision)
                  AS held
),
ended AS (
    SELECT d.id, d.tenant, d.visible_at AS ended_at FROM deleted AS d
),
{{ended_turns}}
SELECT id, tenant, held FROM deleted;

-- fragment: ended_turns
-- The turns at the lease ends a statement moved its messages away from
-- (`ended`: id, tenant, ended_at), each deleted once no other message of its
-- tenant is left at that deadline: a claim inserts one at the end of each
-- lease it gives, a heartbeat at the new end, and left to come due each would
-- cost a claim a look, and the table a row for a visibility timeout. Only
-- turns to come: one due is the claims' to read. A turn another statement
-- holds is waited for (an acknowledgement's or a heartbeat's: a claim locks
-- only turns due, and never waits).
gone_turns AS (
    DELETE FROM leaseq.turns AS u
    USING (SELECT DISTINCT e.tenant, e.ended_at FROM ended AS e
           WHERE e.tenant IS NOT NULL AND e.ended_at > statement_timestamp()) AS e
    WHERE u.queue_id = :queue_id AND u.tenant = e.tenant AND u.at = e.ended_at
      AND NOT EXISTS (SELECT 1 FROM leaseq.messages_g0 AS o
                      WHERE o.queue_id = :queue_id AND o.tenant = e.tenant
                        AND o.visible_at = e.ended_at
                        AND o.id <> ALL (ARRAY(SELECT n.id FROM ended AS n)))
)

-- fragment: decayed_busy
-- A tenant's processing time (`t`), decayed to now: recent time weighs most,
-- an hour ago's next to nothing (e-fold time one minute). In double
-- precision: extract() gives a numeric, whose exp() cost the fairness round a
-- millisecond for every 500 tenants.
t.busy * exp(-least(CAST(extract(epoch FROM statement_timestamp() - t.busy_at)
                         AS double precision), 3600) / 60)

-- name: change_fair_visibility
-- returns: ChangedRow
-- plan: cached (rows by primary key, an INSERT)
-- change_visibility on a fair queue: each tenant a turn at its messages' new
-- deadline (a heartbeat's, a release's): a claim reads no message whose
-- deadline is to come (claim_fair_messages), so each one has a turn of its
-- own. The turn at the lease's old end goes once no message is left there
-- (ended_turns).
WITH
{{written}},
changed AS (
    UPDATE leaseq.messages_g0 AS m
    SET visible_at = written.at + h.visibility_timeout * interval '1 second',
        leased     = h.visibility_timeout > 0
    FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[]),
                CAST(:visibility_timeouts AS integer[])) AS h(id, token, visibility_timeout),
         leaseq.messages_g0 AS before, written
    WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id
      AND before.id = m.id
    RETURNING m.id, m.tenant, m.visible_at AS lease_expires_at, h.visibility_timeout,
              m.visible_at < before.visible_at AS sooner, before.visible_at AS ended_at
),
turned AS (
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT DISTINCT :queue_id, c.tenant, c.lease_expires_at
    FROM changed AS c
    WHERE c.tenant IS NOT NULL
),
ended AS (
    SELECT c.id, c.tenant, c.ended_at FROM changed AS c
),
{{ended_turns}}
SELECT id, lease_expires_at, visibility_timeout, sooner FROM changed;

-- fragment: given_back
-- What a give-back writes (give_back_claims, give_back_fair_claims): the
-- messages of claims that reached no one visible again from the moment of the
-- write (the fragment written), and the receive each claim counted taken back.
UPDATE leaseq.messages_g0 AS m
SET visible_at        = written.at,
    leased            = false,
    receive_count     = m.receive_count - 1,
    first_received_at = CASE WHEN m.receive_count = 1 THEN NULL
                             ELSE m.first_received_at END
FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[])) AS h(id, token), written
WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id

-- name: give_back_fair_claims
-- returns: GivenBackRow
-- plan: cached (rows by primary key, an INSERT)
-- give_back_claims on a fair queue: the tenants of the messages given back
-- are claimable again at once (a turn each, from the moment of the write).
WITH
{{written}},
given AS (
    {{given_back}}
    RETURNING m.id, m.tenant
),
turned AS (
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT DISTINCT :queue_id, g.tenant, written.at
    FROM given AS g, written
    WHERE g.tenant IS NOT NULL
)
SELECT count(*) AS given,
       pg_notify('leaseq', leaseq.notice(CAST(:queue_id AS bigint), count(*), NULL)) AS notified
FROM given
HAVING count(*) > 0;

-- name: make_fair
-- returns: MadeFairRow
-- A standard queue becomes fair (migration 0015's leaseq.make_fair, which the
-- SQL API's sends call too); false when it already was.
SELECT leaseq.make_fair(CAST(:queue_id AS bigint)) AS made;

-- name: without_jit
-- For the rest of the transaction, no JIT compilation: the fairness round's
-- plan passes jit_above_cost once a queue has tens of thousands of tenants
-- (it must count every one of them among those it may look up), and
-- compiling it took eight times as long as running it (1.2 s of 1.35 s at
-- 100,000 tenants).
SET LOCAL jit = off;

-- name: fairness_round
-- returns: FairnessRoundRow
-- Once a second, for every fair queue: each tenant's messages in flight
-- counted from the messages (the claims do not count them: a count kept by
-- every claim and acknowledgement is a row rewritten by each, whose versions
-- a held cleanup horizon keeps), its processing time decayed, and who is
-- noisy now: a tenant with messages waiting that has sent in the last five
-- minutes, above the queue's in-flight thresholds or its processing-time
-- share. A tenant with nothing in flight, not noisy and no processing time
-- left is forgotten: its row holds nothing a claim needs (its turns do),
-- unless a write moved its version on since this statement's snapshot.
-- Every tenant's row is read (its processing time counts in the queue's
-- total), but only those the round may change are looked up in the messages:
-- a tenant with messages in flight (by its row or by the count), noisy, or
-- above the processing-time share. The rest are quiet and stay so: a tenant
-- with nothing in flight is under the in-flight thresholds. Only rows whose
-- state changed are written, their processing time decayed as they are now
-- (a process may have added some since this snapshot).
WITH fair AS (
    -- With the floor of its turns that the claims of the process running the
    -- round hold (none: from the start): every message claimable now has a
    -- turn at or below its deadline, and every turn is at or above the floor,
    -- so none lies below it. The looks into a tenant's messages start there:
    -- under a held horizon, below it lie only the versions of what was settled.
    SELECT q.id, q.fair_in_flight_share AS share, q.fair_in_flight_min AS least_in_flight,
           q.fair_processing_share AS busy_share, q.message_retention AS retention,
           coalesce(f.floor, '-infinity') AS floor
    FROM leaseq.queues AS q
    LEFT JOIN unnest(CAST(:floor_queues AS bigint[]), CAST(:floors AS timestamptz[]))
              AS f(queue_id, floor)
           ON f.queue_id = q.id
    WHERE q.fair
),
flight AS (
    -- The leased range of each fair queue's messages_by_state: no backlog is read,
    -- and nothing at all while no queue is fair.
    SELECT m.queue_id, m.tenant, count(*) AS n
    FROM leaseq.messages AS m
    WHERE m.queue_id = ANY (ARRAY(SELECT id FROM fair))
      AND m.visible_at > statement_timestamp() AND m.leased AND m.tenant IS NOT NULL
    GROUP BY m.queue_id, m.tenant
),
known AS (
    SELECT t.queue_id, t.tenant, t.busy, t.busy_at, t.in_flight, t.noisy, t.sending, t.version
    FROM fair AS q
    JOIN leaseq.tenants AS t ON t.queue_id = q.id
),
now_counted AS (
    SELECT coalesce(t.queue_id, f.queue_id) AS queue_id,
           coalesce(t.tenant, f.tenant) AS tenant,
           coalesce(f.n, 0) AS in_flight,
           coalesce(
               {{decayed_busy}},
               0) AS busy,
           t.tenant IS NOT NULL AS known, t.in_flight AS was_in_flight, t.noisy AS was_noisy,
           t.sending AS was_sending, t.version AS seen_version
    FROM known AS t
    FULL JOIN flight AS f ON f.queue_id = t.queue_id AND f.tenant = t.tenant
),
totals AS (
    SELECT queue_id, sum(in_flight) AS in_flight, sum(busy) AS busy
    FROM now_counted
    GROUP BY queue_id
),
marked AS (
    SELECT c.*, q.retention, q.floor,
           (c.in_flight >= q.least_in_flight AND c.in_flight > q.share * s.in_flight)
           OR (s.busy > 0 AND c.busy > q.busy_share * s.busy) AS above,
           NOT c.known OR c.in_flight > 0 OR c.was_in_flight > 0 OR c.was_noisy
           OR (s.busy > 0 AND c.busy > q.busy_share * s.busy) AS looked
    FROM now_counted AS c
    JOIN totals AS s USING (queue_id)
    JOIN fair AS q ON q.id = c.queue_id
),
verdicts AS (
    SELECT m.queue_id, m.tenant, m.in_flight, m.busy, m.known, m.was_in_flight,
           m.was_noisy, m.was_sending, m.seen_version,
           coalesce(l.sending, m.was_sending) AS sending,
           coalesce(m.tenant <> '' AND m.above AND l.waiting AND l.sending, false) AS noisy
    FROM marked AS m
    LEFT JOIN LATERAL (
        -- Only for the tenants looked up (a one-time filter on the rest).
        SELECT EXISTS (SELECT 1 FROM leaseq.messages AS w
                       WHERE w.queue_id = m.queue_id AND w.tenant = m.tenant
                         AND w.visible_at >= m.floor
                         AND w.visible_at <= statement_timestamp()
                         AND w.sent_at > statement_timestamp()
                                         - m.retention * interval '1 second') AS waiting,
               -- Sent in the last five minutes: such a message is still
               -- stored (a noisy tenant's newest wait behind its oldest), and
               -- its deadline is no earlier than its sending.
               EXISTS (SELECT 1 FROM leaseq.messages AS s
                       WHERE s.queue_id = m.queue_id AND s.tenant = m.tenant
                         AND s.visible_at > statement_timestamp() - interval '5 minutes'
                         AND s.visible_at >= m.floor
                         AND s.sent_at > statement_timestamp() - interval '5 minutes') AS sending
        WHERE m.looked
    ) AS l ON true
),
kept AS (
    INSERT INTO leaseq.tenants AS t (queue_id, tenant, in_flight, noisy, sending)
    SELECT v.queue_id, v.tenant, v.in_flight, v.noisy, v.sending
    FROM verdicts AS v
    WHERE (v.in_flight > 0 OR v.noisy OR v.busy >= 0.001)
      AND (NOT v.known
           OR (v.in_flight, v.noisy, v.sending)
              IS DISTINCT FROM (v.was_in_flight, v.was_noisy, v.was_sending))
    ORDER BY v.queue_id, v.tenant
    ON CONFLICT (queue_id, tenant) DO UPDATE
    SET in_flight = EXCLUDED.in_flight,
        busy      =
            {{decayed_busy}},
        busy_at   = statement_timestamp(),
        noisy     = EXCLUDED.noisy,
        sending   = EXCLUDED.sending
    RETURNING t.tenant
),
forgotten AS (
    -- Rows a process's processing time holds now are left for the next
    -- round: this statement waits only in tenant order, as the others do. A
    -- row whose version moved on since the snapshot (processing time added)
    -- stays.
    DELETE FROM leaseq.tenants AS t
    WHERE (t.queue_id, t.tenant) IN (
        SELECT f.queue_id, f.tenant
        FROM leaseq.tenants AS f
        JOIN verdicts AS v ON v.queue_id = f.queue_id AND v.tenant = f.tenant
        WHERE v.known AND v.in_flight = 0 AND NOT v.noisy AND v.busy < 0.001
          AND f.version = v.seen_version
        FOR UPDATE OF f SKIP LOCKED)
    RETURNING t.tenant
)
SELECT (SELECT count(*) FROM fair) AS queues,
       (SELECT count(*) FROM now_counted) - (SELECT count(*) FROM forgotten) AS tenants,
       (SELECT count(*) FROM verdicts WHERE noisy) AS noisy,
       (SELECT count(*) FROM forgotten) AS forgotten;

-- name: add_busy
-- plan: cached (an upsert from arrays)
-- The processing time this process's acknowledgements of fair queues'
-- messages held, summed per tenant and written once a second
-- (app/queue/tally.py): a tenant's row takes versions at that pace, not one
-- per acknowledgement. Added to what the row holds, decayed to now; the
-- version moved on (the round then forgets no row it has not seen so). In
-- tenant order, as every writer of these rows. A queue no longer fair (or
-- gone) gets nothing.
INSERT INTO leaseq.tenants AS t (queue_id, tenant, busy)
SELECT b.queue_id, b.tenant, b.busy
FROM unnest(CAST(:queue_ids AS bigint[]), CAST(:tenants AS text[]),
            CAST(:busy AS double precision[])) AS b(queue_id, tenant, busy)
WHERE EXISTS (SELECT 1 FROM leaseq.queues AS q WHERE q.id = b.queue_id AND q.fair)
ORDER BY b.queue_id, b.tenant
ON CONFLICT (queue_id, tenant) DO UPDATE
SET busy    =
        {{decayed_busy}}
        + EXCLUDED.busy,
    busy_at = statement_timestamp(),
    version = t.version + 1;

-- name: judged_noisy
-- returns: JudgedNoisyRow
-- The tenants the fairness round last judged noisy, in every fair queue, with
-- their messages in flight: read by each process once a second
-- (app/queue/tally.py) and handed to its claims, which no longer read the
-- tenants' rows themselves.
SELECT t.queue_id, t.tenant, t.in_flight
FROM leaseq.tenants AS t
WHERE t.noisy;

-- name: forget_turns
-- Before a purge of a fair or FIFO queue, in its transaction: its turns as
-- this snapshot has them, deleted, so that the purged tenants (groups) do not
-- each cost a claim a look. A send committed since keeps its turn (its message too, or
-- the purge's later snapshot deletes it, and its turn then finds nothing).
DELETE FROM leaseq.turns WHERE queue_id = :queue_id;

-- name: adopt_strays
-- returns: RepairedRow
-- Messages of a fair queue that name no tenant, sent by a process that had
-- not yet heard the queue became fair, given the tenant '' (and its turns):
-- the fair claim reaches only messages with a tenant.
-- Every message of each fair queue is read, so this runs seldom.
WITH adopted AS (
    UPDATE leaseq.messages AS m
    SET tenant = ''
    WHERE m.queue_id = ANY (ARRAY(SELECT q.id FROM leaseq.queues AS q WHERE q.fair))
      AND m.tenant IS NULL
    RETURNING m.id, m.queue_id, m.visible_at
),
turned AS (
    -- One at the earliest due, and one at each deadline to come (a claim
    -- reads no message whose deadline is to come).
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT a.queue_id, '', min(a.visible_at)
    FROM adopted AS a
    GROUP BY a.queue_id,
             CASE WHEN a.visible_at > statement_timestamp() THEN a.visible_at END
    RETURNING queue_id
)
SELECT count(*) AS swept,
       {{floors_reset}}
FROM adopted;

-- fragment: floors_reset
-- A repair's turns are at the deadlines of messages it found stranded, which
-- may lie below the floors the claims read from (app/queue/floors.py): each
-- queue given one is told changed, and every process's claims of it read from
-- the start again (app/queue/catalog.py).
(SELECT count(pg_notify('leaseq', format('%s:%s', t.queue_id, 'changed')))
 FROM (SELECT DISTINCT queue_id FROM turned) AS t) AS told

-- name: restore_turns
-- returns: RepairedRow
-- Every tenant with a message on a fair queue has a turn at or below its
-- earliest message: each writer sees to it. This puts it right where a writer
-- did not (a process of a version from before the turns, during a rolling
-- upgrade): the tenants found through messages_tenant_claim (a loose index
-- scan, one probe per tenant), and a turn inserted for each one without.
-- Seldom, as adopt_strays.
WITH RECURSIVE seen (queue_id, tenant) AS (
    SELECT q.id,
           (SELECT m.tenant FROM leaseq.messages AS m
            WHERE m.queue_id = q.id AND m.tenant IS NOT NULL
            ORDER BY m.tenant LIMIT 1)
    FROM leaseq.queues AS q
    WHERE q.fair
    UNION ALL
    SELECT s.queue_id,
           (SELECT m.tenant FROM leaseq.messages AS m
            WHERE m.queue_id = s.queue_id AND m.tenant > s.tenant
            ORDER BY m.tenant LIMIT 1)
    FROM seen AS s
    WHERE s.tenant IS NOT NULL
),
heads AS (
    SELECT s.queue_id, s.tenant,
           (SELECT m.visible_at FROM leaseq.messages AS m
            WHERE m.queue_id = s.queue_id AND m.tenant = s.tenant
            ORDER BY m.visible_at LIMIT 1) AS at
    FROM seen AS s
    WHERE s.tenant IS NOT NULL
),
turned AS (
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT h.queue_id, h.tenant, h.at
    FROM heads AS h
    WHERE NOT EXISTS (SELECT 1 FROM leaseq.turns AS k
                      WHERE k.queue_id = h.queue_id AND k.tenant = h.tenant
                        AND k.at <= h.at)
    RETURNING queue_id
)
SELECT count(*) AS swept,
       {{floors_reset}}
FROM turned;

-- name: fair_queue_stats
-- returns: FairStatsRow
-- A fair queue's tenants as operators see them (SQS's noisy-group metrics):
-- noisy tenants, and the quiet tenants' messages visible, in flight and the
-- age of their oldest visible one; a message that names no tenant is quiet.
SELECT (SELECT count(*) FROM leaseq.tenants AS t
        WHERE t.queue_id = :queue_id AND t.noisy) AS noisy_tenants,
       count(*) FILTER (WHERE m.visible_at <= statement_timestamp()) AS quiet_visible,
       count(*) FILTER (WHERE m.visible_at > statement_timestamp() AND m.leased)
           AS quiet_in_flight,
       coalesce(extract(epoch FROM statement_timestamp()
                          - min(m.sent_at) FILTER (
                                WHERE m.visible_at <= statement_timestamp())), 0)
           AS quiet_oldest_age_seconds
FROM leaseq.messages AS m
WHERE m.queue_id = :queue_id
  AND m.sent_at > statement_timestamp() - CAST(:retention AS integer) * interval '1 second'
  AND NOT EXISTS (SELECT 1 FROM leaseq.tenants AS t
                  WHERE t.queue_id = m.queue_id AND t.tenant = m.tenant AND t.noisy);

-- name: top_tenants
-- returns: TenantBacklogRow
-- A fair queue's tenants with the most messages stored, and each one's state.
SELECT m.tenant,
       count(*) FILTER (WHERE m.visible_at <= statement_timestamp()) AS visible,
       count(*) FILTER (WHERE m.visible_at > statement_timestamp() AND m.leased) AS in_flight,
       coalesce(bool_or(t.noisy), false) AS noisy
FROM leaseq.messages AS m
LEFT JOIN leaseq.tenants AS t ON t.queue_id = m.queue_id AND t.tenant = m.tenant
WHERE m.queue_id = :queue_id AND m.tenant IS NOT NULL AND m.tenant <> ''
  AND m.sent_at > statement_timestamp() - CAST(:retention AS integer) * interval '1 second'
GROUP BY m.tenant
ORDER BY count(*) DESC, m.tenant
LIMIT :limit;

-- name: queue_outlook
-- returns: OutlookRow
-- For waiting receivers, after a claim: whether more messages are claimable
-- now, and the seconds (by the database clock) until the next one becomes
-- claimable (a delay ending or a lease expiring; NULL when none is pending).
-- Each of the two ranges of messages_by_state read apart (from the claims'
-- floors where it looks back: floored_candidates).
SELECT extract(epoch FROM least(
           (SELECT min(visible_at)
            FROM leaseq.messages_g0
            WHERE queue_id = :queue_id AND NOT leased
              AND visible_at > statement_timestamp()
              AND sent_at > statement_timestamp()
                            - CAST(:retention AS integer) * interval '1 second'),
           (SELECT min(visible_at)
            FROM leaseq.messages_g0
            WHERE queue_id = :queue_id AND leased
              AND visible_at > statement_timestamp()
              AND sent_at > statement_timestamp()
                            - CAST(:retention AS integer) * interval '1 second'))
           - statement_timestamp()) AS due_in,
       EXISTS (SELECT 1
               FROM leaseq.messages_g0
               WHERE queue_id = :queue_id AND NOT leased
                 AND visible_at >= coalesce(CAST(:ready_floor AS timestamptz), '-infinity')
                 AND visible_at <= statement_timestamp()
                 AND sent_at > statement_timestamp()
                               - CAST(:retention AS integer) * interval '1 second')
       OR EXISTS (SELECT 1
                  FROM leaseq.messages_g0
                  WHERE queue_id = :queue_id AND leased
                    AND visible_at >= coalesce(CAST(:lease_floor AS timestamptz), '-infinity')
                    AND visible_at <= statement_timestamp()
                    AND sent_at > statement_timestamp()
                                  - CAST(:retention AS integer) * interval '1 second')
           AS more_now;

-- name: change_visibility
-- returns: ChangedRow
-- plan: cached (rows by primary key)
-- Heartbeat or release, conditional on the claim: a row changes only while the
-- handle's claim token is still the message's. A visibility timeout of 0 releases it.
-- Returns the previous deadline too, so a change that makes a message visible
-- sooner can wake waiting receivers (an extension, the common case, does not).
WITH
{{written}}
UPDATE leaseq.messages_g0 AS m
SET visible_at = written.at + h.visibility_timeout * interval '1 second',
    leased     = h.visibility_timeout > 0
FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[]),
            CAST(:visibility_timeouts AS integer[])) AS h(id, token, visibility_timeout),
     leaseq.messages_g0 AS before, written
WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id
  AND before.id = m.id
RETURNING m.id, m.visible_at AS lease_expires_at, h.visibility_timeout,
          m.visible_at < before.visible_at AS sooner;

-- name: give_back_claims
-- returns: GivenBackRow
-- plan: cached (rows by primary key)
-- Undoes claims that reached no one: a grouped claim's share whose receiver
-- stopped waiting before it was answered. Conditional on the claim like every
-- write on a claimed message; visible again at once, and the receive the
-- claim counted taken back (nobody received it, so it must not bring the
-- message nearer its dead-letter queue). Wakes waiting receivers on commit.
WITH
{{written}},
given AS (
    {{given_back}}
    RETURNING m.id
)
SELECT count(*) AS given,
       pg_notify('leaseq', leaseq.notice(CAST(:queue_id AS bigint), count(*), NULL)) AS notified
FROM given
HAVING count(*) > 0;

-- name: notify_ready
-- returns: NotifiedRow
-- plan: cached (no table)
-- Wakes waiting receivers of a queue once the transaction commits: `ready`
-- messages are visible now, the next one in `due_in` seconds (NULL: none known).
SELECT pg_notify('leaseq', leaseq.notice(:queue_id, :ready, :due_in));

-- name: notify_queue_changed
-- returns: NotifiedRow
-- Tells every process that a queue's attributes changed or that it was deleted.
SELECT pg_notify('leaseq', format('%s:%s', CAST(:queue_id AS bigint), 'changed'));

-- name: release_message
-- returns: ReleasedRow
-- A worker gives a message back after a failure, conditional on the claim.
-- The delay is the one asked for, else the queue's retry ladder for the
-- message's receive count (initial * multiplier^(count-1), at most max, less
-- up to `jitter` of it at random), else 0: visible at once.
-- On a fair queue its tenant, on a FIFO queue its group, gets a turn at the
-- message's new deadline.
WITH
{{written}},
released AS (
    UPDATE leaseq.messages_g0 AS m
    SET visible_at = written.at + make_interval(secs => coalesce(
            CAST(:delay AS double precision),
            least(q.retry_max,
                  q.retry_initial * power(q.retry_multiplier, least(greatest(m.receive_count - 1, 0), 64)))
                * (1 - q.retry_jitter * random()),
            0)),
        leased = false
    FROM leaseq.queues AS q, written
    WHERE m.id = :id AND m.claim_token = :token AND m.queue_id = :queue_id AND q.id = m.queue_id
    RETURNING extract(epoch FROM m.visible_at - written.at) AS delay,
              m.visible_at, CASE WHEN q.fair THEN m.tenant WHEN q.fifo THEN m.group_id END AS turn
),
turned AS (
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT :queue_id, r.turn, r.visible_at
    FROM released AS r
    WHERE r.turn IS NOT NULL
)
SELECT delay, visible_at FROM released;

-- name: delete_messages
-- returns: DeletedRow
-- plan: cached (rows by primary key)
-- Acknowledgement, conditional on the claim; `held`: seconds from the claim to
-- now, the lease held time (NULL for a claim made before it was recorded).
DELETE FROM leaseq.messages_g0 AS m
USING unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[])) AS h(id, token)
WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id
RETURNING m.id,
          CAST(extract(epoch FROM statement_timestamp() - m.claimed_at) AS double precision)
              AS held;

-- name: save_checkpoint
-- returns: CheckpointRow
-- Records a job's cursor and renews the lease by the queue's timeout,
-- conditional on the claim. On a fair queue its tenant, on a FIFO queue its
-- group, gets a turn at the lease's new end, as a heartbeat gives it
-- (change_fair_visibility, change_fifo_visibility).
WITH
{{written}},
saved AS (
    UPDATE leaseq.messages_g0 AS m
    SET checkpoint = CAST(:cursor AS jsonb),
        visible_at = written.at + CAST(:visibility_timeout AS integer) * interval '1 second',
        leased     = true
    FROM written
    WHERE m.id = :id AND m.claim_token = :token AND m.queue_id = :queue_id
    RETURNING m.visible_at, coalesce(m.tenant, m.group_id) AS turn
),
turned AS (
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT :queue_id, s.turn, s.visible_at
    FROM saved AS s
    WHERE s.turn IS NOT NULL
      AND (SELECT q.fair OR q.fifo FROM leaseq.queues AS q WHERE q.id = :queue_id)
)
SELECT visible_at AS lease_expires_at FROM saved;

-- name: sweep_expired
-- Deletes up to :limit messages older than their queue's retention, whatever
-- their state or receive count. Locked rows are left for the next round.
DELETE FROM leaseq.messages
WHERE id = ANY (ARRAY(
    SELECT m.id
    FROM leaseq.messages AS m
    JOIN leaseq.queues AS q ON q.id = m.queue_id
    WHERE m.sent_at <= statement_timestamp() - q.message_retention * interval '1 second'
    LIMIT :limit
    FOR UPDATE OF m SKIP LOCKED));

-- name: peek_messages
-- returns: PeekRow
-- Messages of a queue for an operator, without claiming them: by state, in
-- id order, one page after an id; bodies cut to :body_chars characters.
SELECT m.id, m.message_id, left(m.body, :body_chars) AS body,
       length(m.body) > :body_chars AS truncated,
       CAST(m.attributes AS text) AS attributes, m.receive_count, m.sent_at,
       m.first_received_at, m.visible_at, CAST(m.checkpoint AS text) AS checkpoint,
       source.name AS dead_letter_source, m.fencing_token,
       coalesce(m.group_id, nullif(m.tenant, '')) AS "group",
       -- On the database's clock, as every deadline: a dashboard counts it down.
       CASE WHEN m.leased AND m.visible_at > statement_timestamp()
            THEN extract(epoch FROM m.visible_at - statement_timestamp()) END
         AS lease_remaining,
       CASE WHEN m.visible_at <= statement_timestamp() THEN 'visible'
            WHEN m.leased THEN 'in_flight'
            ELSE 'delayed' END AS state
FROM leaseq.messages AS m
LEFT JOIN leaseq.queues AS source ON source.id = m.dead_letter_source_id
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
-- returns: TaskIdRow
-- Starts moving a dead-letter queue's messages back; fails on the unique index
-- when a task for that queue is already running.
INSERT INTO leaseq.redrive_tasks (source_queue_id, destination_queue_id, destination_name,
                           max_per_second, to_move_at_start)
SELECT :source_queue_id, :destination_queue_id,
       (SELECT name FROM leaseq.queues WHERE id = :destination_queue_id), :max_per_second, count(*)
FROM leaseq.messages
WHERE queue_id = :source_queue_id
RETURNING id;

-- name: get_redrive_task
-- returns: RedriveTaskRow
-- A task with its queues' names (a deleted destination's as it was) and what is
-- left to move, counted live.
SELECT t.id, t.status, t.moved, t.to_move_at_start, t.max_per_second, t.failure,
       t.created_at, t.updated_at, source.name AS source,
       coalesce(destination.name, t.destination_name) AS destination,
       (SELECT count(*) FROM leaseq.messages AS m
        WHERE m.queue_id = t.source_queue_id
          AND coalesce(t.destination_queue_id, m.dead_letter_source_id) IS NOT NULL
       ) AS remaining
FROM leaseq.redrive_tasks AS t
JOIN leaseq.queues AS source ON source.id = t.source_queue_id
LEFT JOIN leaseq.queues AS destination ON destination.id = t.destination_queue_id
WHERE t.id = :task_id;

-- name: list_redrive_tasks
-- returns: TaskIdRow
-- The tasks of one dead-letter queue, newest first.
SELECT t.id
FROM leaseq.redrive_tasks AS t
WHERE t.source_queue_id = :source_queue_id
ORDER BY t.created_at DESC
LIMIT :limit;

-- name: cancel_redrive_task
-- returns: TaskIdRow
-- Stops a running task; what it moved stays moved.
UPDATE leaseq.redrive_tasks
SET status = 'cancelled', updated_at = statement_timestamp()
WHERE id = :task_id AND status = 'running'
RETURNING id;

-- name: take_redrive_task
-- returns: TakenTaskRow
-- A running task nobody holds (its runner finished a batch or died), taken
-- for :hold seconds.
UPDATE leaseq.redrive_tasks
SET runner_until = statement_timestamp() + CAST(:hold AS integer) * interval '1 second'
WHERE id = (SELECT id FROM leaseq.redrive_tasks
            WHERE status = 'running' AND runner_until <= statement_timestamp()
            ORDER BY created_at
            LIMIT 1
            FOR UPDATE SKIP LOCKED)
RETURNING id, max_per_second;

-- name: redrive_batch
-- returns: RedriveBatchRow
-- Moves up to :batch visible messages of a task's dead-letter queue back to
-- their source queue (or the task's destination), with a fresh receive count,
-- and counts them on the task, all in one transaction: a crash rolls back a
-- whole batch, so nothing is lost or duplicated. Messages being inspected
-- (in flight) wait for a later batch; ones with nowhere to go stay. A FIFO
-- message goes to the end of its group there, with a new sequence number
-- taken once it holds the group's lock (as a send takes it), and the group a
-- turn there. A task whose
-- destination queue was deleted moves nothing more: it fails, as SQS's does.
-- The moved are claimable at once, from the moment of the write (the fragment
-- written).
WITH
{{written}},
task AS (
    SELECT * FROM leaseq.redrive_tasks WHERE id = :task_id AND status = 'running' FOR UPDATE
),
batch AS (
    SELECT m.id, m.group_id,
           coalesce(task.destination_queue_id, m.dead_letter_source_id) AS destination,
           (SELECT d.fair OR d.fifo FROM leaseq.queues AS d
            WHERE d.id = coalesce(task.destination_queue_id, m.dead_letter_source_id))
               AS turned
    FROM leaseq.messages AS m, task
    WHERE m.queue_id = task.source_queue_id
      AND m.visible_at <= statement_timestamp()
      AND coalesce(task.destination_queue_id, m.dead_letter_source_id) IS NOT NULL
      -- started with a destination: none once it is deleted
      AND (task.destination_queue_id IS NOT NULL OR task.destination_name IS NULL)
    ORDER BY m.id
    LIMIT :batch
    FOR UPDATE OF m SKIP LOCKED
),
destination_groups AS MATERIALIZED (
    SELECT d.destination, d.group_id,
           pg_advisory_xact_lock(hashtextextended(d.group_id, d.destination)) AS locked
    FROM (SELECT DISTINCT destination, group_id FROM batch WHERE group_id IS NOT NULL
          ORDER BY destination, group_id) AS d
    ORDER BY d.destination, d.group_id
),
numbered AS MATERIALIZED (
    SELECT b.id, nextval('leaseq.message_sequence') AS sequence_number
    FROM (SELECT batch.id FROM batch JOIN destination_groups AS g
            ON g.destination = batch.destination AND g.group_id = batch.group_id
          ORDER BY batch.id) AS b
),
moved AS (
    UPDATE leaseq.messages AS m
    SET queue_id = batch.destination,
        dead_letter_source_id = NULL,
        receive_count = 0,
        claim_token = NULL,
        fencing_token = NULL,
        leased = false,
        first_received_at = NULL,
        visible_at = written.at,
        sequence_number = n.sequence_number,
        tenant = CASE WHEN batch.turned AND m.group_id IS NULL THEN coalesce(m.tenant, '')
                      ELSE m.tenant END
    FROM written, batch
    LEFT JOIN numbered AS n ON n.id = batch.id
    WHERE m.id = batch.id
    RETURNING m.queue_id, coalesce(m.tenant, m.group_id) AS turn, batch.turned
),
destination_turns AS (
    -- Into a fair queue, each message is its tenant's there (one that named
    -- none is its own, ''), into a FIFO queue its group's, claimable now: a
    -- turn each.
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT DISTINCT moved.queue_id, moved.turn, written.at
    FROM moved, written
    WHERE moved.turned
),
counted AS (
    UPDATE leaseq.redrive_tasks AS t
    SET moved = t.moved + (SELECT count(*) FROM moved),
        updated_at = statement_timestamp(),
        runner_until = statement_timestamp() + CAST(:hold AS integer) * interval '1 second',
        status = CASE WHEN task.destination_name IS NOT NULL
                           AND task.destination_queue_id IS NULL THEN 'failed'
                      WHEN (SELECT count(*) FROM batch) < :batch THEN 'completed'
                      ELSE t.status END,
        failure = CASE WHEN task.destination_name IS NOT NULL
                            AND task.destination_queue_id IS NULL
                       THEN 'AWS.SimpleQueueService.NonExistentQueue' ELSE t.failure END
    FROM task
    WHERE t.id = task.id
    RETURNING t.status
)
SELECT (SELECT status FROM counted) AS status,
       (SELECT count(*) FROM moved) AS moved,
       (SELECT array_agg(DISTINCT queue_id) FROM moved) AS destinations;

-- name: messages_vacuum_state
-- returns: VacuumStateRow
-- Whether autovacuum looks after the messages table (the server's setting and
-- the table's own), and its dead and live tuples by the cumulative statistics:
-- generation 0's, where the rows and the storage settings are (a partitioned
-- parent has neither).
SELECT current_setting('autovacuum')::boolean
       AND coalesce((SELECT option_value::boolean
                     FROM pg_options_to_table(c.reloptions)
                     WHERE option_name = 'autovacuum_enabled'), true) AS autovacuum,
       coalesce(s.n_dead_tup, 0) AS dead,
       coalesce(s.n_live_tup, 0) AS live
FROM pg_class AS c
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid = CAST('leaseq.messages_g0' AS regclass);

-- name: try_maintenance_lock
-- returns: LockedRow
-- The maintenance rounds (the retention sweep, the vacuum check) run in the one
-- process of a deployment holding this session-level lock, taken on a
-- connection of its own and never released: PostgreSQL releases it when that
-- connection ends (app/db/fleet.py). The key is "leaseq" in ASCII, then 2
-- (1 is the migration lock, app/db/migrate.py).
SELECT pg_try_advisory_lock(7810756276995031042) AS locked;

-- name: database_horizon
-- returns: HorizonRow
-- Who holds back this database's cleanup horizon the furthest: the holder of
-- the oldest transaction ID that a VACUUM of leaseq's tables must keep every
-- row version deleted since (app/queue/horizon.py times it and names it). No
-- holder: one row with `kind` NULL (`now` and `next_xid` are always read: the
-- xid clock records them). Counted, as PostgreSQL counts them for this
-- database's tables:
-- * a transaction that holds a transaction ID (it wrote), in any database:
--   every snapshot taken while it runs, this database's too, keeps it;
-- * a snapshot (backend_xmin) in this database; before PostgreSQL 14 in any.
--   A physical walsender's (a standby's hot_standby_feedback, no database)
--   counts everywhere. Left out: lazy VACUUMs and autovacuum workers, and
--   walsenders decoding (a logical slot's catalog_xmin below), which
--   PostgreSQL leaves out too, and this reading's own backend;
-- * a replication slot's xmin. Its catalog_xmin holds back the system
--   catalogs only, never a row of leaseq's tables: not counted;
-- * a prepared transaction, until COMMIT or ROLLBACK PREPARED, in any
--   database (it holds its transaction ID as a running writer does).
-- The oldest first by age in transactions; among equals, the one that holds
-- the ID itself (the others' snapshots wait on it), then the longest open.
-- Another role's session shows its xmin but not its times, state, client or
-- query unless leaseq's role has pg_read_all_stats (or pg_monitor).
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

-- name: vacuum_messages
VACUUM (ANALYZE) leaseq.messages;

-- FIFO queues -------------------------------------------------------------
--
-- A FIFO queue's messages belong to message groups, and a group's messages go
-- out in the order of their sequence numbers. Three things keep that order
-- without a row that every statement rewrites (docs/decisions.md, "History
-- costs nothing, step four"):
--   - Sends into a group take the group's advisory lock before they number
--     their messages, and hold it until they commit (pg_advisory_xact_lock,
--     keyed by a 64-bit hash of the group's id seeded with its queue's id:
--     two groups that share a key only wait for each other): a group's messages commit in the order of their numbers, and
--     every message that enters a group (a send, a move to a dead-letter queue,
--     a redrive) takes a number above all the group holds.
--   - A group's turns (leaseq.turns, the group's id as the tenant) say when
--     it may next have a message claimable, as a fair queue's tenants' do:
--     every write that sets a message's deadline inserts one at it; a claim
--     reads the turns due from its floor (app/queue/floors.py), deletes those
--     it can lock and inserts the group's next.
--   - A group's head as a claim last saw it (leaseq.group_heads, inserted,
--     never updated): since numbers only grow within a group, no message of
--     it lies below a head once seen, and a claim reads the group from there,
--     never the versions of what was settled below.
-- Two claims may read one group; the messages they want are locked with SKIP
-- LOCKED and rechecked, and a group is taken only whole by one of them.

-- name: send_fifo_messages
-- returns: FifoSentRow
-- plan: cached (INSERTs from arrays)
-- Sends to a FIFO queue, in input order. Each group's lock is taken, in group
-- order, before its messages are numbered (above). A deduplication id
-- accepted in the last five minutes is answered with the message and
-- sequence number it named, and nothing is stored (the first send's five
-- minutes are not extended). The caller gives each (scope, deduplication id)
-- once per statement. Each group that got a message gets a turn at the
-- queue's delay from the write, and receivers are woken once per such group.
-- A FIFO message has no delay of its own: the queue's, counted from its
-- sent_at by the claim (so a change of the queue's delay applies to the
-- messages already waiting, as SQS has it for FIFO queues).
WITH
{{written}},
input AS MATERIALIZED (
    SELECT m.*, gen_random_uuid() AS message_id
    FROM unnest(CAST(:bodies AS text[]), CAST(:attributes AS text[]),
                CAST(:attribute_types AS text[]), CAST(:sender_ids AS text[]),
                CAST(:group_ids AS text[]), CAST(:scopes AS text[]),
                CAST(:deduplication_ids AS text[]), CAST(:trace_headers AS text[]))
         WITH ORDINALITY AS m(body, attributes, attribute_types, sender_id, group_id, scope,
                              deduplication_id, trace_header, ord)
),
grouped AS MATERIALIZED (
    SELECT d.group_id,
           pg_advisory_xact_lock(hashtextextended(d.group_id, CAST(:queue_id AS bigint)))
               AS locked
    FROM (SELECT DISTINCT group_id FROM input ORDER BY group_id) AS d
    ORDER BY d.group_id
),
numbered AS MATERIALIZED (
    SELECT i.*, nextval('leaseq.message_sequence') AS sequence_number
    FROM input AS i
    JOIN grouped USING (group_id)
    ORDER BY i.ord
),
accepted AS (
    INSERT INTO leaseq.message_deduplication AS d
           (queue_id, scope, deduplication_id, message_id, sequence_number, expires_at)
    SELECT :queue_id, n.scope, n.deduplication_id, n.message_id, n.sequence_number,
           statement_timestamp() + interval '5 minutes'
    FROM numbered AS n
    ORDER BY n.scope, n.deduplication_id
    ON CONFLICT (queue_id, scope, deduplication_id) DO UPDATE
    SET message_id      = CASE WHEN d.expires_at <= statement_timestamp()
                               THEN EXCLUDED.message_id ELSE d.message_id END,
        sequence_number = CASE WHEN d.expires_at <= statement_timestamp()
                               THEN EXCLUDED.sequence_number ELSE d.sequence_number END,
        expires_at      = CASE WHEN d.expires_at <= statement_timestamp()
                               THEN EXCLUDED.expires_at ELSE d.expires_at END
    RETURNING d.scope, d.deduplication_id, d.message_id, d.sequence_number, d.expires_at
),
sent AS (
    INSERT INTO leaseq.messages_g0 (queue_id, message_id, body, attributes, attribute_types, sender_id,
                          group_id, sequence_number, deduplication_id, trace_header, visible_at)
    SELECT :queue_id, n.message_id, n.body, CAST(n.attributes AS jsonb),
           CAST(n.attribute_types AS jsonb), n.sender_id, n.group_id, n.sequence_number,
           n.deduplication_id, n.trace_header, statement_timestamp()
    FROM numbered AS n
    JOIN accepted AS a ON a.message_id = n.message_id
    ORDER BY n.ord
    RETURNING group_id
),
turned AS (
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT :queue_id, s.group_id, written.at + CAST(:delay AS integer) * interval '1 second'
    FROM (SELECT DISTINCT group_id FROM sent) AS s, written
)
SELECT a.message_id, a.sequence_number, a.message_id = n.message_id AS stored,
       a.expires_at - interval '5 minutes' AS sent_at,
       pg_notify('leaseq', leaseq.notice(CAST(:queue_id AS bigint),
           CASE WHEN CAST(:delay AS integer) = 0
                THEN (SELECT count(DISTINCT group_id) FROM sent) ELSE 0 END,
           CASE WHEN CAST(:delay AS integer) > 0 AND EXISTS (SELECT 1 FROM sent)
                THEN CAST(:delay AS double precision) END)) AS notified
FROM numbered AS n
JOIN accepted AS a USING (scope, deduplication_id)
ORDER BY n.ord;

-- name: claim_fifo_messages
-- returns: FifoClaimRow
-- The FIFO claim: one statement, which reads the groups' turns due and the
-- first few messages of each group from its head, never the backlog nor what
-- was settled.
--   1. The turns due from the claims' floor, oldest first: up to :lock_groups
--      groups that may be claimable, each with its last head seen.
--   2. The first 10 messages of each from that head (a receive takes at most
--      10, and a claim takes a group's first messages, so whatever of a group
--      is in flight is among them): the messages visible from the head on are
--      open (visible: its deadline passed, and the queue's :delay since it was
--      sent), up to the first that is not -- as SQS has it, a message made
--      visible again goes out while a later one of its group is still in
--      flight, which that one keeps the rest of the group behind.
--   3. Open groups are dealt to the receivers of :wants (one number each),
--      oldest first, in turn: of n receivers, receiver r gets groups r, r + n,
--      r + 2n, ..., and takes their messages in that order up to its number
--      -- a receive takes as many messages of one group as it can, then of
--      the next (as SQS does); a group is never split between two receivers.
--   4. Those messages (and the lapsed leases of their groups that they leave
--      behind) are locked, SKIP LOCKED, and rechecked: a group any of whose
--      wanted rows another claim holds or changed since the snapshot (a late
--      heartbeat, an acknowledgement) is left for a later claim. Under a
--      redrive policy, exhausted messages move to the (FIFO) dead-letter
--      queue, at the end of their group there (its lock, then a new sequence
--      number), and the rest of their group goes on. The lapsed leases left
--      behind are revoked: a group claimed again belongs to its new receiver
--      alone.
--   5. Each group it claimed from or found nothing claimable in loses every
--      turn due (each one it can lock: a group's sends and acknowledgements
--      each gave it one, and left there they would pile up behind the walk),
--      and gets its next: at the lease's end when claimed, else at its
--      head's deadline, no earlier than the turn deleted (a head in flight
--      has its lease's turn; an empty group gets none). An open group not
--      taken keeps its turns as they are: its place among the others, and
--      no write. The head each group showed is kept when it moved on
--      (group_heads).
-- Always one row at least: `dead` counts the moved messages; `id` is NULL
-- when nothing was claimed; `receiver` numbers each row's receiver from 1.
-- Every row carries the floor of the queue's turns it saw, as a fair claim's.
WITH
{{written}},
walked AS MATERIALIZED (
    SELECT u.tenant AS group_id, u.at
    FROM leaseq.turns AS u
    WHERE u.queue_id = :queue_id
      AND u.at >= coalesce(CAST(:ready_floor AS timestamptz), '-infinity')
      AND u.at <= statement_timestamp()
    ORDER BY u.at
    LIMIT 2 * CAST(:lock_groups AS integer)
),
looked_at AS MATERIALIZED (
    -- Each group's last head seen, by group_heads_newest from the top (0026):
    -- the heads below it are superseded, and whatever a held horizon keeps
    -- of them lies below.
    SELECT g.group_id, g.hint, h.since, h.head_row
    FROM (SELECT w.group_id, min(w.at) AS hint
          FROM walked AS w
          GROUP BY w.group_id
          ORDER BY min(w.at), w.group_id
          LIMIT :lock_groups) AS g
    LEFT JOIN LATERAL (
        SELECT h.since, h.ctid AS head_row
        FROM leaseq.group_heads AS h
        WHERE h.queue_id = :queue_id AND h.group_id = g.group_id
        ORDER BY h.since DESC
        LIMIT 1
    ) AS h ON true
),
window_rows AS (
    SELECT l.group_id, l.hint, l.since,
           w.id, w.sequence_number, w.receive_count, w.leased,
           greatest(w.visible_at,
                    w.sent_at + CAST(:delay AS integer) * interval '1 second') AS visible_at,
           w.leased AND w.visible_at > statement_timestamp() AS in_flight,
           bool_and(w.visible_at <= statement_timestamp() AND w.sent_at <= statement_timestamp()
                    - CAST(:delay AS integer) * interval '1 second')
               OVER (PARTITION BY l.group_id ORDER BY w.sequence_number) AS ready
    FROM looked_at AS l
    LEFT JOIN LATERAL (
        SELECT m.id, m.sequence_number, m.receive_count, m.visible_at, m.leased, m.sent_at
        FROM leaseq.messages_g0 AS m
        WHERE m.queue_id = :queue_id AND m.group_id = l.group_id
          AND m.sequence_number >= coalesce(l.since, 0)
          AND m.sent_at > statement_timestamp()
                          - CAST(:retention AS integer) * interval '1 second'
        ORDER BY m.sequence_number
        LIMIT 10
    ) AS w ON true
),
summary AS MATERIALIZED (
    SELECT group_id, since,
           count(id) AS messages,
           min(sequence_number) AS head,
           (array_agg(visible_at ORDER BY sequence_number))[1] AS head_at,
           (array_agg(in_flight ORDER BY sequence_number))[1] AS head_in_flight
    FROM window_rows
    GROUP BY group_id, since
),
open AS (
    SELECT r.id, r.group_id, r.receive_count, r.sequence_number, r.leased AS lapsed,
           dense_rank() OVER (ORDER BY r.hint, r.group_id) AS group_rank,
           row_number() OVER (PARTITION BY r.group_id ORDER BY r.sequence_number) AS position
    FROM window_rows AS r
    WHERE r.ready
),
dealt AS (
    SELECT o.*,
           CAST((o.group_rank - 1) % cardinality(CAST(:wants AS integer[])) + 1 AS integer)
               AS receiver
    FROM open AS o
),
slotted AS (
    SELECT d.*,
           row_number() OVER (PARTITION BY d.receiver ORDER BY d.group_rank, d.position) AS slot
    FROM dealt AS d
),
wanted AS (
    SELECT s.id, s.group_id, s.receive_count, s.sequence_number, s.lapsed, s.receiver,
           s.group_rank
    FROM slotted AS s
    WHERE s.slot <= (CAST(:wants AS integer[]))[s.receiver]
),
stale AS (
    SELECT r.id, r.group_id
    FROM window_rows AS r
    WHERE r.leased AND NOT r.in_flight
      AND r.group_id IN (SELECT group_id FROM wanted)
      AND r.id NOT IN (SELECT id FROM wanted)
),
locked AS (
    SELECT m.id
    FROM leaseq.messages_g0 AS m
    WHERE m.id IN (SELECT id FROM wanted UNION ALL SELECT id FROM stale)
      AND m.queue_id = :queue_id
      AND m.visible_at <= statement_timestamp()
    FOR UPDATE SKIP LOCKED
),
granted AS MATERIALIZED (
    SELECT i.group_id
    FROM (SELECT id, group_id FROM wanted UNION ALL SELECT id, group_id FROM stale) AS i
    LEFT JOIN locked AS l USING (id)
    GROUP BY i.group_id
    HAVING bool_and(l.id IS NOT NULL)
),
exhausted AS MATERIALIZED (
    SELECT w.id, w.group_id, w.sequence_number
    FROM wanted AS w
    WHERE w.group_id IN (SELECT group_id FROM granted)
      AND w.receive_count >= CAST(:max_receive_count AS integer)
),
dead_groups AS MATERIALIZED (
    -- Into the dead-letter queue's groups, each locked as a send locks it.
    SELECT d.group_id,
           pg_advisory_xact_lock(hashtextextended(d.group_id,
                                                  CAST(:dead_letter_queue_id AS bigint)))
               AS locked
    FROM (SELECT DISTINCT group_id FROM exhausted ORDER BY group_id) AS d
    ORDER BY d.group_id
),
renumbered AS MATERIALIZED (
    SELECT e.id, nextval('leaseq.message_sequence') AS sequence_number
    FROM (SELECT x.* FROM exhausted AS x JOIN dead_groups USING (group_id)
          ORDER BY x.group_id, x.sequence_number) AS e
),
dead AS (
    UPDATE leaseq.messages_g0 AS m
    {{dead_letter}},
        sequence_number   = r.sequence_number
    FROM renumbered AS r, written
    WHERE m.id = r.id
    RETURNING m.id, m.group_id
),
dead_turns AS (
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT CAST(:dead_letter_queue_id AS bigint), d.group_id, written.at
    FROM (SELECT DISTINCT group_id FROM dead) AS d, written
),
claimed AS (
    UPDATE leaseq.messages_g0 AS m
    {{claim}}
    FROM wanted AS w, written
    WHERE m.id = w.id AND w.group_id IN (SELECT group_id FROM granted)
      AND (CAST(:max_receive_count AS integer) IS NULL
           OR w.receive_count < CAST(:max_receive_count AS integer))
    RETURNING
        {{received_columns}},
        m.group_id, m.sequence_number, m.deduplication_id, w.lapsed, w.receiver,
        w.group_rank
),
revoked AS (
    UPDATE leaseq.messages_g0 AS m
    SET claim_token = NULL, fencing_token = NULL, leased = false
    FROM stale AS s
    WHERE m.id = s.id AND s.group_id IN (SELECT group_id FROM granted)
),
decided AS (
    -- The groups looked at that no turn due need bring back: claimed from
    -- (its lease's end will), or with nothing claimable as this snapshot
    -- sees them (empty, its head in flight or waiting). A write this snapshot
    -- does not see gave the group a turn of its own, which stays.
    SELECT l.group_id
    FROM looked_at AS l
    WHERE l.group_id IN (SELECT group_id FROM claimed)
       OR l.group_id NOT IN (SELECT group_id FROM open)
),
gone AS (
    -- Each group's read by turns_tenant from the floor (the lateral with its
    -- lock is planned per group, never as a scan of the queue's turns): under
    -- a held horizon a group's range holds what was deleted of its turns
    -- since, not all its history.
    DELETE FROM leaseq.turns AS u
    WHERE u.ctid = ANY (ARRAY(
        SELECT t.ctid
        FROM decided AS d
        CROSS JOIN LATERAL (
            SELECT l.ctid
            FROM leaseq.turns AS l
            WHERE l.queue_id = :queue_id AND l.tenant = d.group_id
              AND l.at >= coalesce(CAST(:ready_floor AS timestamptz), '-infinity')
              AND l.at <= statement_timestamp()
            FOR UPDATE SKIP LOCKED) AS t))
    RETURNING u.tenant AS group_id, u.at
),
nexts AS (
    -- When a group not claimed from may next have a message claimable: its
    -- head's deadline when it waits for the queue's delay (the send's turn
    -- came at the old delay's end). A claimed one's lease end is inserted
    -- below; a head in flight has its lease's turn (its claim's or its last
    -- heartbeat's); an empty group needs none.
    SELECT s.group_id, s.head_at AS at
    FROM summary AS s
    WHERE s.group_id NOT IN (SELECT group_id FROM claimed)
      AND s.messages > 0 AND NOT s.head_in_flight
),
turned AS (
    -- No earlier than the first turn it deleted of the group (floors.py, as
    -- claim_fair_messages).
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT :queue_id, n.group_id, greatest(n.at, g.at)
    FROM nexts AS n
    JOIN (SELECT g.group_id, min(g.at) AS at FROM gone AS g GROUP BY g.group_id) AS g
      ON g.group_id = n.group_id
    UNION ALL
    SELECT DISTINCT :queue_id, c.group_id,
           written.at + CAST(:visibility_timeout AS integer) * interval '1 second'
    FROM claimed AS c, written
),
learned AS (
    INSERT INTO leaseq.group_heads (queue_id, group_id, since)
    SELECT :queue_id, s.group_id, s.head
    FROM summary AS s
    WHERE s.head > coalesce(s.since, -1)
),
superseded AS (
    -- The head it read, once it learned a later one: the very row, whatever
    -- a held horizon keeps of the group's earlier heads. One another claim
    -- holds (it learned the same) is left to it, or to sweep_group_heads.
    DELETE FROM leaseq.group_heads AS h
    WHERE h.ctid = ANY (ARRAY(
        SELECT o.ctid
        FROM looked_at AS l
        JOIN summary AS s USING (group_id)
        CROSS JOIN LATERAL (
            SELECT p.ctid
            FROM leaseq.group_heads AS p
            WHERE p.ctid = l.head_row
            FOR UPDATE SKIP LOCKED) AS o
        WHERE s.head > s.since))
),
{{turn_floors}}
SELECT (SELECT count(*) FROM dead) AS dead, claimed.*,
       floors.ready_floor, floors.ready_floor AS lease_floor,
       floors.ready_from, floors.ready_from AS lease_from,
       floors.snapshot_xmin, floors.looked_at,
       {{claim_xid}}
FROM floors
LEFT JOIN claimed ON true;

-- name: fifo_outlook
-- returns: OutlookRow
-- queue_outlook for a FIFO queue, by its groups' turns: whether one is due
-- now (from the claims' floor), and the seconds until the next one is.
SELECT (SELECT extract(epoch FROM min(at) - statement_timestamp())
        FROM leaseq.turns
        WHERE queue_id = :queue_id AND at > statement_timestamp()
       ) AS due_in,
       EXISTS (SELECT 1
               FROM leaseq.turns
               WHERE queue_id = :queue_id
                 AND at >= coalesce(CAST(:ready_floor AS timestamptz), '-infinity')
                 AND at <= statement_timestamp()
       ) AS more_now;

-- name: delete_fifo_messages
-- returns: FifoDeletedRow
-- plan: cached (rows by primary key)
-- delete_messages for a FIFO queue: the groups of the deleted messages may
-- be claimable now (a turn each), and their waiting receivers are woken.
WITH
{{written}},
deleted AS (
    DELETE FROM leaseq.messages_g0 AS m
    USING unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[])) AS h(id, token)
    WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id
    RETURNING m.id, m.group_id,
              CAST(extract(epoch FROM statement_timestamp() - m.claimed_at)
                   AS double precision) AS held
),
turned AS (
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT :queue_id, d.group_id, written.at
    FROM (SELECT DISTINCT group_id FROM deleted) AS d, written
    RETURNING 1
)
SELECT d.id, d.held,
       pg_notify('leaseq', leaseq.notice(CAST(:queue_id AS bigint),
                                         (SELECT count(*) FROM turned), NULL)) AS notified
FROM deleted AS d;

-- name: change_fifo_visibility
-- returns: ChangedRow
-- plan: cached (rows by primary key)
-- change_visibility for a FIFO queue: each group changed gets a turn at its
-- messages' new deadline (a release, a shorter lease: sooner; a heartbeat:
-- the lease's new end, which a claim that reads the old end's turn meets).
WITH
{{written}},
changed AS (
    UPDATE leaseq.messages_g0 AS m
    SET visible_at = written.at + h.visibility_timeout * interval '1 second',
        leased     = h.visibility_timeout > 0
    FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[]),
                CAST(:visibility_timeouts AS integer[])) AS h(id, token, visibility_timeout),
         leaseq.messages_g0 AS before, written
    WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id
      AND before.id = m.id
    RETURNING m.id, m.group_id, m.visible_at AS lease_expires_at, h.visibility_timeout,
              m.visible_at < before.visible_at AS sooner
),
turned AS (
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT DISTINCT :queue_id, c.group_id, c.lease_expires_at
    FROM changed AS c
)
SELECT id, lease_expires_at, visibility_timeout, sooner FROM changed;

-- name: lapsed_leases
-- returns: LapsedRow
-- Of some receipt handles (:ids, :tokens), those whose message is still there
-- but whose lease under that handle no longer holds: lapsed, released, or
-- replaced by another claim. SQS refuses such a handle on a FIFO queue.
SELECT h.id, h.token
FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[])) AS h(id, token)
JOIN leaseq.messages_g0 AS m ON m.id = h.id AND m.queue_id = :queue_id
WHERE m.claim_token IS DISTINCT FROM h.token OR NOT m.leased
   OR m.visible_at <= statement_timestamp();

-- name: turn_groups_now
-- A FIFO queue whose delay was shortened: its messages count the delay from
-- their sending, so a group waiting for a turn to come may be claimable now.
-- Each group with a turn to come gets one now.
WITH
{{written}}
INSERT INTO leaseq.turns (queue_id, tenant, at)
SELECT DISTINCT CAST(:queue_id AS bigint), u.tenant, written.at
FROM leaseq.turns AS u, written
WHERE u.queue_id = :queue_id AND u.at > statement_timestamp();

-- name: give_back_fifo_claims
-- returns: GivenBackRow
-- plan: cached (rows by primary key)
-- give_back_claims for a FIFO queue: the groups of the messages given back
-- are claimable again at once (a turn each, from the moment of the write).
WITH
{{written}},
given AS (
    UPDATE leaseq.messages_g0 AS m
    SET visible_at        = written.at,
        leased            = false,
        receive_count     = m.receive_count - 1,
        first_received_at = CASE WHEN m.receive_count = 1 THEN NULL
                                 ELSE m.first_received_at END
    FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[])) AS h(id, token), written
    WHERE m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id
    RETURNING m.id, m.group_id
),
turned AS (
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT :queue_id, g.group_id, written.at
    FROM (SELECT DISTINCT group_id FROM given) AS g, written
    RETURNING 1
)
SELECT count(*) AS given,
       pg_notify('leaseq', leaseq.notice(CAST(:queue_id AS bigint),
                                         (SELECT count(*) FROM turned), NULL)) AS notified
FROM given
HAVING count(*) > 0;

-- name: forget_deduplication
-- A purged FIFO queue's deduplication ids (SQS accepts a purged message's id
-- again at once).
DELETE FROM leaseq.message_deduplication WHERE queue_id = :queue_id;

-- name: forget_heads
-- A FIFO queue whose retention grew: a claim that learnt a group's head
-- passed the messages past the retention then, which may be within it now.
-- Its claims read each group from its start again, once.
DELETE FROM leaseq.group_heads WHERE queue_id = :queue_id;

-- name: sweep_deduplication
-- returns: DeduplicationSweptRow
-- Forgets up to :limit deduplication ids and receive attempts past their
-- five minutes, each table read by its expiry from where the last sweep
-- stopped (:deduplication_from, :attempts_from; NULL: the start): below lies
-- what earlier sweeps deleted, which a held horizon keeps in the index
-- (app/queue/retention.py). Returns how many, and the last expiry reached in
-- each.
WITH forgotten AS (
    DELETE FROM leaseq.message_deduplication
    WHERE (queue_id, scope, deduplication_id) IN (
        SELECT queue_id, scope, deduplication_id
        FROM leaseq.message_deduplication
        WHERE expires_at >= coalesce(CAST(:deduplication_from AS timestamptz), '-infinity')
          AND expires_at <= statement_timestamp()
        ORDER BY expires_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED)
    RETURNING expires_at
),
attempts AS (
    DELETE FROM leaseq.receive_attempts
    WHERE (queue_id, attempt_id) IN (
        SELECT queue_id, attempt_id
        FROM leaseq.receive_attempts
        WHERE expires_at >= coalesce(CAST(:attempts_from AS timestamptz), '-infinity')
          AND expires_at <= statement_timestamp()
        ORDER BY expires_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED)
    RETURNING expires_at
)
SELECT greatest((SELECT count(*) FROM forgotten), (SELECT count(*) FROM attempts)) AS swept,
       (SELECT max(expires_at) FROM forgotten) AS deduplication_to,
       (SELECT max(expires_at) FROM attempts) AS attempts_to;

-- name: sweep_group_heads
-- Forgets up to :limit FIFO groups' heads no claim reads: superseded by a
-- later one (a claim deletes the one it read when it learns the next, unless
-- another holds it), or of a group with no turn (nothing claimable nor in
-- flight) learnt more than ten minutes ago. A scan of the table, seldom
-- (app/queue/retention.py): it holds about a head a group.
DELETE FROM leaseq.group_heads AS h
WHERE h.ctid = ANY (ARRAY(
    SELECT o.ctid
    FROM leaseq.group_heads AS o
    WHERE EXISTS (SELECT 1 FROM leaseq.group_heads AS n
                  WHERE n.queue_id = o.queue_id AND n.group_id = o.group_id
                    AND n.since > o.since)
       OR (o.learned_at <= statement_timestamp() - interval '10 minutes'
           AND NOT EXISTS (SELECT 1 FROM leaseq.turns AS u
                           WHERE u.queue_id = o.queue_id AND u.tenant = o.group_id))
    LIMIT :limit
    FOR UPDATE SKIP LOCKED));

-- name: replay_receive_attempt
-- returns: ReplayedRow
-- plan: cached (rows by primary key)
-- A FIFO receive retried with the ReceiveRequestAttemptId of one in the last
-- five minutes: the messages that receive claimed which its claims still
-- hold, with the same receipt handles, their leases set from now again, and
-- their groups a turn at the leases' new end (a claim reads no deadline to
-- come: a head in flight is met by its lease's own turn).
WITH
{{written}},
replayed AS (
    UPDATE leaseq.messages_g0 AS m
    SET visible_at = written.at + a.visibility_timeout * interval '1 second',
        leased     = true
    FROM leaseq.receive_attempts AS a,
         unnest(a.message_rows, a.claim_tokens) AS h(id, token), written
    WHERE a.queue_id = :queue_id AND a.attempt_id = :attempt_id
      AND a.expires_at > statement_timestamp()
      AND m.id = h.id AND m.claim_token = h.token AND m.queue_id = :queue_id AND m.leased
    RETURNING
        {{received_columns}},
        m.group_id, m.sequence_number, m.deduplication_id, a.visibility_timeout
),
turned AS (
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT DISTINCT CAST(:queue_id AS bigint), r.group_id, r.lease_expires_at
    FROM replayed AS r
)
SELECT * FROM replayed;

-- name: record_receive_attempt
-- plan: cached (a row by primary key)
-- What a FIFO receive with a ReceiveRequestAttemptId claimed, for five minutes.
INSERT INTO leaseq.receive_attempts AS a (queue_id, attempt_id, message_rows, claim_tokens,
                                   visibility_timeout, expires_at)
VALUES (:queue_id, :attempt_id, :message_rows, :claim_tokens, :visibility_timeout,
        statement_timestamp() + interval '5 minutes')
ON CONFLICT (queue_id, attempt_id) DO UPDATE
SET message_rows       = EXCLUDED.message_rows,
    claim_tokens       = EXCLUDED.claim_tokens,
    visibility_timeout = EXCLUDED.visibility_timeout,
    expires_at         = EXCLUDED.expires_at;

-- name: queue_gauges
-- returns: GaugeRow
-- Every queue's live counts for /metrics, in one pass over the messages within
-- retention (queue_stats for all queues at once, in the same states). One row
-- per queue and dead-letter source: `source` names the queue a dead-lettered
-- message came from (NULL for the rest), so a dead-letter queue's depth is told
-- per source; a queue without messages has one row of zeros. A fair queue's
-- rows count its quiet tenants' messages too (a message naming no tenant is
-- quiet), and its noisy tenants.
SELECT q.name, s.name AS source, q.fair,
       CASE WHEN q.fair THEN (SELECT count(*) FROM leaseq.tenants AS t
                              WHERE t.queue_id = q.id AND t.noisy) END AS noisy_tenants,
       count(m.id) AS messages,
       count(m.id) FILTER (WHERE m.visible_at <= statement_timestamp()
                             AND m.sent_at <= statement_timestamp() - fifo.delay)
           AS visible,
       count(m.id) FILTER (WHERE m.visible_at > statement_timestamp() AND m.leased)
           AS in_flight,
       count(m.id) FILTER (WHERE NOT m.leased
                             AND (m.visible_at > statement_timestamp()
                                  OR m.sent_at > statement_timestamp() - fifo.delay))
           AS delayed,
       extract(epoch FROM statement_timestamp()
                          - min(m.sent_at) FILTER (
                                WHERE m.visible_at <= statement_timestamp()
                                  AND m.sent_at <= statement_timestamp() - fifo.delay))
           AS oldest_visible_age,
       count(m.id) FILTER (WHERE q.fair AND noisy.tenant IS NULL
                             AND m.visible_at <= statement_timestamp()) AS quiet_visible,
       count(m.id) FILTER (WHERE q.fair AND noisy.tenant IS NULL
                             AND m.visible_at > statement_timestamp() AND m.leased)
           AS quiet_in_flight,
       extract(epoch FROM statement_timestamp()
                          - min(m.sent_at) FILTER (
                                WHERE q.fair AND noisy.tenant IS NULL
                                  AND m.visible_at <= statement_timestamp()))
           AS quiet_oldest_visible_age
FROM leaseq.queues AS q
CROSS JOIN LATERAL (
    SELECT CASE WHEN q.fifo THEN q.delay ELSE 0 END * interval '1 second' AS delay
) AS fifo
LEFT JOIN leaseq.messages AS m
       ON m.queue_id = q.id
      AND m.sent_at > statement_timestamp() - q.message_retention * interval '1 second'
LEFT JOIN leaseq.queues AS s ON s.id = m.dead_letter_source_id
LEFT JOIN leaseq.tenants AS noisy
       ON noisy.queue_id = m.queue_id AND noisy.tenant = m.tenant AND noisy.noisy
GROUP BY q.id, q.name, q.fair, s.name;

-- Generations -----------------------------------------------------------------
--
-- The messages live in generations, partitions of leaseq.messages (migrations
-- 0022, 0023); app/queue/rotation.py moves what is left of the live one into
-- another and empties the old one by TRUNCATE. The statements below that name
-- leaseq.messages_g0 are run with the generation being drained or emptied in
-- its place.

-- name: current_epoch
-- returns: EpochRow
-- The view every service process acts by (app/db/epochs.py).
SELECT epoch, live, draining FROM leaseq.rotation;

-- name: rotation_state
-- returns: RotationRow
-- Where the rotation stands. `settled`: the row versions the live generation
-- has left behind (updated or deleted, PostgreSQL's statistics) since it became
-- live; `standing`: its live rows, as the statistics estimate them; `next_xid`:
-- the first transaction ID not yet handed out (the rotation's readings of what
-- was settled when: app/queue/rotation.py, held_since).
SELECT r.epoch, r.live, r.draining, r.since, leaseq.live_generation() AS published,
       pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid,
       pg_stat_get_tuples_updated(t.oid) + pg_stat_get_tuples_deleted(t.oid)
           - l.settled_before AS settled,
       pg_stat_get_live_tuples(t.oid) AS standing,
       ARRAY(SELECT g.generation FROM leaseq.generations AS g
             WHERE g.state = 'spare' ORDER BY g.generation) AS spares,
       ARRAY(SELECT g.generation FROM leaseq.generations AS g
             WHERE g.state = 'used' ORDER BY g.generation) AS used,
       (SELECT max(g.generation) FROM leaseq.generations AS g) AS top
FROM leaseq.rotation AS r
JOIN leaseq.generations AS l ON l.generation = r.live
CROSS JOIN LATERAL (
    SELECT to_regclass(format('leaseq.messages_g%s', r.live)) AS oid
) AS t;

-- name: start_rotation
-- returns: RotatedRow
-- A new epoch whose live generation is :target, draining :live. The parent's
-- default (the SQL API's sends) follows at once: a sequence is not transactional.
WITH turned AS (
    UPDATE leaseq.rotation
    SET epoch = epoch + 1, live = :target, draining = :live, since = statement_timestamp()
    WHERE epoch = :epoch AND draining IS NULL
    RETURNING epoch
),
published AS (
    SELECT setval('leaseq.live_generation_seq', :target) FROM turned
),
states AS (
    UPDATE leaseq.generations AS g
    SET state = CASE WHEN g.generation = :target THEN 'live' ELSE 'draining' END,
        settled_before = CASE
            WHEN g.generation = :target
            THEN pg_stat_get_tuples_updated(to_regclass(format('leaseq.messages_g%s', :target)))
                 + pg_stat_get_tuples_deleted(to_regclass(format('leaseq.messages_g%s', :target)))
            ELSE g.settled_before END
    FROM turned
    WHERE g.generation IN (:target, :live)
)
SELECT t.epoch
FROM turned AS t, published;

-- name: finish_drain
-- returns: RotatedRow
-- The generation drained holds no message: a new epoch names the live one alone.
WITH turned AS (
    UPDATE leaseq.rotation
    SET epoch = epoch + 1, draining = NULL
    WHERE epoch = :epoch AND draining = :draining
    RETURNING epoch
),
states AS (
    UPDATE leaseq.generations AS g SET state = 'used'
    FROM turned
    WHERE g.generation = :draining
)
SELECT t.epoch
FROM turned AS t;

-- name: publish_live
-- returns: PublishedRow
-- The parent's default put back on the live generation (a rotation cut short
-- between its sequence and its row).
SELECT setval('leaseq.live_generation_seq', :live) AS published;

-- name: epochs_held_below
-- returns: HoldersRow
-- Processes still acting by an epoch older than :epoch (their shared locks,
-- app/db/epochs.py).
SELECT count(*) AS holders
FROM pg_locks AS l
WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
  AND CAST(l.classid AS bigint) = :space AND CAST(l.objid AS bigint) < :epoch;

-- name: old_writers
-- returns: WriterRow
-- The oldest transaction, begun before the rotation, that may have written into
-- :generation_table and not ended (a send of the SQL API in its caller's
-- transaction; a prepared transaction, which has no backend). Its rows are moved
-- only once they are committed.
SELECT l.pid, coalesce(nullif(a.application_name, ''), a.backend_type, 'prepared') AS who,
       a.xact_start
FROM pg_locks AS l
LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.granted
  AND l.relation = to_regclass(:generation_table)
  AND l.mode IN ('RowExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock',
                 'AccessExclusiveLock')
  AND coalesce(a.xact_start, '-infinity') < :since
  AND l.pid IS DISTINCT FROM pg_backend_pid()
ORDER BY a.xact_start NULLS FIRST
LIMIT 1;

-- name: move_messages
-- returns: MovedRow
-- Up to :batch messages of the generation being drained (leaseq.messages_g0
-- here, :draining), past id :after, into the live one (:live), each whole: its
-- id, its lease, its receipt. An UPDATE of the partition key, not a DELETE and
-- an INSERT: a statement waiting for one of these rows (an acknowledgement, a
-- heartbeat) then fails with a serialization failure, which the connector runs
-- again and which then finds the row where it went, instead of finding it gone
-- and answering "lease lost". A message waiting becomes visible from the moment
-- of the move, the floors' rule (app/queue/floors.py): a deadline reached from
-- below is never earlier than its write. Rows locked by a statement under way
-- are left for the next batch. Queues that got messages ready to claim are
-- told, as a send tells them.
WITH
{{written}},
moving AS (
    SELECT d.id
    FROM leaseq.messages_g0 AS d
    WHERE d.id > :after
    ORDER BY d.id
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
),
moved AS (
    UPDATE leaseq.messages AS m
    SET generation = :live,
        visible_at = CASE WHEN NOT m.leased AND m.visible_at < written.at THEN written.at
                          ELSE m.visible_at END
    FROM moving, written
    WHERE m.id = moving.id AND m.generation = :draining
    RETURNING m.id, m.queue_id, coalesce(m.tenant, m.group_id) AS turn,
              NOT m.leased AND m.visible_at <= written.at AS ready
),
turned AS (
    -- A fair or FIFO queue's message waiting, visible from the moment of the
    -- move: its tenant or group a turn there (a claim that sees the move, and
    -- not the message as claimable yet, may delete the turn it had).
    INSERT INTO leaseq.turns (queue_id, tenant, at)
    SELECT m.queue_id, m.turn, written.at
    FROM (SELECT DISTINCT queue_id, turn FROM moved WHERE ready AND turn IS NOT NULL) AS m
    JOIN leaseq.queues AS q ON q.id = m.queue_id AND (q.fair OR q.fifo), written
),
told AS (
    SELECT pg_notify('leaseq', leaseq.notice(m.queue_id, count(*), NULL))
    FROM moved AS m
    WHERE m.ready
    GROUP BY m.queue_id
)
SELECT count(*) AS moved, coalesce(max(m.id), 0) AS last, (SELECT count(*) FROM told) AS told
FROM moved AS m;

-- name: drained
-- returns: DrainedRow
-- Whether the generation being drained (leaseq.messages_g0 here) holds no
-- message its snapshot sees.
SELECT NOT EXISTS (SELECT 1 FROM leaseq.messages_g0) AS drained;

-- name: lock_briefly
-- A rotation's catalog changes wait for their locks no longer than this.
SET LOCAL lock_timeout = '200ms';

-- name: lock_generation
-- Nothing may read or write the generation (leaseq.messages_g0 here) while it
-- is emptied; NOWAIT: a pg_dump or any reader holding it makes the try fail at
-- once, never queue (the cycle's statements would queue behind it).
LOCK TABLE leaseq.messages_g0 IN ACCESS EXCLUSIVE MODE NOWAIT;

-- name: truncate_generation
TRUNCATE leaseq.messages_g0;

-- name: resume_autovacuum
ALTER TABLE leaseq.messages_g0 RESET (autovacuum_enabled);

-- name: pause_autovacuum
-- A drained generation is written no more until it is emptied: autovacuum's
-- rounds on it, which can remove nothing while the horizon is held, would only
-- scan it.
ALTER TABLE leaseq.messages_g0 SET (autovacuum_enabled = false);

-- name: spare_generation
UPDATE leaseq.generations SET state = 'spare' WHERE generation = :generation AND state = 'used';

-- name: make_generation
SELECT FROM leaseq.make_generation(CAST(:generation AS smallint));
