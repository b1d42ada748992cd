"""Maintenance duties (cron, pruning, stale worker rows), run by one worker per database at a time.

A duty is a small object with ``name``, ``every_ms`` and ``run_once(now_ms) -> dict of counts``.
The leader is whoever holds the leader's presence lock (``db/presence.py``): a file lock on SQLite,
a session lock on PostgreSQL and MariaDB. Nothing is renewed, and a dead leader's lock is free
the moment its process ends. A worker that holds no presence lock competes for one
``DutyLease`` row by compare-and-set instead; the holder renews it each pass, and if it dies
another worker takes over once the lease expires. The leader runs a pass each interval; a pass
runs a duty when ``every_ms`` has passed since it last ran, or at once when its last run found
work (a count above zero: there may be more), so an idle database costs a few reads a second
rather than every duty's.
"""

from __future__ import annotations

import functools
import logging
import operator
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Q

from ..db import presence
from ..db.presence import Liveness
from ..db.session_presence import RECONNECT_S, SessionPresence
from ..models import DutyLease, WorkerProcess
from . import row_presence
from .held_places import free_ended_places
from .takeover import Takeover

if TYPE_CHECKING:
    from .runtime import Runtime

logger = logging.getLogger("django_durq")

LEASE_NAME = "maintenance"
INTERVAL_MS = 1_000
# The lease is short so that a killed holder's duties resume within seconds. The duties do not
# rely on it for safety (a schedule's due time is taken by compare-and-set, pruning deletes only
# what is still expired), so when a slow pass lets it run out, two holders for a moment cost
# nothing but work done twice.
LEASE_TTL_MS = 4 * INTERVAL_MS
# The longest the duties wait for another worker after their holder dies: its lease runs out,
# then the next pass of another worker takes it.
TAKEOVER_MS = LEASE_TTL_MS + INTERVAL_MS
# Passes start this long after each whole interval of the clock, so that a due time on a whole
# second is reached by the pass just after it, not a second later.
PASS_OFFSET_MS = 20


class Duty(Protocol):
    name: str
    every_ms: int  # how often it runs while it finds nothing to do

    def run_once(self, now_ms: int) -> dict[str, int]: ...


_duty_factories: list[Callable[[Runtime], Duty]] = []


def register_duty(factory: Callable[[Runtime], Duty]) -> Callable[[Runtime], Duty]:
    """Add a duty to every worker's maintenance runner (the factory gets the worker runtime)."""
    if factory not in _duty_factories:
        _duty_factories.append(factory)
    return factory


class StaleWorkers:
    """Handles the workers that have ended: takes their running jobs over, then removes their rows.

    A worker whose presence lock is released has ended (killed, crashed, or cut off for longer
    than a session may be silent). The duty looks every second, from the locks alone, at the
    workers it knows: those whose rows it read (every ``ROSTER_EVERY_MS``, and when it starts to
    lead) and, on SQLite, every lock file. While no worker ends it reads no table: on SQLite the
    kernel answers, on PostgreSQL one read of ``pg_locks``, on MariaDB one ``IS_USED_LOCK`` per
    worker. The running jobs of an ended worker are taken over (``takeover.py``) within a pass
    of its end; a worker that started after the last read of the rows is seen at the next one.

    A worker that holds no lock writes its row every few seconds instead (``row_presence.py``):
    silent for ``GONE_S``, its running jobs are taken over, once this leader's own passes (and its
    own row's beats, where it holds no lock either) have gone on unbroken that long, so that after
    an outage every worker has had the time to write its row again. A row that does not say how
    often it is written (an older worker) leaves the worker's jobs to their leases. Either way the
    row goes once it has missed ten heartbeats.

    After a database restart every worker's session ends: the leader, whose session ended too,
    waits until the others have had time to take their locks again (``_reconnecting``), so it
    takes over only the jobs of workers that did not come back.
    """

    name = "stale-workers"
    every_ms = INTERVAL_MS  # how soon an ended worker's jobs are taken over; the look reads no table
    ROSTER_EVERY_MS = 5_000  # how often the rows are read: a row outlives its worker by this at most

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.takeover = Takeover(runtime)
        # The workers this leader knows: worker id -> (last_seen_ms as read, holds_lock, beat_ms).
        self._roster: dict[str, tuple[int, bool, int | None]] = {}
        self._roster_read_ms: int | None = None
        self._last_run_ms = 0
        self._passes_since = time.monotonic()  # since when this leader's passes have followed each other

    def run_once(self, now_ms: int) -> dict[str, int]:
        alias = self.runtime.settings.database
        # After a gap (this worker has just started to lead) the rows are read again at once.
        gap = now_ms - self._last_run_ms > 2 * INTERVAL_MS
        if gap:
            self._passes_since = time.monotonic()
        fresh = self._roster_read_ms is None or now_ms - self._roster_read_ms >= self.ROSTER_EVERY_MS or gap
        self._last_run_ms = now_ms
        workers = WorkerProcess.objects.using(alias)
        if fresh:
            # Read first: on SQLite even a DELETE that matches nothing takes the write lock.
            self._roster = {
                worker_id: (seen_ms, holds_lock, beat_ms)
                for worker_id, seen_ms, holds_lock, beat_ms in workers.values_list(
                    "worker_id", "last_seen_ms", "holds_lock", "beat_ms"
                )
            }
            self._roster_read_ms = now_ms
        watched = {worker_id: row[1] for worker_id, row in self._roster.items() if worker_id != self.runtime.worker_id}
        for worker_id in presence.lock_files(alias):  # SQLite: workers that started since the rows were read
            if worker_id != self.runtime.worker_id:
                watched.setdefault(worker_id, True)
        states = presence.states(alias, watched) if watched else {}
        ended = sorted(worker_id for worker_id, state in states.items() if state is Liveness.RELEASED)
        if ended and self._reconnecting():
            return {"removed": 0, "taken_over": 0, "ended": 0}  # judged again once the others had time to reconnect
        beating = [
            worker_id
            for worker_id, state in states.items()
            if state is Liveness.UNKNOWN and worker_id in self._roster and self._roster[worker_id][2] is not None
        ]
        silent = row_presence.silent(alias, beating, now_ms) if beating and self._judges_rows() else set()
        orphaned = sorted({*ended, *silent})
        counts = self.takeover.take_over(orphaned, watched, now_ms) if orphaned else {"taken_over": 0, "ended": 0}
        horizon = now_ms - 10 * self.runtime.settings.heartbeat_interval_ms
        gone: list[Q] = []
        for worker_id in ended:
            if worker_id in self._roster:
                # Only if its row is still as read: a worker that took its lock again writes its row anew.
                gone.append(Q(worker_id=worker_id, last_seen_ms=self._roster[worker_id][0]))
        # A row that beats goes only with the takeover of its jobs (``silent``), never before it.
        long_silent = [
            worker_id
            for worker_id, state in states.items()
            if fresh
            and state is Liveness.UNKNOWN
            and worker_id in self._roster
            and self._roster[worker_id][0] < horizon
            and (self._roster[worker_id][2] is None or worker_id in silent)
        ]
        # Only if it is still silent: its worker may have just beaten.
        gone.extend(Q(worker_id=worker_id, last_seen_ms__lt=horizon) for worker_id in long_silent)
        deleted = 0
        if gone:
            deleted, _ = workers.filter(functools.reduce(operator.or_, gone)).delete()
        for worker_id in [*ended, *long_silent]:
            self._roster.pop(worker_id, None)
        if fresh or ended:
            presence.sweep(alias)  # after the rows: a released lock file is what marks a row as ended
        if fresh or deleted:
            free_ended_places(alias)  # the places under limits of workers whose rows are gone
        return {"removed": deleted, **counts}

    def _judges_rows(self) -> bool:
        """Whether this leader may judge a worker gone by its row's silence (``row_presence.py``).

        Only once its own passes, and its own row's beats where it has them, have gone on without a
        break for ``GONE_S``: after an outage (or a stall of this leader) every row is old, and each
        worker must first have had the time to write its row again.
        """
        if time.monotonic() - self._passes_since < row_presence.GONE_S:
            return False
        beat = self.runtime.beat
        return beat is None or beat.unbroken_for() >= row_presence.GONE_S

    def _reconnecting(self) -> bool:
        """True for ``RECONNECT_S`` after this leader's own presence session was opened again.

        A database restart ends every worker's session at once; each opens a new one and takes its
        lock again within ``RECONNECT_S``, the most its presence thread waits between tries. A
        leader whose own session was lost too (the restart made it lead again) judges no worker
        ended before then. One whose session a worker's end did not touch (it led all along, or
        took over from a leader that was killed, or has just started) judges at once.
        """
        held = self.runtime.presence
        if not isinstance(held, SessionPresence):
            return False  # a lock file ends only with its process
        if held.held_since() is None:
            return True
        return held.reopened_at is not None and time.monotonic() - held.reopened_at < RECONNECT_S


register_duty(StaleWorkers)


def acquire_duty_lease(alias: str, holder: str, now_ms: int, ttl_ms: int, name: str = LEASE_NAME) -> bool:
    """Take or renew the named lease by compare-and-set; True when ``holder`` holds it now.

    It reads before it writes, and renews only past half its time, so that idle workers on
    SQLite do not take the write lock every second just to learn that someone else holds it.
    """
    leases = DutyLease.objects.using(alias)
    current = leases.filter(name=name).values_list("holder", "expires_ms").first()
    if current is not None:
        current_holder, expires_ms = current
        if current_holder == holder and expires_ms - now_ms > ttl_ms // 2:
            return True
        if current_holder != holder and expires_ms >= now_ms:
            return False
    updated = (
        DutyLease.objects.using(alias)
        .filter(name=name)
        .filter(Q(holder=holder) | Q(expires_ms__lt=now_ms))
        .update(holder=holder, expires_ms=now_ms + ttl_ms)
    )
    if updated:
        return True
    try:
        with transaction.atomic(using=alias):
            DutyLease.objects.using(alias).create(name=name, holder=holder, expires_ms=now_ms + ttl_ms)
        return True
    except IntegrityError:
        return False


def release_duty_lease(alias: str, holder: str, name: str = LEASE_NAME) -> None:
    """Let the named lease go at once if ``holder`` holds it: a stopping worker's duties resume without delay."""
    DutyLease.objects.using(alias).filter(name=name, holder=holder).update(expires_ms=0)


def _runner(duty: Duty, now_ms: int) -> Callable[[object], dict[str, int]]:
    return lambda dialect: duty.run_once(now_ms)


class MaintenanceRunner:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.duties = [factory(runtime) for factory in _duty_factories]
        # When each duty runs next (clock ms); a worker that becomes the holder runs them all.
        self._next_run_ms: dict[str, int] = {}
        self._leading = False
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="durq-maintenance", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def run_once(self, now_ms: int) -> dict[str, dict[str, int]] | None:
        """Run every duty if this worker holds the lease; None when another worker does."""
        runtime = self.runtime
        if runtime.presence is not None:
            held = runtime.presence.lead()  # a lock of the OS or of a session: leading costs no write
        else:
            held = runtime.store.retrying(
                "duty lease", lambda d: acquire_duty_lease(runtime.settings.database, runtime.worker_id, now_ms, LEASE_TTL_MS)
            )
        if held != self._leading:
            self._leading = held
            logger.info("durq: this worker %s the maintenance duties", "now runs" if held else "no longer runs")
        if not held:
            self._next_run_ms.clear()
            return None
        results: dict[str, dict[str, int]] = {}
        for duty in self.duties:
            if now_ms < self._next_run_ms.get(duty.name, 0):
                continue
            found_work = True  # a failed run is tried again at the next pass
            try:
                results[duty.name] = runtime.store.retrying(duty.name, _runner(duty, now_ms))
                found_work = any(results[duty.name].values())
            except Exception:
                logger.exception("durq: maintenance duty %s failed", duty.name)
            self._next_run_ms[duty.name] = now_ms + (INTERVAL_MS if found_work else duty.every_ms)
        return results

    def _loop(self) -> None:
        try:
            while not self.stopped.wait(self._until_next_pass_s()):
                self.run_once(self.runtime.clock.now_ms())
        except BaseException as error:  # a duty's own failure is caught in run_once: this is the runner's
            logger.exception("durq: the maintenance runner stopped on an unexpected error")
            self.runtime.fail("maintenance failure", error)
        finally:
            self._hand_back()
            connections.close_all()

    def _hand_back(self) -> None:
        if self.runtime.presence is not None:
            return  # the leader lock is dropped with the presence at a clean stop
        try:
            release_duty_lease(self.runtime.settings.database, self.runtime.worker_id)
        except DatabaseError:
            logger.warning("durq: the maintenance lease could not be handed back; another worker takes it once it runs out")

    def _until_next_pass_s(self) -> float:
        """Seconds until the next pass, on the clock's interval grid however long the last one took.

        Waiting a whole interval after each pass would let passes drift later and later past the
        whole seconds that due times fall on. A leader by presence lock sleeps through the passes
        that would run no duty: each would wake the worker for nothing. One that holds the lease
        row instead passes every interval, as the row must be renewed.
        """
        now = self.runtime.clock.now_ms()
        following = (now - PASS_OFFSET_MS) // INTERVAL_MS * INTERVAL_MS + INTERVAL_MS + PASS_OFFSET_MS
        if self._leading and self.runtime.presence is not None and len(self._next_run_ms) == len(self.duties):
            earliest = min(self._next_run_ms.values())
            # The first pass on the grid at or after the earliest duty's time.
            following = max(following, -((PASS_OFFSET_MS - earliest) // INTERVAL_MS) * INTERVAL_MS + PASS_OFFSET_MS)
        return (following - now) / 1000
