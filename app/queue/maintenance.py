"""What runs once across a deployment, not once per process.

The maintenance rounds -- the retention sweep (with FIFO queues' deduplication
ids and receive attempts), the vacuum check, fair queues' fairness round
(app/queue/fairness.py), the horizon check's warning (app/queue/horizon.py) and
the rotation of the messages' generations (app/queue/rotation.py) -- run only
in the process holding the maintenance lock (app/db/fleet.py), whichever
replica or uvicorn worker that is; when it dies, another takes the
lock within about a second and runs a round at once. Each round is safe to run
twice (its statements skip or wait for each other's rows), so the lock saves the
fleet repeating the work; it is not what keeps the data right.

Not here: redrive tasks already run once across the fleet, each held by one
process through a lease on its row (app/queue/redrive.py); the metrics refresh
is each process's own.
"""

from __future__ import annotations

from app.db.fleet import FleetLock
from app.db.hosts import Dialer
from app.queue.sql import Q

ROUNDS = ("retention sweep", "vacuum check", "fairness round", "horizon check",
          "generation rotation")


class Maintenance:
    """The maintenance lock of this process, and what holding it means."""

    def __init__(self, url: str, *, dial: Dialer) -> None:
        self.lock = FleetLock(
            url, Q.try_maintenance_lock, name="leaseq-maintenance", dial=dial
        )

    def running(self) -> list[str]:
        """The rounds this process runs for the fleet now (for /readyz)."""
        return list(ROUNDS) if self.lock.held else []
