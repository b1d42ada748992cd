"""SQLite: writers are serialized, so one ``UPDATE … RETURNING`` claims exclusively.

The UPDATE takes the write lock before it evaluates its subquery, so a second claimer waits
for the first to commit and then no longer sees the rows it took. That holds for processes on
one host sharing the database file; it says nothing about a file on a network share.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence

from .base import CLAIM_COLUMNS, JOB, NOT_PAUSED, ClaimedJob, Dialect, Lease, Renewal

# What a claim writes: its parameters are the worker, then the claim time twice.
_TAKE = f"""
UPDATE {JOB} SET
    status = 'running',
    attempts = attempts + 1,
    claim_token = claim_token + 1,
    claimed_by = %s,
    started_ms = %s,
    lease_expires_ms = %s + lease_ms,
    reclaimed_from = CASE WHEN status = 'running' THEN claimed_by ELSE NULL END
"""

# INDEXED BY: without statistics SQLite may read the due index and sort every waiting row; the
# claim index (waiting rows only, see migration 0002) already holds them in claim order.
_CLAIM = f"""{_TAKE}WHERE id IN (
    SELECT id FROM (
        SELECT id FROM {JOB}
        WHERE queue = %s AND status = 'running' AND lease_expires_ms <= %s AND attempts < max_attempts
            AND limit_key IS NULL AND {NOT_PAUSED}
        ORDER BY lease_expires_ms LIMIT %s)
    UNION ALL
    SELECT id FROM (
        SELECT id FROM {JOB} INDEXED BY durq_job_claim
        WHERE queue = %s AND status = 'waiting' AND run_at_ms <= %s AND limit_key IS NULL AND {NOT_PAUSED}
        ORDER BY priority DESC, run_at_ms, id LIMIT %s)
    LIMIT %s)
RETURNING {", ".join(CLAIM_COLUMNS)}
"""

# A limited claim's update of the jobs it picked under the write lock (db/flow.py).
# Its picks arrive as one JSON array of [id, key counted] ("" for no key).
_CLAIM_IDS = f"""{_TAKE}WHERE id IN (SELECT json_extract(value, '$[0]') FROM json_each(%s))
    AND (id, COALESCE(limit_key, '')) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(%s))
    AND ((status = 'waiting' AND run_at_ms <= %s) OR (status = 'running' AND lease_expires_ms <= %s))
RETURNING {", ".join(CLAIM_COLUMNS)}
"""

_LOCK_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}

# A dispatcher reads the few pages its claims and completions touch, but SQLite's default page
# cache (2 MB per connection) keeps filling with pages of jobs long gone, so the worker's RSS
# grew with the number of jobs run (+4.4–4.8% from 1,000 to 100,000 jobs; +1.2–2.1% with this
# bound, drain rate unchanged). Misses are served from the operating system's page cache.
DISPATCHER_PAGE_CACHE_KIB = 256

# The places of these attempts (db/places.py), the pairs arriving the same way.
_ATTEMPTS = "(job_id, claim_token) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(%s))"

# Pairs arrive as one JSON array; SQLite looks each id up by rowid.
_HELD = (
    "status = 'running' AND (id, claim_token) IN"
    " (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(%s))"
)


# A batch of finished jobs kept (``finish_many``): one text for every batch size, each job's
# (id, token, finished at, result) an element of one JSON array, joined by rowid. A job an operator
# asked to stop is left running for the caller to end cancelled, as in the shared statement.
_FINISH = f"""UPDATE {JOB} SET status = 'finished',
    lease_expires_ms = NULL, finished_ms = done.finished_ms, result = done.result
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token,
        json_extract(value, '$[2]') AS finished_ms, json_extract(value, '$[3]') AS result FROM json_each(%s)) AS done
WHERE {JOB}.id = done.id AND {JOB}.claim_token = done.token AND {JOB}.status = 'running'
    AND NOT {JOB}.stop_requested"""


class SQLiteDialect(Dialect):
    vendor = "sqlite"
    finish_json_sql = _FINISH
    exclusivity = "processes on one host sharing the database file"
    serialized_writes = True
    claim_index_hint = "INDEXED BY durq_job_claim"
    edge_lock = ""
    row_lock = ""
    partial_indexes = True
    greatest = "MAX"
    arguments_source = "json_each(%s)"
    argument_column = "value"
    ordinal_column = "key"

    def claim(self, queue: str, limit: int, now_ms: int, worker_id: str) -> list[ClaimedJob]:
        params = (worker_id, now_ms, now_ms, queue, now_ms, queue, limit, queue, now_ms, queue, limit, limit)
        jobs = [ClaimedJob.from_row(row) for row in self.fetchall(_CLAIM, params)]
        # RETURNING gives rows in no defined order; hand them out in claim order.
        jobs.sort(key=lambda job: (job.reclaimed_from is None, -job.priority, job.run_at_ms, job.id))
        return jobs

    def claim_ids(self, picks: Sequence[tuple[int, str | None]], now_ms: int, worker_id: str) -> list[ClaimedJob]:
        pairs = json.dumps([[job_id, key or ""] for job_id, key in picks])
        rows = self.fetchall(_CLAIM_IDS, (worker_id, now_ms, now_ms, pairs, pairs, now_ms, now_ms))
        return [ClaimedJob.from_row(row) for row in rows]

    def lock_gate(self, queue: str, now_ms: int) -> bool:
        # The insert takes the database's write lock, row or no row: the turn is the lock itself.
        self.execute(self.insert_control, (queue, now_ms))
        return bool(self.fetchall("SELECT paused FROM durq_queue_control WHERE queue = %s", (queue,))[0][0])

    def held_many(self, leases: Sequence[Lease]) -> tuple[str, list[object]]:
        return _HELD, [json.dumps(leases)]

    def renew(self, leases: Sequence[Lease], now_ms: int, bound_ms: int | None = None) -> Renewal:
        """The shared renewal, waiting for the database's write lock at most ``bound_ms``.

        SQLite has no row locks: a renewal waits for whichever connection writes, up to the
        connection's busy timeout, which this shortens for the renewal and then puts back.
        """
        if bound_ms is None:
            return super().renew(leases, now_ms)
        waits = int(self.fetchall("PRAGMA busy_timeout")[0][0])
        if waits <= bound_ms:
            return super().renew(leases, now_ms)
        self.execute(f"PRAGMA busy_timeout = {int(bound_ms)}")
        try:
            return super().renew(leases, now_ms)
        finally:
            self.execute(f"PRAGMA busy_timeout = {waits}")

    def attempt_pairs(self, leases: Sequence[Lease]) -> tuple[str, list[object]]:
        return _ATTEMPTS, [json.dumps(leases)]

    def add_stats(self, rows: Sequence[tuple[str, int, int, int, int, int]]) -> None:
        for row in rows:
            self.execute(
                "INSERT INTO durq_queue_stat (queue, minute_ms, finished, failed, dead, unknown_type)"
                " VALUES (%s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (queue, minute_ms) DO UPDATE SET finished = finished + excluded.finished,"
                " failed = failed + excluded.failed, dead = dead + excluded.dead,"
                " unknown_type = unknown_type + excluded.unknown_type",
                row,
            )

    def is_lock_error(self, error: BaseException) -> bool:
        cause = error.__cause__ if error.__cause__ is not None else error
        code = getattr(cause, "sqlite_errorcode", None)
        if code is not None:
            return (code & 0xFF) in _LOCK_CODES
        return isinstance(cause, sqlite3.OperationalError) and "locked" in str(cause)

    def prepare_dispatcher_connection(self) -> None:
        self.execute(f"PRAGMA cache_size = -{DISPATCHER_PAGE_CACHE_KIB}")
        # A commit that takes the write-ahead log past its threshold copies the log into the
        # file and syncs it, there and then: 3-6 ms on the benchmark machine, the whole tail of the
        # time from enqueue to start when a claim drew it. The dispatcher's claims and completions
        # leave that to the worker's monitor (``checkpoint``) and to the other connections.
        self.execute("PRAGMA wal_autocheckpoint = 0")

    def checkpoint(self) -> None:
        # PASSIVE: copies what no reader still needs, waits for nobody, and costs a read when
        # there is nothing to copy.
        self.fetchall("PRAGMA wal_checkpoint(PASSIVE)")

    def data_version(self) -> int:
        """Changes whenever another connection commits to the file: a wake-up check with no lock."""
        return int(self.fetchall("PRAGMA data_version")[0][0])

    def data_version_reader(self) -> Callable[[], int]:
        """A cheap ``data_version`` for polling every few milliseconds.

        It reads through the driver's own connection, skipping Django's cursor wrappers: the
        watcher asks hundreds of times a second, and an idle worker should cost next to nothing.
        """
        self.connection.ensure_connection()
        raw = self.connection.connection
        return lambda: int(raw.execute("PRAGMA data_version").fetchone()[0])
