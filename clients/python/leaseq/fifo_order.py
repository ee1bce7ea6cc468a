"""The order of a FIFO queue's groups in the worker.

On a FIFO queue (its messages carry a `group`) each group's messages are handled
one at a time, in the order received, while different groups run concurrently (a
concurrency slot is a group). A message starts only once the one before it in its
group has been settled (acknowledged or released; every held message's lease is
heartbeated meanwhile). A message of a group that is not acknowledged (failed and
released, abandoned, ...) makes the worker release, unhandled and visible at once,
the messages of that group it received with it or before it, so that the service
redelivers the group in order.

Each held message's `turn` is the one decision made here: True, it may run; False,
it is to be released unhandled. The runner waits for it; nothing else does.
"""

from __future__ import annotations

import asyncio
import logging

from leaseq.job import Job, Outcome

log = logging.getLogger("leaseq.worker")


class GroupOrder:
    """The held messages of each group, in the order received, and whose turn it is."""

    def __init__(self, queue: str, concurrency: int) -> None:
        self.queue = queue
        self.concurrency = concurrency
        self.fifo: bool | None = None
        """True once the queue is known to be FIFO (by its attributes or by a
        message with a group); None until then."""
        self._groups: dict[str, list[Job]] = {}

    def clear(self) -> None:
        """A new serve holds no message yet."""
        self._groups = {}

    def detected(self, how: str) -> None:
        if not self.fifo:
            self.fifo = True
            log.info("queue %r is a FIFO queue (by %s): each group's messages are handled "
                     "one at a time, in order; up to %d groups at once",
                     self.queue, how, self.concurrency)

    def join(self, job: Job) -> None:
        """A message of a group was received: it runs once its turn comes."""
        assert job.group is not None
        self.detected("its messages")
        job.turn = asyncio.get_running_loop().create_future()
        jobs = self._groups.setdefault(job.group, [])
        jobs.append(job)
        _advance(jobs)

    def leave(self, job: Job) -> None:
        """A FIFO message is settled: the next of its group may run, unless this
        one was not acknowledged; then the messages of its group held since its
        receive (or before) are released unhandled, for the group to come again in order."""
        assert job.group is not None
        jobs = self._groups.get(job.group)
        if jobs is None or job not in jobs:
            return
        if job.outcome is not Outcome.ACKNOWLEDGED:
            for other in jobs:
                if (other is not job and other.batch <= job.batch
                        and other.turn is not None and not other.turn.done()):
                    other.turn.set_result(False)
        jobs.remove(job)
        if jobs:
            _advance(jobs)
        else:
            del self._groups[job.group]

    def successor_waits(self, job: Job) -> bool:
        """A FIFO message with a later one of its group held here, waiting for it."""
        jobs = self._groups.get(job.group) if job.group is not None else None
        return jobs is not None and len(jobs) > 1

    def busy_groups(self) -> int:
        """Concurrency slots the groups use: each until its last held message's
        acknowledgement is queued."""
        return sum(1 for jobs in self._groups.values() if any(not job.freed for job in jobs))

    def release_waiting(self) -> None:
        """Shutdown: the messages waiting for their turn have not started: release
        them now (a group's earlier messages still held keep it blocked meanwhile)."""
        for jobs in self._groups.values():
            for job in jobs:
                if job.turn is not None and not job.turn.done():
                    job.turn.set_result(False)


def _advance(jobs: list[Job]) -> None:
    """The first held message of a FIFO group may run (once: a turn is decided once)."""
    head = jobs[0]
    if head.turn is not None and not head.turn.done():
        head.turn.set_result(True)
