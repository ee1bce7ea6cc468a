"""The rows the queue engine's statements (app/queue/queries.sql) return, one TypedDict per shape,
named in each statement's `-- returns:` header. A column that may be NULL is
`X | None`. tests/engine/test_typed_rows.py prepares every statement on
PostgreSQL and holds these to the columns it answers: names and types.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import TypedDict
from uuid import UUID


class QueueRow(TypedDict):
    id: int
    name: str
    visibility_timeout: int
    message_retention: int
    delay: int
    receive_wait: int
    max_message_bytes: int
    dead_letter_queue_id: int | None
    dead_letter_queue: str | None
    max_receive_count: int | None
    retry_initial: float | None
    retry_multiplier: float | None
    retry_max: float | None
    retry_jitter: float | None
    fifo: bool
    content_based_deduplication: bool
    deduplication_scope: str
    fifo_throughput_limit: str
    deduplicates_by: str
    policy: str | None
    kms_master_key_id: str | None
    kms_data_key_reuse_period: int
    sqs_managed_sse: bool
    redrive_allow_policy: str | None
    redrive_sources: list[str] | None
    fair: bool
    fair_in_flight_share: float
    fair_in_flight_min: int
    fair_processing_share: float
    created_at: datetime
    updated_at: datetime


class QueueIdRow(TypedDict):
    id: int
    fifo: bool
    redrive_sources: list[str] | None


class QueueNameRow(TypedDict):
    id: int
    name: str


class NameRow(TypedDict):
    name: str


class TaskIdRow(TypedDict):
    id: UUID


class IdRow(TypedDict):
    id: int


class LapsedRow(TypedDict):
    id: int
    token: UUID


class TagsRow(TypedDict):
    tags: str


class QueueStatsRow(TypedDict):
    visible: int
    in_flight: int
    delayed: int
    oldest_age_seconds: Decimal


class SentRow(TypedDict):
    message_id: UUID
    sent_at: datetime
    due_in: Decimal
    notified: None


class OutlookRow(TypedDict):
    due_in: Decimal | None
    more_now: bool


class ChangedRow(TypedDict):
    id: int
    lease_expires_at: datetime
    visibility_timeout: int
    sooner: bool


class GivenBackRow(TypedDict):
    given: int
    notified: None


class NotifiedRow(TypedDict):
    pg_notify: None


class ReleasedRow(TypedDict):
    delay: Decimal
    visible_at: datetime


class DeletedRow(TypedDict):
    id: int
    held: float | None


class FairDeletedRow(DeletedRow):
    """delete_fair_messages: each row's tenant too, for its processing time."""

    tenant: str | None


class FifoDeletedRow(TypedDict):
    id: int
    held: float | None
    notified: None


class CheckpointRow(TypedDict):
    lease_expires_at: datetime


class PeekRow(TypedDict):
    id: int
    message_id: UUID
    body: str
    truncated: bool
    attributes: str
    receive_count: int
    sent_at: datetime
    first_received_at: datetime | None
    visible_at: datetime
    checkpoint: str | None
    dead_letter_source: str | None
    fencing_token: int | None
    group: str | None
    lease_remaining: Decimal | None
    state: str


class RedriveTaskRow(TypedDict):
    id: UUID
    status: str
    moved: int
    to_move_at_start: int
    max_per_second: int | None
    failure: str | None
    created_at: datetime
    updated_at: datetime
    source: str
    destination: str | None
    remaining: int


class TakenTaskRow(TypedDict):
    id: UUID
    max_per_second: int | None


class RedriveBatchRow(TypedDict):
    status: str
    moved: int
    destinations: list[int] | None


class VacuumStateRow(TypedDict):
    autovacuum: bool
    dead: int
    live: int


class LockedRow(TypedDict):
    locked: bool


class HorizonRow(TypedDict):
    """The oldest holder of the cleanup horizon (database_horizon); `kind` None:
    none holds it. Which columns a holder fills depends on its kind."""

    now: datetime
    next_xid: int
    kind: str | None
    xid_age: int | None
    since: datetime | None
    pid: int | None
    application_name: str | None
    username: str | None
    client_addr: str | None
    state: str | None
    backend_type: str | None
    database: str | None
    query: str | None
    slot_name: str | None
    slot_type: str | None
    gid: str | None


class FifoSentRow(TypedDict):
    message_id: UUID
    sequence_number: int
    stored: bool
    sent_at: datetime
    notified: None


class SweptRow(TypedDict):
    swept: int


class DeduplicationSweptRow(SweptRow):
    """sweep_deduplication: how many, and the last expiry it reached in each
    table (None: none past)."""

    deduplication_to: datetime | None
    attempts_to: datetime | None


class RepairedRow(SweptRow):
    """adopt_strays, restore_turns: how many, and the queues told to read from
    the start again."""

    told: int


class MadeFairRow(TypedDict):
    made: bool


class FairnessRoundRow(TypedDict):
    queues: int
    tenants: int
    noisy: int
    forgotten: int


class JudgedNoisyRow(TypedDict):
    queue_id: int
    tenant: str
    in_flight: int


class FairStatsRow(TypedDict):
    noisy_tenants: int
    quiet_visible: int
    quiet_in_flight: int
    quiet_oldest_age_seconds: Decimal


class TenantBacklogRow(TypedDict):
    tenant: str
    visible: int
    in_flight: int
    noisy: bool


class GaugeRow(TypedDict):
    name: str
    source: str | None
    messages: int
    visible: int
    in_flight: int
    delayed: int
    oldest_visible_age: Decimal | None
    fair: bool
    noisy_tenants: int | None
    quiet_visible: int
    quiet_in_flight: int
    quiet_oldest_visible_age: Decimal | None


class MessageColumns(TypedDict):
    """A claimed message as its receiver gets it: the columns claimed.py makes a
    received message of (queries.sql's fragment `received_columns`)."""

    id: int
    message_id: UUID
    body: str
    attributes: str
    attribute_types: str | None
    sender_id: str | None
    trace_header: str | None
    receive_count: int
    claim_token: UUID
    fencing_token: int
    lease_expires_at: datetime
    sent_at: datetime
    first_received_at: datetime
    checkpoint: str | None
    tenant: str | None
    dead_letter_source_id: int | None


class ClaimColumns(MessageColumns):
    """A claim's row for each message it took (claim_ready_messages' whole row)."""

    lapsed: bool


class ClaimRow(ClaimColumns):
    """claim_messages: always one row at least. When it claimed nothing, that
    row's message columns are NULL (the readers skip a row without an `id`)."""

    dead: int
    acked: list[int]
    acked_held: list[float | None]


class FloorColumns(TypedDict):
    """What a standard queue's claim saw below it (queries.sql's fragment
    floored_candidates), for app/queue/floors.py. A claim that reads the
    waiting range alone reports no floors and no xmin (NULL), only its mark."""

    ready_floor: datetime | None
    lease_floor: datetime | None
    ready_from: datetime | None
    lease_from: datetime | None
    snapshot_xmin: int | None
    looked_at: datetime
    claim_xid: int | None


class ReadyClaimRow(ClaimColumns, FloorColumns):
    """claim_ready_messages: one row at least, as ClaimRow's; the floors on each."""


class StandardClaimRow(ClaimRow, FloorColumns):
    """claim_messages on a standard queue: ClaimRow, the floors on each row."""


class FairClaimRow(ClaimRow, FloorColumns):
    """claim_fair_messages: ClaimRow, the floor of the queue's turns on each row
    (as both of FloorColumns' ranges), and the tenants of the acknowledged."""

    acked_tenants: list[str | None]


class FifoClaimRow(ClaimColumns, FloorColumns):
    """claim_fifo_messages: like ClaimRow, one row at least, each message with
    its group, its place in it and the receiver of the group statement it is
    for; the floor of the queue's turns on each row, as FairClaimRow's."""

    dead: int
    group_id: str | None
    sequence_number: int
    deduplication_id: str | None
    receiver: int
    group_rank: int


class ReplayedRow(MessageColumns):
    """replay_receive_attempt: a message answered again, with its group and the
    visibility timeout of the attempt it was first claimed for."""

    group_id: str | None
    sequence_number: int
    deduplication_id: str | None
    visibility_timeout: int


class EpochRow(TypedDict):
    epoch: int
    live: int
    draining: int | None


class RotationRow(TypedDict):
    epoch: int
    live: int
    draining: int | None
    since: datetime
    published: int
    next_xid: int
    settled: int
    standing: int
    spares: list[int]
    used: list[int]
    top: int


class RotatedRow(TypedDict):
    epoch: int


class PublishedRow(TypedDict):
    published: int


class HoldersRow(TypedDict):
    holders: int


class WriterRow(TypedDict):
    pid: int | None
    who: str
    xact_start: datetime | None


class MovedRow(TypedDict):
    moved: int
    last: int
    told: int


class DrainedRow(TypedDict):
    drained: bool
