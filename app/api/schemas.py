"""Request and response bodies of the REST API, with the limits of app.queue.limits:
queues, redrive, and what the message schemas (message_schemas.py) build on."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
)

from app.queue import attributes, limits
from app.queue.advice import LeaseAdvice
from app.queue.models import (
    Fairness,
    Queue,
    QueueStats,
    RedriveTask,
    RetryBackoff,
)


def ranged(bounds: tuple[int, int]) -> Any:
    return Field(default=None, ge=bounds[0], le=bounds[1], strict=True)


QueueName = Annotated[str, StringConstraints(pattern=limits.QUEUE_NAME.pattern)]
QueueNameOrEmpty = Annotated[
    str, StringConstraints(pattern=r"^(?:[A-Za-z0-9_-]{0,80}|[A-Za-z0-9_-]{1,75}\.fifo)$")
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RetryBackoffIn(Strict):
    """A release without a delay waits min(max, initial * multiplier^(receive_count-1))
    seconds, less up to `jitter` (a fraction) of it at random."""

    initial: float = Field(ge=limits.RETRY_SECONDS[0], le=limits.RETRY_SECONDS[1])
    multiplier: float = Field(
        default=2.0, ge=limits.RETRY_MULTIPLIER[0], le=limits.RETRY_MULTIPLIER[1]
    )
    max: float = Field(ge=limits.RETRY_SECONDS[0], le=limits.RETRY_SECONDS[1])
    jitter: float = Field(default=0.0, ge=limits.RETRY_JITTER[0], le=limits.RETRY_JITTER[1])


class FairnessIn(Strict):
    """Standard queues: when a tenant (a message's `group`) is noisy, and its messages
    wait while quiet tenants' are delivered first (fair queues, docs/fair-queues.md).
    Given whole: a field left out takes its default."""

    in_flight_share: float = Field(
        default=0.1, gt=limits.FAIR_SHARE[0], le=limits.FAIR_SHARE[1],
        description="Noisy above this share of the queue's messages in flight...",
    )
    in_flight_min: int = Field(
        default=30, ge=limits.FAIR_IN_FLIGHT_MIN[0], le=limits.FAIR_IN_FLIGHT_MIN[1],
        strict=True, description="...with at least this many of its own in flight.",
    )
    processing_share: float = Field(
        default=0.1, gt=limits.FAIR_SHARE[0], le=limits.FAIR_SHARE[1],
        description="Or noisy above this share of the queue's recent processing time "
        "(claim to acknowledgement, decayed over a minute).",
    )


class QueueAttributesIn(Strict):
    visibility_timeout: int | None = ranged(limits.VISIBILITY_TIMEOUT)
    message_retention: int | None = ranged(limits.MESSAGE_RETENTION)
    delay: int | None = ranged(limits.DELAY)
    receive_wait: int | None = ranged(limits.RECEIVE_WAIT)
    max_message_bytes: int | None = ranged(limits.MAX_MESSAGE_BYTES)
    dead_letter_queue: QueueNameOrEmpty | None = Field(
        default=None,
        description="Redrive policy: where exhausted messages go. Null or \"\" in a "
        "PATCH removes the policy.",
    )
    max_receive_count: int | None = Field(
        default=None, ge=limits.MAX_RECEIVE_COUNT[0], le=limits.MAX_RECEIVE_COUNT[1], strict=True,
        description="Redrive policy: receives before a message is dead-lettered.",
    )
    retry_backoff: RetryBackoffIn | None = Field(
        default=None, description="Retry ladder for releases; null in a PATCH removes it."
    )
    fifo: bool | None = Field(
        default=None, strict=True,
        description="A FIFO queue (fixed when the queue is created; its name ends in "
        "\".fifo\", and only a FIFO queue's does): messages of one group are delivered in "
        "send order, one batch of a group in flight at a time, deduplicated for five minutes.",
    )
    content_based_deduplication: bool | None = Field(
        default=None, strict=True,
        description="FIFO: a message sent without a deduplication_id is deduplicated by "
        "the SHA-256 of its body.",
    )
    deduplication_scope: Literal["queue", "message_group"] | None = Field(
        default=None, description="FIFO: deduplication ids are unique per queue or per group.",
    )
    fifo_throughput_limit: Literal["per_queue", "per_message_group_id"] | None = Field(
        default=None,
        description="FIFO: stored and returned as SQS has it; leaseq sets no throughput limit.",
    )
    fair: bool | None = Field(
        default=None, strict=True,
        description="Standard queues: serve quiet tenants first (fair queues). Becomes true "
        "with the first message naming a tenant (`group`), or when set; a fair queue stays "
        "fair.",
    )
    fairness: FairnessIn | None = Field(
        default=None,
        description="Standard queues: the thresholds of a noisy tenant (fair queues).",
    )

    def changes(self) -> dict[str, Any]:
        """The attributes given. Null means "not given", except for the removable
        ones, where a null given explicitly removes them."""
        out: dict[str, Any] = {}
        for name in self.model_fields_set - {"name"}:
            value = getattr(self, name)
            if name == "retry_backoff" and value is not None:
                value = RetryBackoff(**value.model_dump())
            if name == "fairness" and value is not None:
                value = Fairness(**value.model_dump())
            if value is not None or name in attributes.REMOVABLE:
                out[name] = value
        return out


class QueueCreate(QueueAttributesIn):
    name: QueueName


class RetryBackoffOut(BaseModel):
    initial: float
    multiplier: float
    max: float
    jitter: float


class FairnessOut(BaseModel):
    in_flight_share: float
    in_flight_min: int
    processing_share: float


class QueueAttributesOut(BaseModel):
    visibility_timeout: int
    message_retention: int
    delay: int
    receive_wait: int
    max_message_bytes: int
    dead_letter_queue: str | None
    max_receive_count: int | None
    retry_backoff: RetryBackoffOut | None
    fifo: bool
    content_based_deduplication: bool
    deduplication_scope: str
    fifo_throughput_limit: str
    fair: bool = Field(
        description="A standard queue that has had a message naming its tenant (`group`): "
        "its claims serve quiet tenants first. Set by the first such message."
    )
    fairness: FairnessOut


class TenantBacklogOut(BaseModel):
    tenant: str
    visible: int
    in_flight: int
    noisy: bool


class TenantStatsOut(BaseModel):
    """A fair queue's tenants, as SQS's noisy-group metrics count them."""

    noisy_tenants: int = Field(description="ApproximateNumberOfNoisyGroups.")
    quiet_visible: int = Field(
        description="ApproximateNumberOfMessagesVisibleInQuietGroups: visible messages of "
        "tenants that are not noisy (and of messages naming none)."
    )
    quiet_in_flight: int = Field(description="The same, in flight.")
    quiet_oldest_age_seconds: float = Field(
        description="Age of the oldest visible message of a quiet tenant (0: none)."
    )
    top: list[TenantBacklogOut] = Field(description="The tenants with the most messages.")


class StatsOut(BaseModel):
    visible: int
    in_flight: int
    delayed: int
    oldest_age_seconds: float
    tenants: TenantStatsOut | None = Field(default=None, description="Fair queues only.")


class QueueOut(BaseModel):
    name: str
    attributes: QueueAttributesOut
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, queue: Queue) -> QueueOut:
        return cls(
            name=queue.name,
            attributes=QueueAttributesOut.model_validate(
                asdict(queue.attributes)
            ),
            created_at=queue.created_at,
            updated_at=queue.updated_at,
        )


class LeaseAdviceOut(BaseModel):
    """The essay's rule for this queue, from the last ten minutes of this process's
    acknowledgements (docs/workers.md)."""

    samples: int = Field(description="Acknowledgements timed in the window.")
    held_p999_seconds: float | None = Field(
        description="p99.9 of lease held time (claim to acknowledgement, database clock); "
        "null below 100 samples."
    )
    visibility_timeout: int | None = Field(
        description="The lease the p99.9 implies for a worker that does not heartbeat."
    )
    heartbeat_seconds: int | None = Field(
        description="For a worker that heartbeats: a third of the lease it is granted."
    )
    lease_seconds: int | None = Field(description="The lease the last receive was granted.")
    heartbeats: int
    redelivered_after_expiry: int
    warnings: list[str] = Field(
        description="`lease_below_p999`, `redeliveries_rising`; empty when all is well."
    )


class QueueDetail(QueueOut):
    stats: StatsOut
    lease_advice: LeaseAdviceOut | None = Field(
        default=None, description="null until this process has seen the queue's leases."
    )

    @classmethod
    def with_stats(
        cls, queue: Queue, stats: QueueStats, advice: LeaseAdvice | None = None
    ) -> QueueDetail:
        return cls(
            **QueueOut.of(queue).model_dump(), stats=StatsOut(**asdict(stats)),
            lease_advice=None if advice is None else LeaseAdviceOut(**asdict(advice)),
        )


class QueueList(BaseModel):
    queues: list[QueueOut]
    next_after: str | None = Field(
        description="Pass as `after` for the next page; null on the last page."
    )


class Purged(BaseModel):
    purged: int


class DeadLetterSourcesOut(BaseModel):
    queues: list[str]


class RedriveIn(Strict):
    destination: QueueName | None = Field(
        default=None, description="Default: each message's own source queue."
    )
    max_per_second: int | None = Field(default=None, ge=1, le=100_000, strict=True)


class RedriveTaskOut(BaseModel):
    task_id: str
    source: str
    destination: str | None
    status: str
    moved: int
    remaining: int
    to_move_at_start: int
    max_per_second: int | None
    failure: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, task: RedriveTask) -> RedriveTaskOut:
        return cls(**asdict(task))


class RedriveTaskList(BaseModel):
    tasks: list[RedriveTaskOut]
