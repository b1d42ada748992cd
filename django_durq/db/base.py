"""The narrow interface between the queue and a database, with the SQL every database shares.

A dialect owns the statements that differ (the claim, the per-minute upsert, cross-process
wake-up) and says in plain words which exclusivity its claim really gives. Every write after a
claim is fenced by ``claim_token`` and ``status = 'running'``: a worker whose lease was taken
over matches no row and so changes nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from . import places

if TYPE_CHECKING:
    from ..clock import Clock
    from ..handlers.limits import QueueLimits
    from .flow import Outlook

JOB = "durq_job"

# True while an operator has paused the job's queue (see ops/pausing.py); its one %s is the queue.
# It reads the control row by primary key and does not depend on the job row, so a database
# evaluates it once per statement: a queue with no control row costs one index probe.
NOT_PAUSED = "NOT EXISTS (SELECT 1 FROM durq_queue_control AS control WHERE control.queue = %s AND control.paused)"

# Columns a claim hands to the worker; the payload of a job that is not being run is never read.
CLAIM_COLUMNS = (
    "id",
    "name",
    "queue",
    "arguments",
    "attempts",
    "max_attempts",
    "claim_token",
    "lease_ms",
    "timeout_ms",
    "errors",
    "reclaimed_from",
    "priority",
    "run_at_ms",
    "created_ms",
    "stop_requested",
    "handbacks",
    "dependents",
    "workflow_id",
    "expires_ms",
)


@dataclass
class ClaimedJob:
    id: int
    name: str
    queue: str
    arguments: str
    attempts: int
    max_attempts: int
    claim_token: int
    lease_ms: int
    timeout_ms: int | None
    errors: str
    reclaimed_from: str | None
    priority: int
    run_at_ms: int
    created_ms: int
    stop_requested: bool = False  # an operator asked it to stop: it is cancelled, never started
    handbacks: int = 0  # started attempts handed back uncounted so far
    dependents: int | None = None  # jobs waiting for this one (workflows.py); its end must be counted
    workflow_id: int | None = None
    expires_ms: int | None = None  # not started by then: ended without running (executor, db/expiry.py)
    # Not a column: set after the claim. A limited claim took a place for it (db/places.py): its worker frees it.
    placed: bool = False

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ClaimedJob:
        """By position: the fields follow ``CLAIM_COLUMNS`` in order (tests/db/test_claimed_job.py)."""
        return cls(*row)


Lease = tuple[int, int]  # (job id, claim token)


@dataclass
class Renewal:
    """What one renewal of a batch of leases found.

    ``renewed``: the leases it extended, each with whether an operator asked its job to stop.
    ``busy``: leases still held whose row another transaction had locked, left as they were for
    the next renewal rather than waited for. A lease in neither is lost (taken over or deleted).
    """

    renewed: dict[Lease, bool]
    busy: set[Lease] = field(default_factory=set)


def own_connection(wrapper: BaseDatabaseWrapper) -> Any:
    """A driver connection outside Django's handling and its pool, for a session held for good (LISTEN)."""
    return wrapper.Database.connect(**wrapper.get_connection_params())  # type: ignore[attr-defined]


def _fence(leases: Sequence[Lease]) -> tuple[str, list[int]]:
    """``(id = %s AND claim_token = %s) OR …`` for a batch of leases, with its parameters."""
    clause = " OR ".join(["(id = %s AND claim_token = %s)"] * len(leases))
    params: list[int] = []
    for job_id, token in leases:
        params.extend((job_id, token))
    return f"({clause})", params


class Dialect:
    vendor = ""
    exclusivity = ""
    supports_notify = False
    # One write lock for the whole database: a worker keeps its write transactions short and
    # leaves the lock free between them, so the application's own writes get in.
    serialized_writes = False
    # Migration 0002 made the queue's indexes partial (waiting rows, running rows) here.
    partial_indexes = False
    # The scalar "larger of two values" function: a renewal never moves a lease backwards.
    greatest = "GREATEST"
    # Bulk enqueue: a FROM clause that unpacks ``pack_arguments()`` (its one %s) into rows, and
    # the names of its arguments-text and ordinal columns. Used where ``returns_bulk_insert_ids``.
    arguments_source = ""
    argument_column = ""
    ordinal_column = ""
    # Put before a turn's lock (db/gates.py) where the wait for it is bounded per statement.
    turn_wait = ""

    # How a settler (db/dependencies.py) locks the dependents whose edges it counts, and the edges
    # it reads once it holds them (no lock needed: only a holder of the dependent's lock changes
    # them); empty where writers are serialized.
    edge_lock = ""
    row_lock = "FOR UPDATE"
    # Names the claim index for a limited claim's read of due jobs, where the planner may otherwise
    # take the due index and sort every due job (see the dialects' own claims).
    claim_index_hint = ""
    # Makes a queue's control row if it has none, leaving an existing one alone.
    insert_control = (
        "INSERT INTO durq_queue_control (queue, paused, limited, updated_ms) VALUES (%s, FALSE, TRUE, %s)"
        " ON CONFLICT (queue) DO NOTHING"
    )

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection

    # --- what differs per database -------------------------------------------------------

    def claim(self, queue: str, limit: int, now_ms: int, worker_id: str) -> list[ClaimedJob]:
        raise NotImplementedError

    def claim_ids(self, picks: Sequence[tuple[int, str | None]], now_ms: int, worker_id: str) -> list[ClaimedJob]:
        """Claim those of these (job id, limit key) that are still claimable: due and waiting, or running
        under an expired lease, and still under the limit key they were counted with.

        A limited claim (db/flow.py) reads its candidates without locking them and claims what it
        admitted with this: its turns keep other limited claims away, and the condition, checked
        under the row lock, leaves out a job that changed meanwhile (a debounce that replaced its
        arguments, and so its key). A row another transaction has locked is skipped, not waited
        for, as the fast claim does.
        """
        raise NotImplementedError

    def lock_gate(self, queue: str, now_ms: int) -> bool:
        """Take the queue's turn for a limited claim: lock its control row, made if missing. True when paused."""
        lock = f"{self.turn_wait}SELECT paused FROM durq_queue_control WHERE queue = %s FOR UPDATE"
        rows = self.fetchall(lock, (queue,))
        if not rows:
            self.execute(self.insert_control, (queue, now_ms))
            rows = self.fetchall(lock, (queue,))
        return bool(rows[0][0])

    def bound_turns(self) -> None:
        """In a claim's own transaction: bound the wait for a turn and the session's silence while it holds one.

        See ``gates.TURN_WAIT_S`` and ``gates.TURN_HOLD_S``; nothing by default.
        """

    def add_stats(self, rows: Sequence[tuple[str, int, int, int, int, int]]) -> None:
        """Add (queue, minute_ms, finished, failed, dead, unknown type) to the per-minute counters."""
        raise NotImplementedError

    def notify(self, queues: Sequence[str]) -> None:
        """Wake idle workers of other processes once the current transaction commits."""

    def prepare_dispatcher_connection(self) -> None:
        """Tune the connection a pool's dispatcher claims and completes on; nothing by default."""

    def checkpoint(self) -> None:
        """Move what the worker wrote from a write-ahead log into the database; nothing by default."""

    def is_lock_error(self, error: BaseException) -> bool:
        """A transient contention error worth retrying after a short wait."""
        return False

    def dedupe_turn(self, key: str) -> AbstractContextManager[None]:
        """Where enqueuers of one dedupe key must take turns at the insert, hold the turn (MariaDB)."""
        return contextlib.nullcontext()

    def held_many(self, leases: Sequence[Lease]) -> tuple[str, list[Any]]:
        """A condition matching the running rows still held under these (id, claim token) pairs.

        Dialects that can pass the pairs as one array parameter override this, so the SQL text
        stays the same for every batch size and the driver's statement cache can keep it.
        """
        fence, params = _fence(leases)
        return f"status = 'running' AND {fence}", params

    def attempt_pairs(self, leases: Sequence[Lease]) -> tuple[str, list[Any]]:
        """A condition matching the rows of a table keyed by attempt (``job_id``, ``claim_token``): the
        places under limits (db/places.py). Dialects that can pass the pairs as arrays override it.
        """
        pairs = ", ".join(["(%s, %s)"] * len(leases))
        return f"(job_id, claim_token) IN ({pairs})", [value for lease in leases for value in lease]

    # --- shared, portable SQL --------------------------------------------------------------

    def insert_job(self, values: dict[str, Any], notify: bool) -> int:
        """Insert one job row (every NOT NULL column given) and return its id, in one statement.

        Cheaper than ``Model.save()``, which compiles the INSERT anew for every job. ``notify``
        asks the dialect to wake other processes' workers once this commits, where it can.
        """
        columns = ", ".join(values)
        marks = ", ".join(["%s"] * len(values))
        with self.connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {JOB} ({columns}) VALUES ({marks})", list(values.values()))
            return int(cursor.lastrowid)

    @property
    def returns_bulk_insert_ids(self) -> bool:
        """An INSERT can hand back the ids of the rows it made, in order (``insert_jobs`` works)."""
        return bool(self.connection.features.can_return_rows_from_bulk_insert)

    def insert_jobs(self, values: dict[str, Any], arguments: Sequence[str]) -> list[int]:
        """Insert one job per arguments text, every other column from ``values``; ids in that order.

        One ``INSERT … SELECT`` per chunk, over the texts unpacked from a single parameter (see
        ``arguments_source``): the statement text is the same for any count, and the driver
        quotes one parameter instead of a row of them per job. Rows go in ordinal order and the
        id sequence numbers them in that order, so sorted ids match it.
        """
        columns = ", ".join(values)
        marks = ", ".join(["%s"] * len(values))
        sql = (
            f"INSERT INTO {JOB} ({columns}, arguments) SELECT {marks}, {self.argument_column}"
            f" FROM {self.arguments_source} ORDER BY {self.ordinal_column} RETURNING id"
        )
        common = list(values.values())
        ids: list[int] = []
        for chunk in self.argument_chunks(arguments):
            ids.extend(sorted(row[0] for row in self.fetchall(sql, [*common, self.pack_arguments(chunk)])))
        return ids

    def pack_arguments(self, arguments: Sequence[str]) -> Any:
        """The one parameter ``arguments_source`` unpacks: a JSON array of the texts."""
        return json.dumps(list(arguments))

    def argument_chunks(self, arguments: Sequence[str]) -> Iterable[Sequence[str]]:
        """The arguments of one bulk enqueue, split into statements: one statement by default."""
        return [arguments]

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall())

    def due_times(self, queue: str) -> tuple[int | None, int | None, int | None]:
        """When ``queue``'s first waiting job is due, its first lease expires, and the first lease
        of a last attempt expires; a read that takes no write lock.

        The first two are None while the queue is paused: its idle workers then sleep until a
        wake-up (the resume sends one) or their poll interval, instead of claiming nothing again
        and again. The third is not: a last attempt whose worker died is buried, paused or not.
        """
        rows = self.fetchall(
            f"SELECT (SELECT MIN(run_at_ms) FROM {JOB} WHERE queue = %s AND status = 'waiting' AND {NOT_PAUSED}),"
            f" (SELECT MIN(lease_expires_ms) FROM {JOB} WHERE queue = %s AND status = 'running' AND {NOT_PAUSED}),"
            f" (SELECT MIN(lease_expires_ms) FROM {JOB} WHERE queue = %s AND status = 'running' AND attempts >= max_attempts)",
            (queue, queue, queue, queue, queue),
        )
        return rows[0][0], rows[0][1], rows[0][2]

    def renew(self, leases: Sequence[Lease], now_ms: int, bound_ms: int | None = None) -> Renewal:
        """Extend leases to at least ``now_ms`` + their length, each matched by its own (id, token).

        A lease only ever moves forward: a renewal that arrives late (its ``now`` read before a
        stall) cannot shorten a lease that a later renewal or claim set. ``bound_ms`` bounds how
        long the renewal may wait for a lock (None: as long as the connection waits); a renewal
        that reaches it fails like one the database refused.
        """
        if not leases:
            return Renewal({})
        held, params = self.held_many(leases)
        self.execute(
            f"UPDATE {JOB} SET lease_expires_ms = {self.greatest}(lease_expires_ms, %s + lease_ms) WHERE {held}",
            [now_ms, *params],
        )
        rows = self.fetchall(f"SELECT id, claim_token, stop_requested FROM {JOB} WHERE {held}", params)
        return Renewal({(row[0], row[1]): bool(row[2]) for row in rows})

    def complete(self, leases: Sequence[Lease]) -> set[Lease]:
        """Delete finished jobs (the default: nothing kept); returns the leases that were still held."""
        if not leases:
            return set()
        held, params = self.held_many(leases)
        # A job an operator asked to stop is left running for the caller to end cancelled (cancel_running).
        sql = f"DELETE FROM {JOB} WHERE {held} AND NOT stop_requested RETURNING id, claim_token"
        return {(row[0], row[1]) for row in self.fetchall(sql, params)}

    def finished_leases(self, leases: Sequence[Lease]) -> set[Lease]:
        """Which of these leases ended as finished jobs (kept) under their own token."""
        if not leases:
            return set()
        fence, params = _fence(leases)
        rows = self.fetchall(f"SELECT id, claim_token FROM {JOB} WHERE status = 'finished' AND {fence}", params)
        return {(row[0], row[1]) for row in rows}

    def existing_ids(self, ids: Sequence[int]) -> set[int]:
        marks = ", ".join(["%s"] * len(ids))
        return {row[0] for row in self.fetchall(f"SELECT id FROM {JOB} WHERE id IN ({marks})", list(ids))}

    def complete_and_claim(
        self,
        leases: Sequence[Lease],
        queue: str,
        limit: int,
        now_ms: int,
        worker_id: str,
        kept: Sequence[tuple[Lease, int, str | None]] = (),
        limits: QueueLimits | None = None,
        clock: Clock | None = None,
        free_places: Sequence[Lease] = (),
        outlook: Outlook | None = None,
    ) -> tuple[set[Lease], list[ClaimedJob]]:
        """Record finished jobs and claim the next ones in one transaction: one commit, not two.

        ``leases`` are deleted; ``kept`` rows of (lease, finished at, result text) stay as
        finished jobs (retention on). ``free_places``: attempts whose handlers have ended, whose
        places under limits (db/places.py) are freed first, so the claim may give them on.
        """
        own = not self.connection.in_atomic_block
        with transaction.atomic(using=self.connection.alias):
            done = self.complete(leases) | self.finish_many(kept)
            places.free(self, free_places)
            if own and limits is not None and limit > 0:
                self.bound_turns()  # the claim below may give up on its turns; these completions stand
            claimed = self.claim_next(queue, limit, now_ms, worker_id, limits, clock, outlook) if limit > 0 else []
        return done, claimed

    def claim_next(
        self,
        queue: str,
        limit: int,
        now_ms: int,
        worker_id: str,
        limits: QueueLimits | None = None,
        clock: Clock | None = None,
        outlook: Outlook | None = None,
    ) -> list[ClaimedJob]:
        """The fast claim, which leaves limited jobs alone, or with ``limits`` the claim that enforces them.

        A limited claim reads ``clock`` again once it has its turn, and tells ``outlook`` when a
        rate window next opens (see ``flow.claim_limited``).
        """
        if limits is None:
            return self.claim(queue, limit, now_ms, worker_id)
        from .flow import claim_limited  # cycle: flow.py builds on base.py; goes with base.py's split

        return claim_limited(self, queue, limit, now_ms, worker_id, limits, clock, outlook)

    def finish_many(self, kept: Sequence[tuple[Lease, int, str | None]]) -> set[Lease]:
        """Keep a batch of finished jobs (lease, finished at, result text) in one statement.

        Returns the leases that were still held. Finished history is on by default, so this is
        the common completion: one UPDATE per batch, as the delete is one DELETE per batch.
        """
        if not kept:
            return set()
        leases = [lease for lease, _, _ in kept]
        held, held_params = self.held_many(leases)
        finished_at = " ".join(["WHEN %s THEN %s"] * len(kept))
        params: list[Any] = [value for (job_id, _), finished_ms, _ in kept for value in (job_id, finished_ms)]
        results = [(job_id, result) for (job_id, _), _, result in kept if result is not None]
        result_sql = "NULL"
        if results:
            result_sql = f"CASE id {' '.join(['WHEN %s THEN %s'] * len(results))} ELSE NULL END"
            params.extend(value for pair in results for value in pair)
        # A job an operator asked to stop, even one whose handler returned before a heartbeat told
        # it, is left running for the caller to end cancelled (cancel_running), and to say so.
        updated = self.execute(
            f"UPDATE {JOB} SET status = 'finished', lease_expires_ms = NULL, finished_ms = CASE id {finished_at} END,"
            f" result = {result_sql} WHERE {held} AND NOT stop_requested",
            params + held_params,
        )
        if updated == len(kept):
            return set(leases)
        return self.finished_leases(leases)  # only this attempt's own token can have finished its row

    def retry_later(self, lease: Lease, run_at_ms: int, now_ms: int, errors: str) -> bool:
        """Put a failed job back to wait for its next attempt; False if no longer held or asked to stop.

        The stop request is read by this statement itself, so a cancel that arrives while the
        attempt fails is never lost to the retry: the caller ends that job cancelled (cancel_running).
        """
        fence, params = _fence([lease])
        return (
            self.execute(
                f"UPDATE {JOB} SET status = 'waiting', finished_ms = NULL, run_at_ms = %s, lease_expires_ms = NULL,"
                f" errors = %s WHERE status = 'running' AND NOT stop_requested AND {fence}",
                [run_at_ms, errors, *params],
            )
            == 1
        )

    def bury(self, lease: Lease, now_ms: int, errors: str) -> bool:
        """Make the job a dead letter, keeping its whole error history; False if no longer held or asked to stop."""
        fence, params = _fence([lease])
        return (
            self.execute(
                f"UPDATE {JOB} SET status = 'dead', finished_ms = %s, lease_expires_ms = NULL, errors = %s"
                f" WHERE status = 'running' AND NOT stop_requested AND {fence}",
                [now_ms, errors, *params],
            )
            == 1
        )

    def cancel_running(self, lease: Lease, now_ms: int, errors: str) -> bool:
        fence, params = _fence([lease])
        return (
            self.execute(
                f"UPDATE {JOB} SET status = 'cancelled', finished_ms = %s, lease_expires_ms = NULL, errors = %s"
                f" WHERE status = 'running' AND {fence}",
                [now_ms, errors, *params],
            )
            == 1
        )

    def release(self, leases: Sequence[Lease], *, started: bool, now_ms: int = 0) -> int:
        """Hand jobs back for another worker; the interrupted attempt is not counted.

        A job an operator asked to stop ends cancelled instead. ``started`` counts the hand-back
        (see ``Job.handbacks``); a job that waited in a buffer and never started is not counted.
        The due time stays as it was: the job was already due, so it is claimable at once and
        keeps its place in the order, and a scheduled job keeps the due time it was created for.
        """
        if not leases:
            return 0
        held, params = self.held_many(leases)
        return self.execute(
            f"UPDATE {JOB} SET status = CASE WHEN stop_requested THEN 'cancelled' ELSE 'waiting' END,"
            " finished_ms = CASE WHEN stop_requested THEN %s ELSE NULL END,"
            f" lease_expires_ms = NULL, attempts = attempts - 1, handbacks = handbacks + %s WHERE {held}",
            [now_ms, 1 if started else 0, *params],
        )

    def record_errors(self, lease: Lease, errors: str) -> bool:
        fence, params = _fence([lease])
        return self.execute(f"UPDATE {JOB} SET errors = %s WHERE status = 'running' AND {fence}", [errors, *params]) == 1

    def report_progress(self, lease: Lease, done: int, total: int | None) -> bool:
        fence, params = _fence([lease])
        return (
            self.execute(
                f"UPDATE {JOB} SET progress_done = %s, progress_total = %s WHERE status = 'running' AND {fence}",
                [done, total, *params],
            )
            == 1
        )

    def expired_final_attempts(self, queue: str, now_ms: int) -> list[tuple[int, int, str, int, str, str]]:
        """Running jobs whose lease expired on their last allowed attempt.

        Rows of (id, claim token, name, attempts, errors, lease holder).
        """
        return [
            (row[0], row[1], row[2], row[3], row[4], row[5])
            for row in self.fetchall(
                f"SELECT id, claim_token, name, attempts, errors, claimed_by FROM {JOB} WHERE queue = %s"
                " AND status = 'running' AND lease_expires_ms <= %s AND attempts >= max_attempts",
                (queue, now_ms),
            )
        ]

    def bury_expired(self, lease: Lease, now_ms: int, errors: str) -> str | None:
        """End a job whose worker was lost — only if its lease is still expired; returns how it ended, or None.

        A dead letter, or cancelled when an operator asked it to stop (a cancel is final). Each
        statement re-checks the expiry itself: a lease renewed since the scan is left alone.
        """
        fence, params = _fence([lease])
        for status, asked in (("cancelled", "stop_requested"), ("dead", "NOT stop_requested")):
            if self.execute(
                f"UPDATE {JOB} SET status = '{status}', finished_ms = %s, lease_expires_ms = NULL, errors = %s"
                f" WHERE status = 'running' AND {asked} AND lease_expires_ms <= %s AND {fence}",
                [now_ms, errors, now_ms, *params],
            ):
                return status
        return None
