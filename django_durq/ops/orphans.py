"""Orphaned jobs: running jobs whose worker has ended, as the health view, ``durq show`` and the admin show them.

A worker's presence lock is released the moment its process ends (on PostgreSQL and MariaDB also
its database session): from then until the maintenance leader takes its jobs over (within a
second while a worker runs; see ``worker/takeover.py``), or their leases run out, each is
*orphaned*: its row still says ``running``, and these functions say which worker it was left by.
A job whose worker holds no lock (heartbeat rows) is not judged here: its lease decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..clock import ms_to_datetime
from ..db import presence
from ..db.presence import Liveness
from ..models import WorkerProcess
from .reading import alias_of, jobs_on

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


def ended_workers(worker_ids: list[str], *, using: str | None = None) -> set[str]:
    """Which of these workers have ended by what their locks say: released, where their rows say they hold one."""
    alias = alias_of(using)
    ids = sorted(set(worker_ids))
    if not ids:
        return set()
    holds = dict(WorkerProcess.objects.using(alias).filter(worker_id__in=ids).values_list("worker_id", "holds_lock"))
    # A worker without a row is not judged: a test's drain(), or a row an operator deleted.
    states = presence.states(alias, {worker_id: holds.get(worker_id, False) for worker_id in ids})
    return {worker_id for worker_id, state in states.items() if state is Liveness.RELEASED}


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
