"""Orphaned jobs: running jobs whose worker has ended, as the health view, ``durq show`` and the admin show them.

A worker's presence lock is released the moment its process ends (on PostgreSQL and MariaDB also
its database session): from then until the maintenance leader takes its jobs over (within a
second while a worker runs; see ``worker/takeover.py``), or their leases run out, each is
*orphaned*: its row still says ``running``, and these functions say which worker it was left by.
A worker that holds no lock (heartbeat rows) has ended once it missed its heartbeats; its jobs
then come back through their leases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..clock import ms_to_datetime
from .reading import alias_of, jobs_on, live_workers

# The most orphaned jobs the health view lists.
LISTED = 100


@dataclass
class Orphan:
    id: int
    name: str
    queue: str
    worker: str
    lease_expires_ms: int | None

    def as_dict(self) -> dict[str, Any]:
        expires = ms_to_datetime(self.lease_expires_ms)
        return {
            "id": self.id,
            "name": self.name,
            "queue": self.queue,
            "worker": self.worker,
            "lease_expires_at": expires.isoformat() if expires is not None else None,
        }


def ended_workers(worker_ids: list[str], *, now_ms: int | None = None, using: str | None = None) -> set[str]:
    """Which of these workers are not alive: the rule of ``live_workers()``, which the Queues page and
    ``durq stats`` count by too.

    A worker writes its row before its first claim, and its row is removed only once it has ended
    (its presence lock released, or its heartbeats stopped), so a worker without a row has ended.
    """
    ids = set(worker_ids) - {""}
    if not ids:
        return set()
    return ids - {worker.worker_id for worker in live_workers(now_ms=now_ms, using=alias_of(using))}


def orphaned(*, limit: int = LISTED, using: str | None = None) -> list[Orphan]:
    """Running jobs whose worker has ended, oldest lease first: one read of the running rows."""
    alias = alias_of(using)
    rows = list(
        jobs_on(alias)
        .running()
        .order_by("lease_expires_ms", "id")
        .values_list("id", "name", "queue", "claimed_by", "lease_expires_ms")[: 10 * limit]
    )
    ended = ended_workers([row[3] for row in rows], using=alias)
    return [Orphan(*row) for row in rows if row[3] in ended][:limit]
