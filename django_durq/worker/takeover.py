"""Taking over the running jobs of a worker that has ended, a moment after it ends rather than a lease later.

A worker's presence lock (``db/presence.py``) is freed by the kernel or the database server the
moment its process ends (``kill -9``, the out-of-memory killer, a crashed host whose connection
was reset) and, on PostgreSQL and MariaDB, the moment its database session ends. The maintenance
leader looks every second (``StaleWorkers``) and hands the running jobs of such a worker here:
each attempt is recorded as failed with the reason ``worker lost``, the job is claimable at once
and idle workers are woken; a last attempt becomes a dead letter, as it would once its lease ran
out. An operator's cancel ends the job cancelled instead.

The rows are locked, then the worker's lock is looked at again, then they are written, all in
one transaction: a worker that took its lock back meanwhile keeps its jobs, and one whose
renewal comes after the takeover finds its lease gone (``handlers/context.py``: a worker that loses its
own session tells its handlers to stop, so a takeover never runs beside a handler that has not
been told).

Reading first and writing only what it found, the takeover takes no lock, and no write lock on
SQLite, when the ended worker held no job.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from typing import TYPE_CHECKING

from django.db import transaction

from ..db import Dialect, presence, wakeup
from ..db.dependencies import settle
from ..db.presence import Liveness
from ..db.takeover import Orphan, lock_orphans, running_of, take_over
from ..execution.executor import Executor
from ..execution.outcomes import DEAD, RETRYING, jobs_log
from ..signals import job_dead
from . import row_presence

if TYPE_CHECKING:
    from .runtime import Runtime

logger = logging.getLogger("django_durq")

WORKER_LOST = "worker_lost"  # the kind of the failed attempt in the job's history


def lost_message(vendor: str, by_row: bool = False) -> str:
    """The recorded reason: what the released lock, or the silent row, says about the worker."""
    if by_row:
        return f"worker lost: it holds no presence lock and its row went unwritten for {row_presence.GONE_S:g} s"
    if vendor == "sqlite":
        return "worker lost: its process ended (its lock file was released)"
    return "worker lost: its process or its database session ended (its presence lock was released)"


class Takeover:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def take_over(self, workers: Collection[str], holds_lock: dict[str, bool], now_ms: int) -> dict[str, int]:
        """Take over the running jobs of these ended workers; counts of what it did.

        ``holds_lock``: whether each worker's row says it holds a lock (True where no row is left).
        """
        store = self.runtime.store
        ended = sorted(workers)
        leases = store.retrying("find orphans", lambda d: running_of(d, ended))
        if not leases:
            return {"taken_over": 0, "ended": 0}
        done = store.retrying("take over", lambda d: self._take(d, leases, holds_lock, now_ms))
        self._announce(done, now_ms)
        return {"taken_over": len(done), "ended": sum(1 for orphan, _ in done if orphan.ends)}

    def _take(
        self, dialect: Dialect, leases: list[tuple[int, int]], holds_lock: dict[str, bool], now_ms: int
    ) -> list[tuple[Orphan, list[dict[str, object]]]]:
        alias = self.runtime.settings.database
        done = []
        with transaction.atomic(using=alias):
            orphans = lock_orphans(dialect, leases)
            # Looked at again under the row locks: a worker that holds its lock again, or whose row
            # was written meanwhile, keeps its jobs.
            states = presence.states(alias, {orphan.worker: holds_lock.get(orphan.worker, True) for orphan in orphans})
            released = {worker for worker, state in states.items() if state is Liveness.RELEASED}
            silent = row_presence.silent(alias, [worker for worker, state in states.items() if state is Liveness.UNKNOWN], now_ms)
            for orphan in orphans:
                if orphan.worker not in released and orphan.worker not in silent:
                    continue
                message = lost_message(dialect.vendor, by_row=orphan.worker in silent)
                errors = json.loads(orphan.errors or "[]")
                errors.append(
                    {
                        "attempt": orphan.attempts,
                        "at_ms": now_ms,
                        "worker": orphan.worker,
                        "kind": WORKER_LOST,
                        "type": "",
                        "message": message,
                        "traceback": "",
                    }
                )
                if take_over(dialect, orphan, now_ms, json.dumps(errors)):
                    done.append((orphan, errors))
            due = [orphan.queue for orphan, _ in done if not orphan.ends]
            if due:
                wakeup.wake_on_commit(alias, sorted(set(due)), jobs=len(due))
        return done

    def _announce(self, done: list[tuple[Orphan, list[dict[str, object]]]], now_ms: int) -> None:
        """Log, count and announce what the committed takeover did; count the ends of dead letters."""
        runtime = self.runtime
        for orphan, errors in done:
            extra = {"job_id": orphan.id, "job_name": orphan.name, "queue": orphan.queue, "attempt": orphan.attempts}
            if orphan.stop_requested:
                jobs_log.info(
                    "durq: job %s (%s) taken over from worker %s, which ended -> cancelled, as an operator asked",
                    orphan.id,
                    orphan.name,
                    orphan.worker,
                    extra=extra,
                )
            elif orphan.last_attempt:
                jobs_log.error(
                    "durq: job %s (%s) taken over from worker %s, which ended, on its last attempt %s/%s -> dead letter",
                    orphan.id,
                    orphan.name,
                    orphan.worker,
                    orphan.attempts,
                    orphan.max_attempts,
                    extra=extra,
                )
                runtime.count(orphan.queue, DEAD)
                runtime.events.emit(
                    job_dead, sender=Executor, error=None, job_id=orphan.id, name=orphan.name, queue=orphan.queue, errors=errors
                )
            else:
                jobs_log.warning(
                    "durq: job %s (%s) taken over from worker %s, which ended: attempt %s/%s failed (worker lost); claimable now",
                    orphan.id,
                    orphan.name,
                    orphan.worker,
                    orphan.attempts,
                    orphan.max_attempts,
                    extra=extra,
                )
                runtime.count(orphan.queue, RETRYING)
        ended = [orphan.id for orphan, _ in done if orphan.ends and orphan.dependents]
        if ended:
            try:
                runtime.store.retrying("settle", lambda d: settle(d, now_ms, ended), give_up_after_s=5.0)
            except Exception:  # noqa: BLE001 - the settle duty counts them
                logger.warning("durq: could not count the end of job(s) %s for their dependents; the sweep will", ended)
