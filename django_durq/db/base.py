"""The narrow interface between the queue and a database, with the SQL every database shares.

A dialect owns the statements that differ (the claim, the per-minute upsert, cross-process
wake-up) and says in plain words which exclusivity its claim really gives. Every write after a
claim is fenced by ``claim_token`` and ``status = 'running'``: a worker whose lease was taken
over matches no row and so changes nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from . import places
from .ends import EndStatements
from .flow import Outlook, claim_limited
from .gates import KEYS_GATE

# The dialects (postgresql.py, mysql.py, sqlite.py) import the row's names from here.
from .rows import CLAIM_COLUMNS as CLAIM_COLUMNS
from .rows import JOB as JOB
from .rows import NOT_PAUSED as NOT_PAUSED
from .rows import ClaimCount as ClaimCount
from .rows import ClaimedJob as ClaimedJob
from .rows import Lease as Lease
from .rows import Renewal as Renewal

if TYPE_CHECKING:
    from ..clock import Clock
    from ..handlers.limits import QueueLimits


def own_connection(wrapper: BaseDatabaseWrapper) -> Any:
    """A driver connection outside Django's handling and its pool, for a session held for good (LISTEN)."""
    return wrapper.Database.connect(**wrapper.get_connection_params())  # type: ignore[attr-defined]


class Dialect(EndStatements):
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
    # A claim of its own adds its counts in its own statement (``claim_counted``), not in a second one.
    claims_counted = False

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
    # An ``INSERT … SELECT`` that leaves out the rows whose unique key is already there:
    # "{insert_ignoring} INTO table (…) SELECT … WHERE …{conflicts_ignored}".
    insert_ignoring = "INSERT"
    conflicts_ignored = " ON CONFLICT DO NOTHING"

    # --- what differs per database -------------------------------------------------------

    def claim(self, queue: str, limit: int, now_ms: int, worker_id: str) -> list[ClaimedJob]:
        raise NotImplementedError

    def claim_counted(self, queue: str, limit: int, now_ms: int, worker_id: str, count: ClaimCount) -> list[ClaimedJob]:
        """``claim`` as a transaction of its own that also adds ``count`` for what it claimed.

        Where ``claims_counted``: the dialect claims and counts in one statement, one round trip.
        """
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

    def lock_gates(self, queue: str, now_ms: int, keys: bool) -> bool:
        """Take the queue's turn, then (``keys``) the limit keys' turn, unless the queue is paused. True when paused."""
        if self.lock_gate(queue, now_ms):
            return True
        if keys:
            self.lock_gate(KEYS_GATE, now_ms)
        return False

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
        count: Callable[[Dialect, set[Lease], list[ClaimedJob]], None] | None = None,
        placed: Sequence[Lease] = (),
    ) -> tuple[set[Lease], list[ClaimedJob]]:
        """Record finished jobs and claim the next ones in one transaction: one commit, not two.

        ``leases`` are deleted; ``kept`` rows of (lease, finished at, result text) stay as
        finished jobs (retention on). Places under limits (db/places.py) are freed first, so the
        claim may give them on: those of ``free_places``, attempts whose handlers have ended, and
        those of ``placed``, the attempts completed here that counted against a running limit,
        whose row was their place unless this batch found it taken over or buried (then a place
        row may hold their handler). ``count`` is told, in the same transaction, what was
        completed and claimed (db/counters.py).
        """
        own = not self.connection.in_atomic_block
        with transaction.atomic(using=self.connection.alias):
            done = self.complete(leases) | self.finish_many(kept)
            places.free(self, [*free_places, *(lease for lease in placed if lease not in done)])
            if own and limits is not None and limit > 0:
                self.bound_turns()  # the claim below may give up on its turns; these completions stand
            claimed = self.claim_next(queue, limit, now_ms, worker_id, limits, clock, outlook) if limit > 0 else []
            if count is not None:
                count(self, done, claimed)
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
        return claim_limited(self, queue, limit, now_ms, worker_id, limits, clock, outlook)
