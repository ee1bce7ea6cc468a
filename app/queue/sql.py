"""The engine's named statements: app/queue/queries.sql, loaded once, typed."""

from __future__ import annotations

from app.db.queries import Queries, Query, load
from app.queue.rows import (
    ChangedRow,
    CheckpointRow,
    DeduplicationSweptRow,
    DeletedRow,
    DrainedRow,
    EpochRow,
    FairClaimRow,
    FairDeletedRow,
    FairnessRoundRow,
    FairStatsRow,
    FifoClaimRow,
    FifoDeletedRow,
    FifoSentRow,
    GaugeRow,
    GivenBackRow,
    HoldersRow,
    HorizonRow,
    IdRow,
    JudgedNoisyRow,
    LapsedRow,
    LockedRow,
    MadeFairRow,
    MovedRow,
    NameRow,
    NotifiedRow,
    OutlookRow,
    PeekRow,
    PublishedRow,
    QueueIdRow,
    QueueNameRow,
    QueueRow,
    QueueStatsRow,
    ReadyClaimRow,
    RedriveBatchRow,
    RedriveTaskRow,
    ReleasedRow,
    RepairedRow,
    ReplayedRow,
    RotatedRow,
    RotationRow,
    SentRow,
    StandardClaimRow,
    TagsRow,
    TakenTaskRow,
    TaskIdRow,
    TenantBacklogRow,
    VacuumStateRow,
    WriterRow,
)


class Statements(Queries):
    """Each statement of queries.sql with the row it returns (load checks both ways)."""

    create_queue: Query[QueueRow]
    get_queue: Query[QueueRow]
    get_queue_for_update: Query[QueueRow]
    queue_id_by_name: Query[QueueIdRow]
    list_queues: Query[QueueRow]
    update_queue: Query[QueueRow]
    queue_names: Query[QueueNameRow]
    existing_queue_names: Query[NameRow]
    dead_letter_sources: Query[NameRow]
    redrive_return_queues: Query[NameRow]
    lock_redrive_tasks_of_queue: Query[TaskIdRow]
    delete_queue: Query[IdRow]
    get_queue_tags: Query[TagsRow]
    change_queue_tags: Query[TagsRow]
    purge_queue: Query[None]
    queue_stats: Query[QueueStatsRow]
    send_messages: Query[SentRow]
    send_untenanted_messages: Query[SentRow]
    claim_messages: Query[StandardClaimRow]
    claim_waiting_messages: Query[StandardClaimRow]
    claim_ready_messages: Query[ReadyClaimRow]
    claim_ready_waiting_messages: Query[ReadyClaimRow]
    claim_fair_messages: Query[FairClaimRow]
    delete_fair_messages: Query[FairDeletedRow]
    change_fair_visibility: Query[ChangedRow]
    give_back_fair_claims: Query[GivenBackRow]
    make_fair: Query[MadeFairRow]
    without_jit: Query[None]
    fairness_round: Query[FairnessRoundRow]
    add_busy: Query[None]
    judged_noisy: Query[JudgedNoisyRow]
    forget_turns: Query[None]
    adopt_strays: Query[RepairedRow]
    restore_turns: Query[RepairedRow]
    fair_queue_stats: Query[FairStatsRow]
    top_tenants: Query[TenantBacklogRow]
    queue_outlook: Query[OutlookRow]
    change_visibility: Query[ChangedRow]
    give_back_claims: Query[GivenBackRow]
    notify_ready: Query[NotifiedRow]
    notify_queue_changed: Query[NotifiedRow]
    release_message: Query[ReleasedRow]
    delete_messages: Query[DeletedRow]
    save_checkpoint: Query[CheckpointRow]
    sweep_expired: Query[None]
    peek_messages: Query[PeekRow]
    create_redrive_task: Query[TaskIdRow]
    get_redrive_task: Query[RedriveTaskRow]
    list_redrive_tasks: Query[TaskIdRow]
    cancel_redrive_task: Query[TaskIdRow]
    take_redrive_task: Query[TakenTaskRow]
    redrive_batch: Query[RedriveBatchRow]
    messages_vacuum_state: Query[VacuumStateRow]
    try_maintenance_lock: Query[LockedRow]
    database_horizon: Query[HorizonRow]
    vacuum_messages: Query[None]
    send_fifo_messages: Query[FifoSentRow]
    claim_fifo_messages: Query[FifoClaimRow]
    fifo_outlook: Query[OutlookRow]
    delete_fifo_messages: Query[FifoDeletedRow]
    change_fifo_visibility: Query[ChangedRow]
    lapsed_leases: Query[LapsedRow]
    turn_groups_now: Query[None]
    forget_heads: Query[None]
    give_back_fifo_claims: Query[GivenBackRow]
    forget_deduplication: Query[None]
    sweep_deduplication: Query[DeduplicationSweptRow]
    sweep_group_heads: Query[None]
    replay_receive_attempt: Query[ReplayedRow]
    record_receive_attempt: Query[None]
    queue_gauges: Query[GaugeRow]
    current_epoch: Query[EpochRow]
    rotation_state: Query[RotationRow]
    start_rotation: Query[RotatedRow]
    finish_drain: Query[RotatedRow]
    publish_live: Query[PublishedRow]
    epochs_held_below: Query[HoldersRow]
    old_writers: Query[WriterRow]
    move_messages: Query[MovedRow]
    drained: Query[DrainedRow]
    lock_briefly: Query[None]
    lock_generation: Query[None]
    truncate_generation: Query[None]
    resume_autovacuum: Query[None]
    pause_autovacuum: Query[None]
    spare_generation: Query[None]
    make_generation: Query[None]


Q = load("app.queue", Statements)
