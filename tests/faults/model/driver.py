"""Runs a scenario against real ``durq_worker`` processes and records what only the test can see.

The driver starts the scenario's workers, queues its jobs and workflows at their times, carries out
each operator action and fault of the timeline, then waits until the queue is quiet. It records,
on the host's wall clock (epoch ms, shared by the workers and the database server on this host):

- every job it queued whose enqueue returned (acknowledged), by tag, with when;
- every action: when it was asked, when it returned, and what it returned (the jobs cancelled,
  asked to stop, retried, replaced);
- every process: which slot it ran in, when it was killed, and its *blackouts*, the spells in
  which it could not renew its leases (stopped by ``SIGSTOP``, its renewal blocked behind a row
  lock the test held, or on SQLite behind the database's write lock while one of the test's own
  writes lasted long), which are the only times a lease may truly expire under a live handler.
"""

from __future__ import annotations

import heapq
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.db import connection

from django_durq import Workflow, ops
from django_durq.models import Job
from django_durq.models import WorkerProcess as WorkerRow
from tests.conftest import WorkerProcess, wait_until
from tests.ledger.model_jobs import TYPES
from tests.ledger.models import Span

from .spec import BatchSpec, FlowSpec, JobSpec, Op, Scenario

TERMINAL = ("finished", "dead", "cancelled")
# The queue is quiet when no acknowledged job is active (but for those a long rate window
# rightly holds) and no handler runs; it is stuck when nothing changed for this long although
# every active job is due or waits for others, and no handler runs.
STALL_S = 15.0
# On SQLite the test's own writes (a big workflow's enqueue, an operator's action) hold the
# database's write lock, so every worker's renewals wait behind them: one that lasts this long is
# recorded as a blackout of every live worker, as a stall is (shorter ones cannot lapse a lease).
LONG_WRITE_MS = 500.0


def wall_ms() -> float:
    return time.time_ns() / 1_000_000


@dataclass
class Action:
    op: Op
    began_ms: float
    ended_ms: float
    jobs: list[int] = field(default_factory=list)  # the jobs it was asked about
    result: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Blackout:
    pid: int
    began_ms: float
    ended_ms: float
    cause: str


@dataclass
class Record:
    acked: dict[int, str] = field(default_factory=dict)  # job id -> tag
    ids: dict[str, int] = field(default_factory=dict)  # tag -> job id
    enqueued_ms: dict[int, float] = field(default_factory=dict)
    flows: dict[str, int] = field(default_factory=dict)  # workflow name -> id
    actions: list[Action] = field(default_factory=list)
    blackouts: list[Blackout] = field(default_factory=list)
    deaths: dict[int, float] = field(default_factory=dict)  # pid -> when it was killed
    slots: dict[int, int] = field(default_factory=dict)  # pid -> slot
    exits: dict[int, int] = field(default_factory=dict)  # pid -> exit code, of workers the test did not kill
    started_ms: float = 0.0
    quiet_ms: float = 0.0
    quiet: bool = False
    logs: list[str] = field(default_factory=list)


class Driver:
    def __init__(self, scenario: Scenario, spawn: Callable[..., WorkerProcess], vendor: str) -> None:
        self.scenario = scenario
        self.spawn = spawn
        self.vendor = vendor
        self.record = Record()
        self.workers: dict[int, WorkerProcess] = {}
        self.every: list[WorkerProcess] = []
        self.specs = scenario.jobs_by_tag()
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._sequence = 0
        self._stalls: list[threading.Thread] = []
        self._open: dict[tuple[int, str], float] = {}  # (pid, cause) -> when its blackout began
        self._timers: list[threading.Timer] = []
        self._lock = threading.Lock()  # the timers' SIGCONT and this thread's kill and stop
        self._start_mono = 0.0

    # --- the run ------------------------------------------------------------------------------

    def run(self, quiet_cap_s: float) -> Record:
        for slot in range(len(self.scenario.workers)):
            self._start(slot)
        wait_until(self._registered, 90, "every worker to register", interval=0.2)
        time.sleep(0.3)  # registration comes just before the pools start
        self.record.started_ms = wall_ms()
        self._start_mono = start = time.monotonic()
        for batch in self.scenario.batches:
            self._at(batch.at, partial(self._enqueue_batch, batch))
        for flow in self.scenario.flows:
            self._at(flow.at, partial(self._enqueue_flow, flow))
        for op in self.scenario.ops:
            self._at(op.at, partial(self._act, op))
        while self._events:
            due, _, event = heapq.heappop(self._events)
            time.sleep(max(0.0, start + due - time.monotonic()))
            began = wall_ms()
            event()
            self._note_long_write(began)
        for thread in [*self._stalls, *self._timers]:
            thread.join()
        self._wait_quiet(quiet_cap_s)
        for worker in self.every:
            code = worker.popen.poll()
            if code is not None and worker.pid not in self.record.deaths:
                self.record.exits[worker.pid] = code  # it ended by itself: its handlers ended by now
                self.record.deaths[worker.pid] = self.record.quiet_ms
        self.record.logs = [worker.output() for worker in self.every]
        return self.record

    def _note_long_write(self, began: float) -> None:
        ended = wall_ms()
        if self.vendor == "sqlite" and ended - began >= LONG_WRITE_MS:
            self.record.blackouts.extend(Blackout(pid, began, ended, "writer") for pid in self._live_pids())

    def _at(self, seconds: float, event: Callable[[], None]) -> None:
        self._sequence += 1
        heapq.heappush(self._events, (seconds, self._sequence, event))

    def _later(self, seconds: float, event: Callable[[], None]) -> None:
        self._at(time.monotonic() - self._start_mono + seconds, event)

    def _start(self, slot: int) -> None:
        worker = self.spawn(*self.scenario.workers[slot].args(), env=self.scenario.env)
        self.workers[slot] = worker
        self.every.append(worker)
        self.record.slots[worker.pid] = slot

    def _registered(self) -> bool:
        pids = {worker.pid for worker in self.workers.values()}
        for worker in self.workers.values():
            assert worker.popen.poll() is None, worker.output()
        return set(WorkerRow.objects.filter(pid__in=pids).values_list("pid", flat=True)) == pids

    # --- queuing --------------------------------------------------------------------------------

    def _definition(self, spec: JobSpec, **extra: Any) -> Any:
        options: dict[str, Any] = {"queue": spec.queue, "max_attempts": spec.max_attempts}
        if spec.timeout:
            options["timeout"] = spec.timeout
        if spec.unique:
            options["unique"] = spec.unique
        return TYPES[spec.type].using(**options, **extra)

    def _ack(self, tag: str, job_id: int) -> None:
        self.record.acked[job_id] = tag
        self.record.ids[tag] = job_id
        self.record.enqueued_ms[job_id] = wall_ms()

    def _enqueue_batch(self, batch: BatchSpec) -> None:
        groups: list[list[JobSpec]] = []
        for spec in batch.jobs:
            same = groups and not spec.unique and _options(groups[-1][0]) == _options(spec)
            if same:
                groups[-1].append(spec)
            else:
                groups.append([spec])
        for group in groups:
            queued = self._definition(group[0]).enqueue_many([spec.kwargs() for spec in group])
            for spec, job in zip(group, queued, strict=True):
                self._ack(spec.tag, job.pk)

    def _enqueue_flow(self, spec: FlowSpec) -> None:
        flow = Workflow(spec.name, on_failure=spec.on_failure)  # type: ignore[arg-type]
        steps: list[Any] = []
        for member in spec.members:
            after: list[Any] = [steps[index] for index in member.after]
            after += [self.record.ids[tag] for tag in member.external]
            kwargs = member.job.kwargs()
            steps.append(flow.add(self._definition(member.job), after=after, on_failure=member.on_failure, **kwargs))  # type: ignore[arg-type]
        row = flow.enqueue()
        self.record.flows[spec.name] = row.pk
        for member, step in zip(spec.members, steps, strict=True):
            assert step.job is not None
            self._ack(member.job.tag, step.job.pk)

    # --- actions and faults ---------------------------------------------------------------------

    def _act(self, op: Op) -> None:
        action = Action(op, wall_ms(), 0.0)
        getattr(self, f"_{op.kind}")(op, action)
        action.ended_ms = action.ended_ms or wall_ms()
        self.record.actions.append(action)

    def _job_id(self, tag: str) -> int | None:
        return self.record.ids.get(tag)

    def _cancel_workflow(self, op: Op, action: Action) -> None:
        result = ops.cancel_workflow(self.record.flows[op.target])
        action.result = {"cancelled": result.cancelled, "stopping": result.stopping}

    def _cancel_job(self, op: Op, action: Action) -> None:
        job_id = self._job_id(op.target)
        if job_id is not None:
            action.jobs = [job_id]
            result = ops.cancel([job_id])
            action.result = {"cancelled": result.cancelled, "stopping": result.stopping}

    def _retry_job(self, op: Op, action: Action) -> None:
        job_id = self._job_id(op.target)
        if job_id is not None:
            action.jobs = [job_id]
            action.result = {"retried": ops.retry([job_id]).retried}

    def _retry_cause(self, op: Op, action: Action) -> None:
        """Retry the job that the target's ``cancelled_by`` names, as an operator reading the admin would."""
        job_id = self._job_id(op.target)
        cause = Job.objects.filter(pk=job_id).values_list("cancelled_by", flat=True).first() if job_id else None
        if cause is not None:
            action.jobs = [cause]
            action.result = {"retried": ops.retry([cause]).retried}

    def _retry_workflow(self, op: Op, action: Action) -> None:
        action.result = {"retried": ops.retry_workflow(self.record.flows[op.target]).retried}

    def _pause(self, op: Op, action: Action) -> None:
        action.result = {"paused": ops.pause(op.target)}
        self._later(op.seconds, lambda: self._act(Op(op.at + op.seconds, "resume", op.target)))

    def _resume(self, op: Op, action: Action) -> None:
        action.result = {"resumed": ops.resume(op.target)}

    def _replace(self, op: Op, action: Action) -> None:
        spec = self.specs[op.target]
        kwargs = spec.kwargs()
        if op.mode == "replace":
            kwargs["hold"] = 0.05
            kwargs.pop("hold_first", None)
        job = self._definition(spec, on_duplicate=op.mode).enqueue(**kwargs)
        action.jobs = [job.pk]
        action.result = {"job": job.pk, "deduplicated": bool(getattr(job, "deduplicated", False))}
        if not action.result["deduplicated"]:
            self._ack(f"{op.target}~new", job.pk)

    def _kill(self, op: Op, action: Action) -> None:
        slot = int(op.target)
        worker = self.workers[slot]
        if worker.popen.poll() is not None:
            return
        with self._lock:
            self.record.deaths[worker.pid] = wall_ms()
            os.killpg(worker.pid, signal.SIGKILL)
            worker.popen.wait()
        self._end_blackout(worker.pid, "stop")
        self._later(op.seconds, partial(self._start, slot))

    def _stop(self, op: Op, action: Action) -> None:
        """SIGSTOP a worker; a timer thread sends SIGCONT, as the stopped worker may hold a lock
        (SQLite's write lock, a row lock) that this thread's next action waits for."""
        worker = self.workers[int(op.target)]
        with self._lock:
            if worker.popen.poll() is not None or (worker.pid, "stop") in self._open:
                return
            self._open[(worker.pid, "stop")] = wall_ms()
            os.killpg(worker.pid, signal.SIGSTOP)
        timer = threading.Timer(op.seconds, self._cont, args=(worker,))
        timer.start()
        self._timers.append(timer)

    def _cont(self, worker: WorkerProcess) -> None:
        with self._lock:
            if worker.popen.poll() is None:
                os.killpg(worker.pid, signal.SIGCONT)
        self._end_blackout(worker.pid, "stop")

    def _end_blackout(self, pid: int, cause: str) -> None:
        with self._lock:
            began = self._open.pop((pid, cause), None)
            if began is not None:
                self.record.blackouts.append(Blackout(pid, began, wall_ms(), cause))

    def _stall(self, op: Op, action: Action) -> None:
        """Hold a lock a worker's renewal needs for ``op.seconds``: the row of a running job (the
        whole database on SQLite, where a lock is the database's).

        ``op.target`` is "any" (the running job with the longest work), or the prefix of the
        tags of the jobs to wait for (up to 5 s) until they all run, the first of which is locked:
        the others, held by the same worker, lapse while its renewals wait.
        """
        deadline = time.monotonic() + 5
        wanted = [job_id for tag, job_id in self.record.ids.items() if tag.startswith(op.target)] if op.target != "any" else []
        while True:
            running = self._running_jobs(wanted)
            if (running and len(running) >= len(wanted)) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if not running:
            action.result = {"locked": None}
            return
        job_id, claimed_by = min(running) if wanted else max(running, key=lambda row: self._hold(row[0]))
        action.jobs = [job_id]
        # On SQLite every process waits, those started meanwhile too (_hold_lock adds them).
        pids = self._live_pids()
        if self.vendor != "sqlite":
            pids = [int(claimed_by.split(":")[1])] if claimed_by.count(":") >= 2 else []
        locked = threading.Event()
        thread = threading.Thread(target=self._hold_lock, args=(job_id, op.seconds, pids, locked), daemon=True)
        thread.start()
        locked.wait(10)
        self._stalls.append(thread)
        action.result = {"locked": job_id, "pids": pids}

    def _running_jobs(self, among: list[int]) -> list[tuple[int, str]]:
        running = Job.objects.filter(pk__in=among or list(self.record.acked), status="running")
        return list(running.values_list("pk", "claimed_by"))

    def _hold(self, job_id: int) -> float:
        spec = self.specs.get(self.record.acked.get(job_id, ""))
        return 0.0 if spec is None else max(spec.hold, spec.hold_first)

    def _hold_lock(self, job_id: int, seconds: float, pids: list[int], locked: threading.Event) -> None:
        if self.vendor == "sqlite":
            holder: Any = sqlite3.connect(str(connection.settings_dict["NAME"]), timeout=20, isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
        else:
            holder = connection.get_new_connection(connection.get_connection_params())
            if self.vendor == "mysql":
                holder.autocommit(False)
            cursor = holder.cursor()
            cursor.execute("SELECT id FROM durq_job WHERE id = %s FOR UPDATE", [job_id])
            cursor.fetchall()
        began = wall_ms()
        locked.set()
        time.sleep(seconds)
        holder.rollback() if self.vendor != "sqlite" else holder.execute("ROLLBACK")
        holder.close()
        ended = wall_ms()
        if self.vendor == "sqlite":
            pids = sorted({*pids, *self._live_pids()})
        self.record.blackouts.extend(Blackout(pid, began, ended, "stall") for pid in pids)

    def _live_pids(self) -> list[int]:
        return [worker.pid for worker in list(self.workers.values()) if worker.popen.poll() is None]

    # --- the end --------------------------------------------------------------------------------

    def _wait_quiet(self, cap_s: float) -> None:
        """Until nothing is active (or rightly held) and no handler runs; give up when stuck or at ``cap_s``."""
        deadline = time.monotonic() + cap_s
        changed = time.monotonic()
        last: object = None
        ids = list(self.record.acked)
        while time.monotonic() < deadline:
            now = wall_ms()
            active = list(
                Job.objects.filter(pk__in=ids)
                .exclude(status__in=TERMINAL)
                .values_list("pk", "status", "attempts", "run_at_ms", "limit_key", "limit_rate", "limit_period_ms")
            )
            held = held_by_long_windows(active, now)
            live = {worker.pid for worker in self.workers.values() if worker.popen.poll() is None}
            open_spans = Span.objects.filter(end_us__isnull=True, pid__in=live).count()
            if not open_spans and all(row[0] in held for row in active):
                self.record.quiet = True
                break
            snapshot = (active, Span.objects.count())
            if snapshot != last:
                last, changed = snapshot, time.monotonic()
            soon = any(row[1] == "waiting" and now < row[3] < now + 120_000 for row in active)
            if not open_spans and not soon and time.monotonic() - changed > STALL_S:
                break
            time.sleep(0.5)
        self.record.quiet_ms = wall_ms()


def held_by_long_windows(active: list[tuple[Any, ...]], now_ms: float) -> set[int]:
    """Waiting jobs that a rate longer than a minute rightly holds: their key started its count within the period."""
    held = set()
    for job_id, status, _, _, key, rate, period_ms in active:
        if status != "waiting" or not key or not rate or not period_ms or period_ms < 60_000:
            continue
        started = Span.objects.filter(key=key, claim_ms__gt=now_ms - period_ms, limit_period_ms=period_ms).count()
        if started >= rate:
            held.add(job_id)
    return held


def _options(spec: JobSpec) -> tuple[Any, ...]:
    return (spec.type, spec.queue, spec.max_attempts, spec.timeout, spec.unique)
