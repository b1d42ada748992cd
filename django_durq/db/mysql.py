"""MariaDB: ``SELECT … FOR UPDATE SKIP LOCKED`` then ``UPDATE``, in one short transaction, claimers in turn.

MariaDB has no ``UPDATE … RETURNING``, so the claim reads the rows it locks and computes the
new token and attempt count itself; the row locks make that exact. Needs MariaDB ≥ 10.6 for
SKIP LOCKED; MySQL, which has no ``DELETE … RETURNING``, is refused (system checks durq.E009,
durq.E017). Any number of hosts.
"""

from __future__ import annotations

import contextlib
import json
import math
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from django.db import transaction

from ..conf import hooks
from . import gates
from .base import CLAIM_COLUMNS, JOB, NOT_PAUSED, ClaimedJob, Dialect, Lease, Renewal
from .mysql_claims import CLAIM_TURN_WAIT_S, EXPIRED_LOOK_MS, claims
from .rows import integer_list

_COLUMNS = ", ".join(CLAIM_COLUMNS) + ", status, claimed_by"

# Both picks walk the claim index (queue, status, priority DESC, run_at_ms, id), named because
# the optimizer may otherwise take the due index for the range on run_at_ms and sort: a locking
# read locks every row it reads, so that plan would lock every due job of the queue and leave
# concurrent claimers (SKIP LOCKED) with nothing. In the claim index's order, the due pick stops
# after ``limit`` rows.
_PICK_EXPIRED = f"""
SELECT {_COLUMNS} FROM {JOB} FORCE INDEX (durq_job_claim)
WHERE queue = %s AND status = 'running' AND lease_expires_ms <= %s AND attempts < max_attempts AND limit_key IS NULL
    AND {NOT_PAUSED}
ORDER BY lease_expires_ms LIMIT %s
FOR UPDATE SKIP LOCKED
"""

_PICK_DUE = f"""
SELECT {_COLUMNS} FROM {JOB} FORCE INDEX (durq_job_claim)
WHERE queue = %s AND status = 'waiting' AND run_at_ms <= %s AND limit_key IS NULL AND {NOT_PAUSED}
ORDER BY priority DESC, run_at_ms, id LIMIT %s
FOR UPDATE SKIP LOCKED
"""

# Whether the expired pick would find anything, read without locking: the same rows, no locks.
_ANY_EXPIRED = f"""
SELECT 1 FROM {JOB} FORCE INDEX (durq_job_claim)
WHERE queue = %s AND status = 'running' AND lease_expires_ms <= %s AND attempts < max_attempts AND limit_key IS NULL
LIMIT 1
"""

# The named locks of a busy worker's look for expired leases (per queue and span of the clock) and
# of the claimers' turn (per queue); ``mysql_claims.py`` says when each is asked for.
_LOOK = "CONCAT('durq-look:', SHA1(CONCAT(DATABASE(), ':', %s, ':', %s)))"
_CLAIM_TURN = "CONCAT('durq-claim:', SHA1(CONCAT(DATABASE(), ':', %s)))"


# A bulk enqueue sends its arguments texts as one JSON array per statement, at most this many
# rows and characters. A character takes at most 4 bytes once encoded and escaped, so a
# statement stays under the default max_allowed_packet of 16 MB.
_INSERT_ROWS = 1_000
_INSERT_CHARS = 2_000_000

# What the wake-up watcher polls on MariaDB, which has no LISTEN/NOTIFY: the ids above a floor,
# read in autocommit so that each read sees the latest commits. A primary-key range: the newest
# few rows, and the ids of transactions that committed after later ones (see watcher.py).
NEWEST_JOB = f"SELECT MAX(id) FROM {JOB}"


def watcher_look(gaps: int, queues: int) -> str:
    """The watcher's whole look in one statement: rows of (job id, None) and (None, queue with a job due).

    Parameters: the highest id seen, the ``gaps`` ids waited on, then (queue, time, queue) per queue.
    One round trip a look instead of three: the look runs several times a second on every idle worker.
    """
    parts = [f"(SELECT id, NULL FROM {JOB} WHERE id > %s ORDER BY id LIMIT 1000)"]
    if gaps:
        parts.append(f"(SELECT id, NULL FROM {JOB} WHERE id IN ({', '.join(['%s'] * gaps)}))")
    if queues:
        due = f"queue = %s AND status = 'waiting' AND run_at_ms <= %s AND {NOT_PAUSED}"
        parts += [f"(SELECT NULL, queue FROM {JOB} WHERE {due} LIMIT 1)"] * queues
    return " UNION ALL ".join(parts)


# A batch of finished jobs kept (``finish_many``): one JSON text of [id, token, finished at,
# result] per job, unpacked by JSON_TABLE and joined to the rows by their attempt. The shared
# statement's two lists of the batch's length (``CASE id WHEN …`` and the (id, token) pairs) cost
# the driver an escaped literal per value, and the server a parse of both, on every batch. Each
# assignment reads only the batch's values: a multi-table UPDATE assigns in no set order. The
# rows are found from the batch by primary key (named: with few running rows the planner read
# them through the status index first, locking each, and waited for other workers' transactions),
# and a running row is one whose lease is set, as in ``held_many``.
_FINISH = (
    f"UPDATE {JOB} AS j FORCE INDEX (PRIMARY) JOIN JSON_TABLE(%s, '$[*]' COLUMNS (id BIGINT PATH '$[0]',"
    " token BIGINT PATH '$[1]', finished_ms BIGINT PATH '$[2]', result LONGTEXT CHARACTER SET utf8mb4 PATH '$[3]')) AS kept"
    " ON j.id = kept.id AND j.claim_token = kept.token"
    " SET j.status = 'finished', j.lease_expires_ms = NULL, j.finished_ms = kept.finished_ms, j.result = kept.result"
    " WHERE j.lease_expires_ms IS NOT NULL AND NOT j.stop_requested"
)

# A named lock per dedupe key (hashed: lock names are short), scoped to the queue's database.
_TURN = "CONCAT('durq:', SHA1(CONCAT(DATABASE(), ':', %s)))"
# How long an enqueuer waits for its turn: longer than InnoDB's default lock wait (50 s), which
# bounds how long the session holding the turn can itself wait.
_TURN_WAIT_S = 60

# The bound on a renewal session's silence inside its transaction, set per driver connection (``_bound_silence``).
_SILENCE_BOUND_S: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

# Deadlock found (rolls back the whole transaction); lock wait timeout (rolls back the
# statement): both are safe to retry.
_LOCK_ERRNOS = {1213, 1205}


class MySQLDialect(Dialect):
    vendor = "mysql"
    finish_json_sql = _FINISH
    exclusivity = "any number of hosts"
    # Bulk enqueue, on MariaDB (≥ 10.6 here; its INSERT can return ids): JSON_TABLE unpacks the texts.
    arguments_source = "JSON_TABLE(%s, '$[*]' COLUMNS (n FOR ORDINALITY, a LONGTEXT CHARACTER SET utf8mb4 PATH '$')) AS jt"
    argument_column = "jt.a"
    ordinal_column = "jt.n"
    claim_index_hint = "FORCE INDEX (durq_job_claim)"
    insert_ignoring = "INSERT IGNORE"
    conflicts_ignored = ""
    insert_control = "INSERT IGNORE INTO durq_queue_control (queue, paused, limited, updated_ms) VALUES (%s, FALSE, TRUE, %s)"
    turn_wait = f"SET STATEMENT innodb_lock_wait_timeout = {gates.TURN_WAIT_S} FOR "

    def prepare_dispatcher_connection(self) -> None:
        """A dispatcher frozen inside its claim (db/gates.py) loses its session, and its turns, after ``TURN_HOLD_S``."""
        self.execute(f"SET SESSION idle_transaction_timeout = {gates.TURN_HOLD_S}")

    def claim(self, queue: str, limit: int, now_ms: int, worker_id: str) -> list[ClaimedJob]:
        """Claim up to ``limit`` due or expired jobs of ``queue``; the expired pick as ``EXPIRED_LOOK_MS`` says.

        Inside a caller's transaction (a completion's) no savepoint: one transaction either way,
        and an error rolls back the whole of it.
        """
        key = (self.connection.alias, queue, worker_id)
        with self._claim_turn(queue, claims.full(key)), transaction.atomic(using=self.connection.alias, savepoint=False):
            rows = []
            look = claims.look_expired(key, now_ms)
            if look == "read first" and not self._first_to_look(key, now_ms):
                look = None
            if look == "pick" or (look == "read first" and self.fetchall(_ANY_EXPIRED, (queue, now_ms))):
                rows = self.fetchall(_PICK_EXPIRED, (queue, now_ms, queue, limit))
            if len(rows) < limit:
                rows += self.fetchall(_PICK_DUE, (queue, now_ms, queue, limit - len(rows)))
            jobs = self._take(rows, now_ms, worker_id)
        claims.took(key, len(jobs) >= limit)
        return jobs

    def _first_to_look(self, key: tuple[str, str, str], now_ms: int) -> bool:
        """Whether this worker is the first busy one to look for expired leases of the queue in this span."""
        queue = key[1]
        span = now_ms // EXPIRED_LOOK_MS
        before = claims.look_span(key, span)
        if before == span:
            return False  # asked already (the clock stepped back): whoever took this span looks
        if before is None:
            return self.fetchall(f"SELECT GET_LOCK({_LOOK}, 0)", (queue, span))[0][0] == 1
        # The span asked for before is given back in the same round trip: a session keeps at most one.
        return self.fetchall(f"SELECT GET_LOCK({_LOOK}, 0), RELEASE_LOCK({_LOOK})", (queue, span, queue, before))[0][0] == 1

    @contextlib.contextmanager
    def _claim_turn(self, queue: str, backlog: bool) -> Iterator[None]:
        """This session's turn to claim ``queue``, or none after ``CLAIM_TURN_WAIT_S`` or while its holder is stalled.

        Taken only while this worker's claims come back full (a backlog, which the claimers walk
        together): a claim after a wake-up, or after a short one, pays no round trip for it, and
        when a backlog appears the first claims go side by side once. Given back when the claim
        has updated its rows. Inside a completion's transaction that is before the commit: the
        next claimer may pass over this one batch while it is still locked, where holding the turn
        until the caller commits would keep every claimer waiting on the completion's statements too.
        """
        key = (self.connection.alias, queue)
        took = False
        if backlog and claims.take_turns(key):
            # Left to right: the holder is read once the wait has ended.
            turn = f"SELECT GET_LOCK({_CLAIM_TURN}, %s), IS_USED_LOCK({_CLAIM_TURN})"
            came, holder = self.fetchall(turn, (queue, CLAIM_TURN_WAIT_S, queue))[0]
            took = came == 1
            if took:
                claims.turn_came(key)
            else:
                claims.turn_missed(key, holder)
        try:
            yield
        finally:
            if took:
                self._release(_CLAIM_TURN, queue)

    def claim_ids(self, picks: Sequence[tuple[int, str | None]], now_ms: int, worker_id: str) -> list[ClaimedJob]:
        ids = integer_list(job_id for job_id, _ in picks)
        pairs = ", ".join([f"({int(job_id)}, %s)" for job_id, _ in picks])
        rows = self.fetchall(
            f"SELECT {_COLUMNS} FROM {JOB} WHERE id IN ({ids}) AND (id, COALESCE(limit_key, '')) IN ({pairs})"
            " AND ((status = 'waiting' AND run_at_ms <= %s) OR (status = 'running' AND lease_expires_ms <= %s))"
            " FOR UPDATE SKIP LOCKED",
            [*(key or "" for _, key in picks), now_ms, now_ms],
        )
        return self._take(rows, now_ms, worker_id)

    def _take(self, rows: list[tuple[Any, ...]], now_ms: int, worker_id: str) -> list[ClaimedJob]:
        """Claim rows this transaction has locked; the new token and attempt count are computed from what was read."""
        if not rows:
            return []
        ids = integer_list(row[0] for row in rows)
        self.execute(
            f"UPDATE {JOB} SET reclaimed_from = CASE WHEN status = 'running' THEN claimed_by ELSE NULL END,"
            " status = 'running', attempts = attempts + 1, claim_token = claim_token + 1,"
            f" claimed_by = %s, started_ms = %s, lease_expires_ms = %s + lease_ms WHERE id IN ({ids})",
            [worker_id, now_ms, now_ms],
        )
        jobs = []
        width = len(CLAIM_COLUMNS)
        for row in rows:
            job = ClaimedJob.from_row(row[:width])
            previous_status, previous_holder = row[width], row[width + 1]
            job.attempts += 1
            job.claim_token += 1
            job.reclaimed_from = previous_holder if previous_status == "running" else None
            jobs.append(job)
        return jobs

    def renew(self, leases: Sequence[Lease], now_ms: int, bound_ms: int | None = None) -> Renewal:
        """Extend the leases whose rows no other transaction holds: lock those, then update them.

        As on PostgreSQL, a row another transaction has locked is skipped, not waited for, and
        reported ``busy`` while still held; ``bound_ms`` caps each statement (``max_statement_time``)
        and, in a transaction of the renewal's own, the session's silence inside it (``_bound_silence``).
        """
        if not leases:
            return Renewal({})
        held, params = self.held_many(leases)
        bound = "" if bound_ms is None else f"SET STATEMENT max_statement_time = {bound_ms / 1000:.3f} FOR "
        if bound_ms is not None and not self.connection.in_atomic_block:
            self._bound_silence(bound_ms)
        with transaction.atomic(using=self.connection.alias):
            pick = f"{bound}SELECT id, claim_token, stop_requested FROM {JOB} WHERE {held} FOR UPDATE SKIP LOCKED"
            rows = self.fetchall(pick, params)
            renewed = {(row[0], row[1]): bool(row[2]) for row in rows}
            if rows:
                ids = integer_list(row[0] for row in rows)
                self.execute(
                    f"{bound}UPDATE {JOB} SET lease_expires_ms = GREATEST(lease_expires_ms, %s + lease_ms) WHERE id IN ({ids})",
                    [now_ms],
                )
            for job_id, _ in renewed:
                hooks.reach("in_renewal", job_id)  # a keeper frozen while it holds the renewed rows' locks
            busy: set[Lease] = set()
            if len(renewed) < len(set(leases)):
                busy = {(row[0], row[1]) for row in self.fetchall(f"SELECT id, claim_token FROM {JOB} WHERE {held}", params)}
                busy -= renewed.keys()
        return Renewal(renewed, busy)

    def _bound_silence(self, bound_ms: int) -> None:
        """Have the server end this session once it is silent inside a transaction for ``bound_ms`` (in whole seconds).

        A renewal holds the locks of the rows it renews until it commits, and the claims that
        rescue expired jobs skip locked rows: a keeper frozen in between (a paused process, a
        stalled host) would keep its jobs from them for as long as it stays frozen. The setting is
        the session's (MariaDB has no setting for one transaction's idle time); the renewal runs
        on the keeper's own connection, and a caller's transaction is never bounded (see ``renew``).
        """
        seconds = max(1, math.ceil(bound_ms / 1000))
        self.connection.ensure_connection()
        raw = self.connection.connection
        if _SILENCE_BOUND_S.get(raw) != seconds:
            self.execute(f"SET SESSION idle_transaction_timeout = {seconds}")
            _SILENCE_BOUND_S[raw] = seconds

    @contextlib.contextmanager
    def dedupe_turn(self, key: str) -> Iterator[None]:
        """Let one session at a time insert a job with dedupe ``key``.

        InnoDB checks a unique key under a shared gap lock. When the key's holder has just been
        deleted, every inserter waiting on it gets that lock, and each then needs an insert lock
        that the others' shared locks block: a deadlock, which rolls back a caller's whole
        transaction, savepoints included. Holding a named lock for the INSERT leaves at most one
        inserter of a key waiting on InnoDB at a time. After a wait past ``_TURN_WAIT_S`` the
        insert goes ahead without its turn.
        """
        took = self.fetchall(f"SELECT GET_LOCK({_TURN}, %s)", (key, _TURN_WAIT_S))[0][0] == 1
        try:
            yield
        finally:
            if took:
                self._release(_TURN, key)

    def _release(self, name: str, param: str) -> None:
        """Give back the named lock ``name`` (an SQL expression of ``param``), whatever state the transaction is in.

        A named lock belongs to the session, not the transaction: it must be given back even when
        an error inside (a deadlock) broke the transaction, where Django refuses queries until the
        atomic block ends, so the driver's cursor is used. When the session itself is gone, so is
        the lock: the driver's error then must not replace the error that ended the session, which
        the caller's retry recognizes.
        """
        try:
            with self.connection.connection.cursor() as cursor:
                cursor.execute(f"DO RELEASE_LOCK({name})", (param,))
        except Exception:  # the driver's own error: Django's wrapper is bypassed
            if self.connection.is_usable():
                raise

    def pack_arguments(self, arguments: Sequence[str]) -> Any:
        return json.dumps(list(arguments), ensure_ascii=False)

    def argument_chunks(self, arguments: Sequence[str]) -> Iterator[list[str]]:
        chunk: list[str] = []
        size = 0
        for text in arguments:
            if chunk and (len(chunk) == _INSERT_ROWS or size + len(text) > _INSERT_CHARS):
                yield chunk
                chunk, size = [], 0
            chunk.append(text)
            size += len(text)
        if chunk:
            yield chunk

    def add_stats(self, rows: Sequence[tuple[str, int, int, int, int, int]]) -> None:
        for row in rows:
            self.execute(
                "INSERT INTO durq_queue_stat (queue, minute_ms, finished, failed, dead, unknown_type)"
                " VALUES (%s, %s, %s, %s, %s, %s)"
                " ON DUPLICATE KEY UPDATE finished = finished + VALUES(finished),"
                " failed = failed + VALUES(failed), dead = dead + VALUES(dead),"
                " unknown_type = unknown_type + VALUES(unknown_type)",
                row,
            )

    def is_lock_error(self, error: BaseException) -> bool:
        cause = error.__cause__ if error.__cause__ is not None else error
        args: tuple[object, ...] = tuple(getattr(cause, "args", ()))
        return bool(args) and args[0] in _LOCK_ERRNOS
