"""PostgreSQL: ``FOR UPDATE SKIP LOCKED`` in the picking CTEs, then one ``UPDATE … RETURNING``.

Row locks make the claim exclusive for any number of hosts. Concurrent claimers skip rows
another claimer has locked instead of queueing behind it.
"""

from __future__ import annotations

import select
import time
import uuid
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import get_settings, hooks
from . import gates
from . import postgresql_claims as claims
from .base import JOB, ClaimCount, ClaimedJob, Dialect, Lease, Renewal, own_connection
from .pooler import lends_sessions

# The driver connections whose session has them prepared.
_PREPARED_ON: weakref.WeakSet[Any] = weakref.WeakSet()

# SQLSTATEs of contention worth a retry: deadlock, serialization failure, lock not available.
_LOCK_STATES = {"40P01", "40001", "55P03"}

NOTIFY_CHANNEL = "durq"
# How long the LISTEN probe waits for its own NOTIFY: a direct connection hears it within milliseconds.
PROBE_WAIT_S = 2.0

# Pairs arrive as arrays, so the statement text is the same for every batch size. A row matches
# only its own pair: two attempts of one job (a stale one still in this process's book and the
# one the database holds) each name their own token. Where the ids are distinct, as in nearly every
# batch, a row's token is the one at its id's position: a primary-key lookup per id and a scan of
# an array in C. Where they are not, each row tests the pairs one by one, a correlated scan that
# costs about 20 µs a row at a batch of 130 (measured), paid only then. A row is running exactly
# while its lease_expires_ms is set; testing that instead of the status keeps the planner on
# primary-key lookups: "status = 'running'" would let it pick the partial lease index, and with
# statistics gathered while nothing ran it then rescans the pairs per row.
_HELD_DISTINCT = (
    "lease_expires_ms IS NOT NULL AND id = ANY(%s::bigint[]) AND claim_token = (%s::bigint[])[array_position(%s::bigint[], id)]"
)
_HELD_PAIRS = (
    f"lease_expires_ms IS NOT NULL AND id = ANY(%s::bigint[]) AND EXISTS (SELECT FROM unnest(%s::bigint[], %s::bigint[])"
    f" AS pair(id, token) WHERE pair.id = {JOB}.id AND pair.token = {JOB}.claim_token)"
)

# A batch of finished jobs kept (``finish_many``): one text for every batch size, the finish times
# and results as arrays beside the ids, so neither the driver nor the server parses and plans it
# anew per batch, as a ``CASE id WHEN … `` list of the batch's length made them do. A job an operator
# asked to stop is left running for the caller to end cancelled, as in the shared statement. Only
# for distinct ids: with two attempts of one job, the arrays would give both the first's.
_FINISH = (
    f"UPDATE {JOB} SET status = 'finished', lease_expires_ms = NULL,"
    " finished_ms = (%s::bigint[])[array_position(%s::bigint[], id)], result = {result} WHERE {held} AND NOT stop_requested"
)
_FINISH_NO_RESULT = _FINISH.format(result="NULL", held=_HELD_DISTINCT)
_FINISH_RESULTS = _FINISH.format(result="(%s::text[])[array_position(%s::bigint[], id)]", held=_HELD_DISTINCT)

# A renewal locks the rows it extends and skips those another transaction holds (see ``renew``);
# by the fence ``held_many`` chose.
_RENEW = {
    held: f"""UPDATE {JOB} SET lease_expires_ms = GREATEST(lease_expires_ms, %s + lease_ms)
WHERE id = ANY(ARRAY(SELECT id FROM {JOB} WHERE {held} FOR UPDATE SKIP LOCKED))
RETURNING id, claim_token, stop_requested"""
    for held in (_HELD_DISTINCT, _HELD_PAIRS)
}
_STILL_HELD = {held: f"SELECT id, claim_token FROM {JOB} WHERE {held}" for held in (_HELD_DISTINCT, _HELD_PAIRS)}
# The places of attempts (db/places.py), matched the same two ways.
_ATTEMPTS_DISTINCT = "job_id = ANY(%s::bigint[]) AND claim_token = (%s::bigint[])[array_position(%s::bigint[], job_id)]"
_ATTEMPTS_PAIRS = "(job_id, claim_token) IN (SELECT * FROM unnest(%s::bigint[], %s::bigint[]))"
# For the rest of the renewal's own transaction: no wait for a lock, nor the whole statement, past
# the bound; nor the session's silence while it holds the renewed rows' locks: a keeper frozen
# there (a paused process, a stalled host) would keep its jobs from the claims that rescue them,
# which skip locked rows, for as long as it stays frozen. The server ends such a session instead.
_BOUND = (
    "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true),"
    " set_config('idle_in_transaction_session_timeout', %s, true)"
)
# Both turns of a limited claim in one round trip. PostgreSQL sorts the rows before it locks them,
# so the queue's row is locked first and the keys' turn second, the order every claimer keeps.
_LOCK_TURNS = "SELECT queue, paused FROM durq_queue_control WHERE queue IN (%s, %s) ORDER BY queue = %s FOR UPDATE"
_TURN_BOUNDS = "SELECT set_config('lock_timeout', %s, true), set_config('idle_in_transaction_session_timeout', %s, true)"


def _integers(values: Iterable[int]) -> str:
    """An array of integers as the text of its literal (cast in the statement, ``%s::bigint[]``).

    The driver adapts a list element by element in Python, which cost a drain more of its CPU than
    the statement's whole execution on the server: a batch's arrays are a few hundred integers each.
    """
    return "{" + ",".join(map(str, values)) + "}"


def _texts(values: Iterable[str | None]) -> str:
    """An array of texts as the text of its literal (``%s::text[]``), for the same reason as ``_integers``.

    Every element is quoted, with its double quotes and backslashes escaped, so a key or a result
    of any content reads back as written; None is the array's NULL.
    """
    quoted = ("NULL" if value is None else '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"' for value in values)
    return "{" + ",".join(quoted) + "}"


def _distinct(leases: Sequence[Lease]) -> bool:
    """Whether these attempts are of distinct jobs (no job's id twice)."""
    return len({job_id for job_id, _ in leases}) == len(leases)


class PostgreSQLDialect(Dialect):
    vendor = "postgresql"
    edge_lock = "FOR UPDATE OF d"  # the upstream side of the join may be missing, and is never locked
    exclusivity = "any number of hosts"
    supports_notify = True
    partial_indexes = True
    claims_counted = True
    arguments_source = "unnest(%s::text[]) WITH ORDINALITY AS t(a, n)"
    argument_column = "a"
    ordinal_column = "n"

    def claim(self, queue: str, limit: int, now_ms: int, worker_id: str) -> list[ClaimedJob]:
        """Claim up to ``limit`` due or expired jobs of ``queue``, within the caller's transaction."""
        params = (queue, now_ms, queue, limit, queue, now_ms, queue, limit, limit, worker_id, now_ms, now_ms)
        return self._claimed("durq_claim", claims.CLAIM, params)

    def claim_counted(self, queue: str, limit: int, now_ms: int, worker_id: str, count: ClaimCount) -> list[ClaimedJob]:
        """Claim as ``claim`` does, and count it, in one statement that is its own transaction.

        It commits without waiting for the WAL flush (unless ``DURQ["DURABLE_CLAIMS"]``): the flush
        is most of the time from enqueue to start. Should the server crash before the WAL writer
        flushes it (within a fraction of a second), the claim and its count are undone: the job is
        waiting again, its attempt not counted, and a worker that already started it finds its
        completion fenced, so it runs again. A claim made together with completions commits
        with them, flushed.
        """
        params: list[Any] = [queue, now_ms, queue, limit, queue, now_ms, queue, limit, limit, worker_id, now_ms, now_ms]
        params += [now_ms, count.writer, count.updated_ms, count.started, count.wait_sum]
        params += [list(count.wait_buckets), list(count.wait_bounds_ms)]
        if get_settings().durable_claims:
            return self._claimed("durq_claim_counted", claims.CLAIM_COUNTED, params)
        return self._claimed("durq_claim_counted_unflushed", claims.CLAIM_COUNTED_UNFLUSHED, params)

    def _claimed(self, name: str, sql: str, params: Sequence[Any]) -> list[ClaimedJob]:
        """Run a fast claim (see ``_run_claim``) and hand its jobs out in claim order."""
        jobs = self._run_claim(name, sql, params)
        jobs.sort(key=lambda job: (job.reclaimed_from is None, -job.priority, job.run_at_ms, job.id))
        return jobs

    def _run_claim(self, name: str, sql: str, params: Sequence[Any]) -> list[ClaimedJob]:
        """Run a claim: ``EXECUTE name`` where this session prepared it, else its text."""
        raw = self.connection.connection
        if raw is not None and raw in _PREPARED_ON:
            rows = self.fetchall(claims.EXECUTE[name], params)
        else:
            rows = self.fetchall(sql, params)
        return [ClaimedJob.from_row(row) for row in rows]

    def lock_gates(self, queue: str, now_ms: int, keys: bool) -> bool:
        if not keys:
            return super().lock_gates(queue, now_ms, keys)
        for _ in range(2):
            turns = dict(self.fetchall(_LOCK_TURNS, (queue, gates.KEYS_GATE, gates.KEYS_GATE)))
            if len(turns) == 2:
                return bool(turns[queue])
            for gate in (queue, gates.KEYS_GATE):
                if gate not in turns:
                    self.execute(self.insert_control, (gate, now_ms))  # made once; then locked in order
        raise RuntimeError(f"durq: the control rows of queue {queue!r} and of the limit keys could not be made")

    def bound_turns(self) -> None:
        # For the rest of this transaction only, so that a transaction pooler's other clients keep their settings.
        bounds = [str(gates.TURN_WAIT_S * 1000), str(gates.TURN_HOLD_S * 1000)]
        self.fetchall(_TURN_BOUNDS, bounds)

    def prepare_dispatcher_connection(self) -> None:
        """Keep the claim's plan on the server, where the dispatcher's session is its own.

        Planning the claim costs more than running it (about 0.6 ms of the 1.7 ms a claim took on
        the benchmark machine after 20 ms idle), and Django's default client-side binding has the
        server plan every statement anew. So the session prepares its claims once (the fast claim, and
        the limited claim's update of the jobs it admitted), each with a generic
        plan (left to choose, the server would go on planning it for each call's values), and the
        dispatcher sends ``EXECUTE`` with its arguments bound by the client, Django's default. A statement
        prepared on one server connection is missing on the next behind a transaction pooler, so
        this is done only where the queue's database is also where workers LISTEN
        (``DURQ["LISTEN_DATABASE"]``), and where its connections keep their server session
        (``pooler.lends_sessions``: the worker asks when it starts, and the answer is kept).
        """
        if get_settings().listen_database != self.connection.alias or not _keeps_sessions(self.connection):
            return
        if self.connection.settings_dict.get("OPTIONS", {}).get("server_side_binding"):
            # The server binds ``EXECUTE``'s arguments only when they are written in the text
            # ("there is no parameter $1"); with server-side binding the driver prepares the claim.
            return
        self.connection.ensure_connection()
        raw = self.connection.connection
        if raw in _PREPARED_ON:
            return
        self.execute("SET plan_cache_mode = force_generic_plan")
        present = {row[0] for row in self.fetchall("SELECT name FROM pg_prepared_statements WHERE name LIKE 'durq%%'")}
        for name, sql in claims.PREPARED.items():
            if name not in present:  # else prepared by an earlier call on this session
                self.execute(f"PREPARE {name}({claims.TYPES[name]}) AS {claims.numbered(sql)}")
        _PREPARED_ON.add(raw)

    def claim_ids(self, picks: Sequence[tuple[int, str | None]], now_ms: int, worker_id: str) -> list[ClaimedJob]:
        ids = _integers(job_id for job_id, _ in picks)
        keys = _texts(key or "" for _, key in picks)
        # Unsorted: the limited claim orders what it admitted (db/flow.py).
        return self._run_claim("durq_claim_ids", claims.CLAIM_IDS, (worker_id, now_ms, now_ms, ids, keys, ids, now_ms, now_ms))

    def held_many(self, leases: Sequence[Lease]) -> tuple[str, list[Any]]:
        ids = _integers(job_id for job_id, _ in leases)
        tokens = _integers(token for _, token in leases)
        if _distinct(leases):
            return _HELD_DISTINCT, [ids, tokens, ids]
        return _HELD_PAIRS, [ids, ids, tokens]

    def renew(self, leases: Sequence[Lease], now_ms: int, bound_ms: int | None = None) -> Renewal:
        """Extend the leases whose rows no other transaction holds, in one statement.

        A row another transaction has locked (a user's ``select_for_update()``, an operator's
        action) is skipped, not waited for: one lock cannot hold up every other lease this
        process renews. A skipped lease still held is reported ``busy`` and renewed next time.
        """
        if not leases:
            return Renewal({})
        held, params = self.held_many(leases)
        # Set only in a transaction of the renewal's own: a caller's would keep the settings.
        bounded = bound_ms is not None and not self.connection.in_atomic_block
        with transaction.atomic(using=self.connection.alias):
            if bounded:
                self.fetchall(_BOUND, [str(bound_ms)] * 3)
            rows = self.fetchall(_RENEW[held], [now_ms, *params])
            renewed = {(row[0], row[1]): bool(row[2]) for row in rows}
            for job_id, _ in renewed:
                hooks.reach("in_renewal", job_id)  # a keeper frozen while it holds the renewed rows' locks
            busy: set[Lease] = set()
            if len(renewed) < len(set(leases)):
                busy = {(row[0], row[1]) for row in self.fetchall(_STILL_HELD[held], params)} - renewed.keys()
        return Renewal(renewed, busy)

    def finish_many(self, kept: Sequence[tuple[Lease, int, str | None]]) -> set[Lease]:
        if not kept:
            return set()  # finished jobs deleted: no statement for an empty batch
        leases = [lease for lease, _, _ in kept]
        if not _distinct(leases):
            return super().finish_many(kept)  # two attempts of one job: the arrays would give both the first's
        ids = _integers(job_id for job_id, _ in leases)
        held = [ids, _integers(token for _, token in leases), ids]  # _HELD_DISTINCT's
        finished = _integers(finished_ms for _, finished_ms, _ in kept)
        results = [result for _, _, result in kept]
        if any(result is not None for result in results):
            updated = self.execute(_FINISH_RESULTS, [finished, ids, _texts(results), ids, *held])
        else:
            updated = self.execute(_FINISH_NO_RESULT, [finished, ids, *held])
        if updated == len(kept):
            return set(leases)
        return self.finished_leases(leases)  # only this attempt's own token can have finished its row

    def attempt_pairs(self, leases: Sequence[Lease]) -> tuple[str, list[Any]]:
        ids = _integers(job_id for job_id, _ in leases)
        tokens = _integers(token for _, token in leases)
        if _distinct(leases):
            return _ATTEMPTS_DISTINCT, [ids, tokens, ids]
        return _ATTEMPTS_PAIRS, [ids, tokens]  # two attempts of one job may both hold a place

    def add_stats(self, rows: Sequence[tuple[str, int, int, int, int, int]]) -> None:
        for row in rows:
            self.execute(
                "INSERT INTO durq_queue_stat (queue, minute_ms, finished, failed, dead, unknown_type)"
                " VALUES (%s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (queue, minute_ms) DO UPDATE SET finished = durq_queue_stat.finished + excluded.finished,"
                " failed = durq_queue_stat.failed + excluded.failed, dead = durq_queue_stat.dead + excluded.dead,"
                " unknown_type = durq_queue_stat.unknown_type + excluded.unknown_type",
                row,
            )

    def insert_job(self, values: dict[str, Any], notify: bool) -> int:
        # The NOTIFY rides in the INSERT's RETURNING list: one round trip and one commit, and
        # cheaper for the server than a CTE around the INSERT.
        columns = ", ".join(values)
        marks = ", ".join(["%s"] * len(values))
        sql = f"INSERT INTO {JOB} ({columns}) VALUES ({marks}) RETURNING id"
        params: list[Any] = list(values.values())
        if notify:
            sql += ", pg_notify(%s, %s)"
            params += [NOTIFY_CHANNEL, values["queue"]]
        return int(self.fetchall(sql, params)[0][0])

    def pack_arguments(self, arguments: Sequence[str]) -> Any:
        return list(arguments)  # a text[]

    def notify(self, queues: Sequence[str]) -> None:
        # NOTIFY is transactional: inside atomic() it is delivered only if the enqueue commits.
        for queue in sorted(set(queues)):
            self.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, queue))

    def is_lock_error(self, error: BaseException) -> bool:
        cause = error.__cause__ if error.__cause__ is not None else error
        state = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        return state in _LOCK_STATES


def _keeps_sessions(connection: BaseDatabaseWrapper) -> bool:
    try:
        return not lends_sessions(connection)
    except Exception:  # noqa: BLE001 - a session that cannot be vouched for gets no prepared statement
        return False


def hears_notifications(listen: BaseDatabaseWrapper, send: BaseDatabaseWrapper, wait_s: float = PROBE_WAIT_S) -> bool:
    """Whether a session of ``listen`` that LISTENs hears a NOTIFY committed through ``send``.

    True only when both reach the same database of the same server, and ``listen`` keeps its
    session (no transaction pooler between). The channel is the probe's own: no worker wakes.
    """
    channel = f"durq_probe_{uuid.uuid4().hex}"
    raw = own_connection(listen)
    try:
        raw.autocommit = True
        raw.cursor().execute(f"LISTEN {channel}")
        with send.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [channel])
        if callable(getattr(raw, "notifies", None)):  # psycopg 3
            return any(True for _ in raw.notifies(timeout=wait_s, stop_after=1))
        deadline = time.monotonic() + wait_s  # psycopg2
        while not raw.notifies and time.monotonic() < deadline:
            select.select([raw], [], [], deadline - time.monotonic())
            raw.poll()
        return bool(raw.notifies)
    finally:
        raw.close()
