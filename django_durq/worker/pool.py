"""A bounded pool for one named queue: a dispatcher thread that claims, slot threads that run.

The dispatcher claims jobs into a small ready buffer and slots take them from it. With
``PREFETCH`` at 0 a pool claims no more than its free slots. Otherwise it may claim ahead as
many jobs as its slots are expected to start within ``PREFETCH`` seconds, judged by the pool's
own recent job durations: short jobs are claimed hundreds at a time, while jobs that take
longer than the horizon are never held back from another worker. Buffered jobs are leased and
heartbeated like running ones, and handed back, attempt uncounted, at shutdown. Only as many
slots are awake as the buffer needs (``Slots._wake_for_buffer``): more would take the GIL in turn.

Every claim is an :class:`~.attempt.Attempt`, entered in the process's book before a slot can
see it and left there until its outcome is committed; the lease keeper renews what the book
holds. Bookkeeping here is by attempt, never by job id, so a stale attempt of a job (abandoned
at its timeout, or whose lease lapsed) cannot disturb a newer one of the same job.

Finished jobs are deleted in batches, in the same transaction as the next claim: a finished
job waits in memory at most ``COMPLETION_HOLD_MS`` plus the write in progress, and at most
``FLUSH_BATCH`` of them wait at once; a crash in that window runs them again once their leases
expire (at-least-once). Jobs claimed ahead that wait longer than ``BUFFER_MAX_WAIT_S`` (a long
job took the slot they were meant for) are handed back, attempt uncounted, for idle workers.

An idle dispatcher probes with a read before it claims, so an idle poll on SQLite takes no
write lock, and sleeps until it is kicked (an enqueue, another process's commit, a freed
slot) or the poll interval runs out; while a rate holds its queue's due jobs back, until the
rate's window opens.

Flow control on the worker's side (the claim does the rest, ``db/flow.py``): a slot starts a job
only while its queue was seen not paused lately (``pause_guard.py``), and a job claimed under a
running limit holds a place until the handler's thread is done with it: its running row, and a
place row for a handler that outlives its attempt (``held_places.py``), written before a
timed-out attempt is failed and freed when its thread returns at last.

The pool is in parts: its slots (``slots.py``), the claim-ahead buffer (``claim_ahead.py``) and
the completions held for a batch (``completions.py``). Here: the dispatcher and the pool's start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import connections

from ..conf import hooks
from ..db import ClaimedJob, Lease, wakeup
from ..execution.executor import Executor
from ..execution.outcomes import Completion
from ..handlers.context import JobContext
from .attempt import Attempt
from .claim_ahead import BUFFER_MAX_WAIT_S
from .completions import COMPLETION_HOLD_MS, FLUSH_BATCH
from .flow_gate import FlowGate
from .held_places import HeldPlaces
from .pause_guard import PauseGuard
from .slots import HEAD_STALL_S, Slots

if TYPE_CHECKING:
    from .runtime import Runtime

logger = logging.getLogger("django_durq")

# Where writers are serialized (SQLite) and another connection has written lately: the most jobs
# claimed in one transaction, and how long the lock is then left free, as a multiple of the time
# the transaction held it. Without other writers the dispatcher writes back to back.
SERIALIZED_CLAIM_MAX = 64
SERIALIZED_GAP_FACTOR = 1.0
# How long after another connection last wrote the dispatcher keeps sharing the lock that way.
SHARING_S = 0.25


class Pool(Slots):
    def __init__(self, queue: str, concurrency: int, runtime: Runtime) -> None:
        self.queue = queue
        self.concurrency = concurrency
        self.runtime = runtime
        self.prefetch_ms = runtime.settings.prefetch_ms(queue)
        self._heartbeat_ms = runtime.settings.heartbeat_interval_ms
        self.kick = threading.Event()
        self.finished = threading.Event()  # the dispatcher has stopped and every slot is idle
        self._lock = threading.Lock()
        self._has_ready = threading.Condition(self._lock)
        self._ready: deque[Attempt] = deque()  # claimed, not started
        self._running: set[Attempt] = set()  # handlers running on a slot (abandoned ones excluded)
        self._completions: list[Attempt] = []  # finished, completion not committed yet
        self._finished_results: dict[Lease, Completion] = {}  # set by the executor on the slot's thread
        self._closing = False
        self._busy = 0
        self._sleeping = 0  # slots waiting for a buffered job that nobody has woken yet
        self._threads: list[threading.Thread] = []
        self._completions_since = 0.0
        # Mean handler time per job (seconds), smoothed; decides how far ahead to claim.
        self._mean_job_s: float | None = None
        self._quick_job_s: float | None = None  # the faster jobs' time: decides how many slots to wake
        self._low_water = 0  # a slot that leaves this many buffered jobs kicks the dispatcher
        self._named = False  # a wake-up named this queue since the dispatcher last looked
        self._offered = 0  # jobs this pool said it had a free slot for since then (see _wake)
        self._claiming = 0  # slots the dispatcher's claim in flight may fill (see _wake)
        self._serialized = runtime.store.dialect.serialized_writes
        self._write_free_at = 0.0  # monotonic time before which the dispatcher leaves the write lock alone
        self._sharing_until = 0.0  # another connection wrote lately: share the write lock until then
        self._seen_version: int | None = None
        self._read_version: Callable[[], int] | None = None  # PRAGMA data_version on the dispatcher's connection
        self._prepared_for: object = None  # the driver connection prepare_dispatcher_connection() tuned
        self.gate = FlowGate(queue, runtime)
        self.pause_guard = PauseGuard(queue, runtime)
        self.places = HeldPlaces(runtime.store)
        self.executor = Executor(
            runtime.store,
            runtime.settings,
            runtime.clock,
            runtime.worker_id,
            count=runtime.count,
            defer_completion=self._defer_completion,
            emit=runtime.events.emit,
            emit_many=runtime.events.emit_many,
        )
        self._dispatcher = threading.Thread(target=self._dispatch, name=f"durq-{queue}-dispatch", daemon=True)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        wakeup.subscribe(self.queue, self._wake)
        for _ in range(self.concurrency):
            self._add_thread()
        self._dispatcher.start()

    def _wake(self, named: bool) -> bool:
        """Called by ``wakeup``; ``named`` when a notification named this queue (a job was queued).

        True when a slot is free for the job, counting the jobs already offered since the
        dispatcher last looked and the slots its claim in flight may fill: a ring this pool cannot
        serve at once goes on to another worker. A claim in flight read its time before the ring
        came, so it may not see the job as due; once it is in, the pool looks again (``_named``).
        """
        room = False
        if named:
            runtime = self.runtime
            with self._lock:
                self._named = True
                if not runtime.stop_claiming.is_set() and runtime.book.may_claim(time.monotonic()):
                    room = self._busy + len(self._ready) + self._offered + self._claiming < self.concurrency
                    self._offered += room
        self.kick.set()
        return room

    # --- dispatcher ----------------------------------------------------------------------------

    def _dispatch(self) -> None:
        runtime = self.runtime
        probe = True
        wait_s = 0.0
        try:
            while not runtime.stop_claiming.is_set():
                self._claiming = 0  # no claim in flight from here until the next look
                if wait_s > 0:
                    self.kick.wait(self.gate.until_window(self._buffer_wait(wait_s)))
                    if runtime.stop_claiming.is_set():
                        break  # stopped while waiting: claim nothing more, not even a job just handed back
                self.kick.clear()
                hooks.jitter("dispatch")
                wait_s = runtime.poll_s
                with self._lock:
                    now_mono = time.monotonic()
                    # How long the slot busy longest has run: decides claiming ahead and hand-backs.
                    longest_s = max((now_mono - attempt.ctx.started_mono for attempt in self._running), default=0.0)
                    held = self._busy + len(self._ready)
                    ready = len(self._ready)
                    pending = len(self._completions) + len(self.places)
                    held_for_s = now_mono - self._completions_since
                    target = self._target(longest_s)
                    # Jobs claimed ahead that waited too long because a long job took their slot
                    # (not merely because every commit is slow) go back to other workers.
                    stale = ready > 0 and now_mono - self._ready[0].buffered_at >= BUFFER_MAX_WAIT_S
                    self._wake_for_buffer(now_mono)
                if stale and longest_s >= BUFFER_MAX_WAIT_S:
                    self._hand_back(everything=False)  # the counts above then overstate what is held: no over-claim
                want = target - held
                # Refill once the buffer is half used (at once when it only covers free slots).
                self._low_water = (target - self.concurrency) // 2
                # While a lease this process holds is unconfirmed (see AttemptBook), or the presence
                # lock may be gone, claim nothing: a job taken now might be given to another worker.
                refill = want > 0 and ready <= self._low_water and runtime.book.may_claim(now_mono) and runtime.presence_held()
                overdue = held_for_s * 1000 >= COMPLETION_HOLD_MS
                flush = pending > 0 and (pending >= FLUSH_BATCH or overdue or refill)
                if not refill and not flush:
                    if pending:
                        wait_s = max(COMPLETION_HOLD_MS / 1000 - held_for_s, 0.0005)
                    continue
                # Completions held past their window do not wait for the write lock to be shared.
                if self._serialized and not overdue and self._sharing():
                    rest_s = self._write_free_at - time.monotonic()
                    if rest_s > 0:
                        wait_s = rest_s  # leave the database's single write lock to others a while
                        continue
                now_mono = time.monotonic()
                now = runtime.clock.now_ms()
                with self._lock:
                    named, self._named, self._offered = self._named, False, 0
                    self._claiming = want if refill else 0
                # A notification naming this queue means a job was just queued: claim without
                # probing first. Otherwise probe with a read, so an idle poll takes no write lock.
                probed_due = False
                if refill and probe and not pending and not named:
                    due = self.gate.next_due(now)
                    probed_due = due is not None and due <= now
                    if due is None or due > now:
                        if runtime.burst:
                            if self.held() == 0:
                                break
                            continue
                        poll_ms = runtime.poll_s * 1000
                        wait_s = max(poll_ms if due is None else min(due - now, poll_ms), 1) / 1000
                        continue
                # A flush tops the buffer up too: one transaction both records and claims.
                sharing = self._serialized and time.monotonic() < self._sharing_until
                if sharing:
                    want = min(want, SERIALIZED_CLAIM_MAX)
                # Checked after the claim's time was read: no lease this process holds has expired at it.
                refill = refill and runtime.book.may_claim(time.monotonic())
                limit = runtime.claim_budget(want) if refill and want > 0 else 0
                write_started = time.monotonic()
                jobs = self._record_completions(self._take_completions(), [limit, now] if limit else [])
                if sharing:
                    finished_at = time.monotonic()
                    self._write_free_at = finished_at + (finished_at - write_started) * SERIALIZED_GAP_FACTOR
                runtime.unclaimed(limit - len(jobs))
                if limit:
                    probe = len(jobs) < limit
                    self.gate.claimed(short=len(jobs) < limit)
                    if self.gate.learn(found_none=not jobs and (probed_due or named)) and not jobs:
                        wait_s = 0  # claim again, now through the limited claim
                        continue
                if jobs:
                    self._enter(jobs, now_mono, now)
                    wait_s = runtime.poll_s
                if self._completions:
                    wait_s = COMPLETION_HOLD_MS / 1000
                elif named and not jobs:
                    wait_s = 0  # another worker was quicker: probe now for the next due time
                elif runtime.burst and probe and self.held() == 0:
                    wait_s = 0  # the last claim came back short and nothing is held: probe now, and end if none is due
        except BaseException as error:
            logger.exception("durq: the dispatcher of queue %r stopped on an unexpected error", self.queue)
            runtime.fail("dispatcher failure", error)
        finally:
            wakeup.unsubscribe(self.queue, self._wake)
            self._hand_back(everything=True)
            while self.busy() > 0:
                self.kick.wait(0.05)
                self.kick.clear()
                self.flush_completions()
            self.flush_completions()
            with self._has_ready:
                self._closing = True
                self._sleeping = 0
                self._has_ready.notify_all()
            connections.close_all()  # this thread's: the server sees the session end, not a dropped socket
            self.finished.set()
            runtime.wake_main()

    def _buffer_wait(self, wait_s: float) -> float:
        """How long the dispatcher may sleep while jobs wait in the buffer, whatever step comes before.

        A slot that goes to sleep kicks the dispatcher, but one that starts a long handler does
        not: with a slot asleep the dispatcher looks again within ``HEAD_STALL_S`` (to wake it for
        jobs stuck behind that handler), otherwise within ``BUFFER_MAX_WAIT_S`` (to hand back jobs
        that waited too long). Capped here, at the one place the dispatcher sleeps, so a claim or a
        flush that chose a longer wait cannot leave buffered jobs behind a long handler.
        """
        with self._lock:
            if not self._ready:
                return wait_s
            return min(wait_s, HEAD_STALL_S if self._sleeping else BUFFER_MAX_WAIT_S)

    def _enter(self, jobs: list[ClaimedJob], claimed_mono: float, claimed_ms: int) -> None:
        """Make claimed jobs attempts: into the book (so their leases are kept), then the buffer.

        Each context takes the claim's times: no clock is read per job on the dispatcher.
        """
        runtime = self.runtime
        attempts = []
        for job in jobs:
            ctx = JobContext(
                job,
                worker_id=runtime.worker_id,
                store=runtime.store,
                clock=runtime.clock,
                shutdown=runtime.shutdown,
                stop_cause=runtime.stop_cause,
                claimed_mono=claimed_mono,
                claimed_ms=claimed_ms,
                presence_held_since=runtime.presence_held_since,
            )
            attempts.append(Attempt(job, ctx, self))
        runtime.book.add(attempts)
        if any(job.lease_ms < 3 * self._heartbeat_ms for job in jobs):
            runtime.keeper_kick()  # renewals of so short a lease are due before the next heartbeat
        with self._has_ready:
            self.pause_guard.saw_active(claimed_mono)  # the claim that took them read the queue not paused
            self._ready.extend(attempts)
            self._wake_for_buffer(time.monotonic())

    def _sharing(self) -> bool:
        """Whether another connection wrote to the database lately (SQLite's ``data_version`` moved)."""
        try:
            if self._read_version is None:
                self._read_version = self.runtime.store.dialect.data_version_reader()  # type: ignore[attr-defined]
            version = self._read_version()
        except Exception:  # noqa: BLE001 - the connection was replaced; read through Django this once
            self._read_version = None
            version = self.runtime.store.retrying("data version", lambda d: d.data_version())  # type: ignore[attr-defined]
        now = time.monotonic()
        if self._seen_version is not None and version != self._seen_version:
            self._sharing_until = now + SHARING_S
        self._seen_version = version
        return now < self._sharing_until
