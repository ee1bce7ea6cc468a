"""What the engine tells whoever watches it: the metrics (app/api/metrics.py)
count these per queue. The engine calls them after each operation has committed;
the default watcher does nothing."""

from __future__ import annotations

from collections.abc import Sequence


class QueueEvents:
    """Each method is told one operation's outcome on one queue (by name)."""

    def sent(self, queue: str, count: int) -> None:
        """`count` messages accepted (durable)."""

    def received(
        self, queue: str, count: int, visibility_timeout: int, lapsed: int,
        waited: Sequence[float],
    ) -> None:
        """A receive claimed `count` messages for `visibility_timeout` seconds;
        `lapsed` of them were taken after their previous lease ran out (the
        essay's duplicate-work signal: a handler that outlived its lease);
        `waited` is the send-to-first-receive time of each first delivery, on
        the database clock."""

    def empty_receive(self, queue: str) -> None:
        """A receive answered with no message."""

    def deleted(self, queue: str, count: int, held: Sequence[float]) -> None:
        """`count` messages acknowledged; `held`: each one's lease held time (claim
        to acknowledgement, on the database clock) where it is known."""

    def extended(self, queue: str, count: int) -> None:
        """`count` leases renewed by their holders (heartbeats, checkpoints)."""

    def released(self, queue: str, count: int) -> None:
        """`count` messages given back by their holder (a release, a visibility of 0)."""

    def lease_lost(self, queue: str, count: int) -> None:
        """`count` acknowledgements or lease changes refused: the claim was gone (409)."""

    def dead_lettered(self, queue: str, count: int) -> None:
        """`count` messages moved to the queue's dead-letter queue by a claim."""
