"""Claims under flow control: concurrency and rate limits per key and per queue, across every worker.

A limit is enforced *inside* the claim, never after it: a job that may not start yet stays
waiting with its attempts unspent and its place in the order kept, and the claim takes the next
job instead, so a key at its limit never holds back other keys. What counts is read from the
rows themselves, never from permits a worker holds:

- running: rows that are running under a lease that has not expired. Only the current holder
  can end a row's run, and a crashed holder's place frees when its lease expires;
- started: rows of the start log (``durq_start``), one per start of a rate-limited job, counted
  over a sliding window of the rate's period on the database's clock, so no boundary between
  two fixed windows lets twice the rate through.

Claimers of one limited queue take turns: each locks the queue's control row first (SQLite's
single writer does the same for free), so two workers cannot both see the last free place. The
fast claim (``Dialect.claim``) leaves limited jobs alone; a pool claims through here once its
queue has limits in the settings or limited jobs in the table.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import transaction

from .. import hooks
from ..limits import MAX_PERIOD_MS, QueueLimits
from .base import JOB, ClaimedJob

if TYPE_CHECKING:
    from ..clock import Clock
    from .base import Dialect

CONTROL = "durq_queue_control"
STARTS = "durq_start"
# How many rounds of candidates one claim reads at most while skipping jobs it may not start.
ROUNDS = 8
# Candidates read per round beyond the places left: some may belong to keys at their limit.
SLACK = 16
# Starts are forgotten this long after their window has passed, not at once: a claimer whose
# clock reads a little behind another's still counts every start inside its own window.
FORGET_AFTER_MS = 60_000
# A claimer deletes forgotten starts of a scope at most this often, not at every claim.
PRUNE_EVERY_MS = 10_000
_pruned_at: dict[str, int] = {}  # scope -> when this process last deleted its forgotten starts


@dataclass
class Candidate:
    id: int
    key: str | None
    max_running: int | None
    rate: int | None
    period_ms: int | None


@dataclass
class Admission:
    """What may start now in one queue: places left per key and for the queue, read under the gate."""

    queue: str
    now_ms: int
    limits: QueueLimits
    running: dict[str | None, int] = field(default_factory=dict)  # running jobs per key (None: no key)
    key_limit: dict[str, int] = field(default_factory=dict)  # the least max_running among a key's running rows
    queue_starts: list[int] = field(default_factory=list)
    key_starts: dict[str, list[int]] = field(default_factory=dict)  # start times in the last day, per key scope
    taken: dict[str | None, int] = field(default_factory=lambda: defaultdict(int))
    taken_total: int = 0
    expired: bool = False  # a running row's lease has expired: it may be claimed again

    @classmethod
    def read(cls, dialect: Dialect, queue: str, now_ms: int, limits: QueueLimits) -> Admission:
        admission = cls(queue, now_ms, limits)
        # Running rows whose lease expired count for nothing (their worker is gone) but are
        # claimed again first: seeing whether any exist spares a read of them on most claims.
        rows = dialect.fetchall(
            f"SELECT limit_key, SUM(CASE WHEN lease_expires_ms > %s THEN 1 ELSE 0 END), MIN(limit_running),"
            f" MIN(lease_expires_ms) FROM {JOB} WHERE queue = %s AND status = 'running' GROUP BY limit_key",
            (now_ms, queue),
        )
        for key, count, least, first_expiry in rows:
            if count:
                admission.running[key] = int(count)
            if key is not None and least is not None:
                admission.key_limit[key] = int(least)
            admission.expired |= first_expiry is not None and first_expiry <= now_ms
        if limits.rate is not None:
            admission.queue_starts = _starts(dialect, [queue_scope(queue)], now_ms - limits.rate.period_ms).get(
                queue_scope(queue), []
            )
        return admission

    def queue_room(self) -> int | None:
        """How many more jobs the queue's own limits let start now; None when it has none."""
        rooms = []
        if self.limits.max_running is not None:
            rooms.append(self.limits.max_running - sum(self.running.values()) - self.taken_total)
        if self.limits.rate is not None:
            rooms.append(self.limits.rate.count - len(self.queue_starts) - self.taken_total)
        return max(0, min(rooms)) if rooms else None

    def blocked_keys(self) -> set[str]:
        """Keys whose running jobs already fill the limit those jobs carry."""
        return {key for key, least in self.key_limit.items() if self.running.get(key, 0) + self.taken[key] >= least}

    def load_rates(self, dialect: Dialect, candidates: Sequence[Candidate]) -> None:
        """Read the start log of every rate-limited key among ``candidates`` not read yet."""
        scopes = {key_scope(self.queue, c.key) for c in candidates if c.rate is not None and c.key is not None}
        scopes -= set(self.key_starts)
        if scopes:
            found = _starts(dialect, sorted(scopes), self.now_ms - MAX_PERIOD_MS)
            for scope in scopes:
                self.key_starts[scope] = found.get(scope, [])

    def admits(self, candidate: Candidate) -> bool:
        key = candidate.key
        at_most = candidate.max_running
        if key is not None and at_most is not None and self.running.get(key, 0) + self.taken[key] >= at_most:
            return False
        if key is not None and candidate.rate is not None and candidate.period_ms is not None:
            since = self.now_ms - candidate.period_ms
            started = sum(1 for t in self.key_starts.get(key_scope(self.queue, key), ()) if t > since)
            if started + self.taken[key] >= candidate.rate:
                return False
        return True

    def take(self, candidate: Candidate) -> None:
        self.taken[candidate.key] += 1
        self.taken_total += 1

    def opens_at(self, waiting: Sequence[Candidate]) -> int | None:
        """When a rate window next lets one of ``waiting`` (or the queue) start; None if no rate holds them back."""
        times: list[int] = []
        if self.limits.rate is not None and len(self.queue_starts) >= self.limits.rate.count:
            times.append(self.queue_starts[len(self.queue_starts) - self.limits.rate.count] + self.limits.rate.period_ms)
        for candidate in waiting:
            if candidate.key is None or candidate.rate is None or candidate.period_ms is None:
                continue
            since = self.now_ms - candidate.period_ms
            window = [t for t in self.key_starts.get(key_scope(self.queue, candidate.key), ()) if t > since]
            if len(window) >= candidate.rate:
                times.append(window[len(window) - candidate.rate] + candidate.period_ms)
        return min(times) if times else None


def queue_scope(queue: str) -> str:
    return f"q:{queue}"


def key_scope(queue: str, key: str) -> str:
    return f"k:{queue}:{key}"


def _starts(dialect: Dialect, scopes: Sequence[str], since_ms: int) -> dict[str, list[int]]:
    marks = ", ".join(["%s"] * len(scopes))
    rows = dialect.fetchall(
        f"SELECT scope, started_ms FROM {STARTS} WHERE scope IN ({marks}) AND started_ms > %s ORDER BY started_ms",
        [*scopes, since_ms],
    )
    found: dict[str, list[int]] = defaultdict(list)
    for scope, started in rows:
        found[scope].append(int(started))
    return found


_CANDIDATE_COLUMNS = "id, limit_key, limit_running, limit_rate, limit_period_ms"


def _candidates(
    dialect: Dialect, queue: str, now_ms: int, count: int, skip_keys: set[str], seen: set[int], *, expired: bool
) -> list[Candidate]:
    """Jobs of ``queue`` that could start, in claim order, leaving out keys at their limit and ids already read."""
    params: list[Any] = [queue, now_ms]
    if expired:
        where = "status = 'running' AND lease_expires_ms <= %s AND attempts < max_attempts"
        order = "lease_expires_ms"
    else:
        where = "status = 'waiting' AND run_at_ms <= %s"
        order = "priority DESC, run_at_ms, id"
    if skip_keys:
        where += f" AND (limit_key IS NULL OR limit_key NOT IN ({', '.join(['%s'] * len(skip_keys))}))"
        params += sorted(skip_keys)
    if seen:
        where += f" AND id NOT IN ({', '.join(['%s'] * len(seen))})"
        params += sorted(seen)
    hint = "" if expired else f" {dialect.claim_index_hint}"
    rows = dialect.fetchall(
        f"SELECT {_CANDIDATE_COLUMNS} FROM {JOB}{hint} WHERE queue = %s AND {where} ORDER BY {order} LIMIT %s",
        [*params, count],
    )
    return [Candidate(int(r[0]), r[1], r[2], r[3], r[4]) for r in rows]


def _admit(dialect: Dialect, admission: Admission, limit: int) -> tuple[list[Candidate], list[Candidate]]:
    """Pick up to ``limit`` jobs the limits let start: (jobs to claim, due jobs held back)."""
    accepted: list[Candidate] = []
    held_back: list[Candidate] = []
    seen: set[int] = set()
    skip = admission.blocked_keys()
    for round_ in range(ROUNDS):
        room = admission.queue_room()
        want = limit - len(accepted) if room is None else min(limit - len(accepted), room)
        if want <= 0:
            break
        count = want * 2 + SLACK
        rows = []
        if round_ == 0 and admission.expired:
            rows = _candidates(dialect, admission.queue, admission.now_ms, count, skip, seen, expired=True)
        rows += _candidates(dialect, admission.queue, admission.now_ms, count, skip, seen, expired=False)
        if not rows:
            break
        admission.load_rates(dialect, rows)
        for candidate in rows:
            seen.add(candidate.id)
            if len(accepted) < limit and admission.queue_room() != 0 and admission.admits(candidate):
                admission.take(candidate)
                accepted.append(candidate)
            else:
                held_back.append(candidate)
                if candidate.key is not None and not admission.admits(candidate):
                    skip.add(candidate.key)  # its next jobs are held back too: read past them
    return accepted, held_back


def claim_limited(
    dialect: Dialect,
    queue: str,
    limit: int,
    now_ms: int,
    worker_id: str,
    limits: QueueLimits,
    clock: Clock | None = None,
) -> list[ClaimedJob]:
    """Claim up to ``limit`` jobs of ``queue`` that its limits let start now, in claim order.

    With ``clock``, the time is read again once the turn is taken: a claimer that waited for its
    turn must not log its starts at the time it began to wait, behind starts logged meanwhile.
    """
    with transaction.atomic(using=dialect.connection.alias):
        if dialect.lock_gate(queue, now_ms):
            return []  # paused
        if clock is not None:
            now_ms = max(now_ms, clock.now_ms())
        admission = Admission.read(dialect, queue, now_ms, limits)
        accepted, _ = _admit(dialect, admission, limit)
        if not accepted:
            return []
        hooks.jitter("admit")  # a claimer stalled between counting and claiming still holds the turn
        jobs = dialect.claim_ids([candidate.id for candidate in accepted], now_ms, worker_id)
        _record_starts(dialect, admission, accepted)
    jobs.sort(key=lambda job: (job.reclaimed_from is None, -job.priority, job.run_at_ms, job.id))
    return jobs


def next_start(dialect: Dialect, queue: str, now_ms: int, limits: QueueLimits) -> int | None:
    """When a job of ``queue`` may next start under its limits (``<= now_ms``: now); None: nothing waits.

    A read that locks nothing, for an idle pool: jobs held back by a limit do not make it claim
    again and again. A held-back job starts at the latest when a rate window opens, when a
    running job's lease expires, or when a job ends (the pool that ends it claims next).
    """
    if dialect.fetchall(f"SELECT 1 FROM {CONTROL} WHERE queue = %s AND paused", (queue,)):
        return None
    admission = Admission.read(dialect, queue, now_ms, limits)
    accepted, held_back = _admit(dialect, admission, 1)
    if accepted:
        return now_ms
    later_due, lease_due = dialect.fetchall(
        f"SELECT (SELECT MIN(run_at_ms) FROM {JOB} WHERE queue = %s AND status = 'waiting' AND run_at_ms > %s),"
        f" (SELECT MIN(lease_expires_ms) FROM {JOB} WHERE queue = %s AND status = 'running')",
        (queue, now_ms, queue),
    )[0]
    times = [t for t in (admission.opens_at(held_back), lease_due, later_due) if t is not None]
    if held_back and not times:
        return None  # held back until a running job ends: that pool claims next
    return min(times) if times else None


def _record_starts(dialect: Dialect, admission: Admission, started: Sequence[Candidate]) -> None:
    """Log the starts of rate-limited jobs, and forget starts older than their window."""
    rows: list[tuple[str, int]] = []
    limits = admission.limits
    if limits.rate is not None:
        rows += [(queue_scope(admission.queue), admission.now_ms)] * len(started)
    periods: dict[str, int] = {}
    for job in started:
        if job.key is not None and job.rate is not None and job.period_ms is not None:
            scope = key_scope(admission.queue, job.key)
            rows.append((scope, admission.now_ms))
            periods[scope] = max(periods.get(scope, 0), job.period_ms)
    if limits.rate is not None:
        periods[queue_scope(admission.queue)] = limits.rate.period_ms
    if not rows:
        return
    for scope, period in periods.items():
        if 0 <= admission.now_ms - _pruned_at.get(scope, 0) < PRUNE_EVERY_MS:
            continue
        _pruned_at[scope] = admission.now_ms
        forget = admission.now_ms - period - FORGET_AFTER_MS
        dialect.execute(f"DELETE FROM {STARTS} WHERE scope = %s AND started_ms <= %s", (scope, forget))
    marks = ", ".join(["(%s, %s)"] * len(rows))
    dialect.execute(f"INSERT INTO {STARTS} (scope, started_ms) VALUES {marks}", [v for row in rows for v in row])


def has_limited_jobs(dialect: Dialect, queue: str) -> bool:
    """Whether ``queue`` holds a waiting or running job with a limit (one seek in ``durq_job_limited``).

    A job waits or runs exactly while ``finished_ms`` is NULL, which is what the index holds.
    """
    return bool(
        dialect.fetchall(
            f"SELECT 1 FROM {JOB} WHERE queue = %s AND limit_key IS NOT NULL AND finished_ms IS NULL LIMIT 1",
            (queue,),
        )
    )
