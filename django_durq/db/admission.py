"""What may start now under limits: the admission of one limited claim (or of the idle probe).

It reads the queue's due jobs in claim order and admits each whose limits have room, counting:

- places (``db/places.py``), one per running handler: per key across every queue and job type
  against the job's own ``max_running``, and per queue against the queue's ``max_running``;
- starts (``db/starts.py``) in the window of each rate ending now: per key across every queue,
  and per queue;
- the jobs this claim has admitted so far.

A job that may not start is held back, its attempts unspent and its place in the order kept,
and the read goes on past it: a key at its limit never holds back other keys, and a job held
back by its own limit (its rate, its ``max_running``) never holds back another job type of its
key that carries other limits. Later rounds of the read leave out jobs held back for the same
reason, so a key with many jobs waiting costs one round, not a round per job.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from . import places, starts
from .rows import JOB
from .starts import ScopeLog, key_scope, queue_scope

if TYPE_CHECKING:
    from ..handlers.limits import QueueLimits
    from .base import Dialect

# How many rounds of candidates one claim reads at most while skipping jobs it may not start.
ROUNDS = 8
# Candidates read in the first round beyond those the claim wants: some may belong to keys at
# their limit. Keys known to be full are left out by the read itself, and a round that admits too
# few reads on, so the first round reads little more than it admits: reading twice as many, as
# every claim once did, was rows read and candidates judged for nothing where keys are plenty.
SLACK = 16

_COLUMNS = "id, limit_key, limit_running, limit_rate, limit_period_ms"


class Candidate(NamedTuple):
    """A job a claim may admit, as its read returned it (a tuple: a claim builds hundreds per batch)."""

    id: int
    key: str | None
    max_running: int | None
    rate: int | None
    period_ms: int | None

    @property
    def own_rate(self) -> tuple[str, int, int] | None:
        """(key, count, period) of the job's own rate, counted on its key's start log; None without one."""
        if self.key is None or self.rate is None or self.period_ms is None:
            return None
        return self.key, self.rate, self.period_ms


class Admission:
    """Places and starts counted for one claim of ``queue``, and the jobs admitted so far.

    A claim builds it once it holds its turns (``db/gates.py``), so what it counts cannot grow
    under it (running rows and starts are added only by claims holding the same turns, and a place
    row only for a handler whose row is still counted, or in the step that ends it); the idle probe
    builds one without turns, as an estimate that locks nothing.
    """

    def __init__(self, dialect: Dialect, queue: str, now_ms: int, limits: QueueLimits) -> None:
        self.dialect = dialect
        self.queue = queue
        self.now_ms = now_ms
        self.limits = limits
        # Places are counted once per claim: while it holds its turns only handlers that end can
        # change them, by ending their rows or freeing places, so the count is never below the truth.
        self.queue_running, self.key_running = places.counts(dialect, queue, now_ms)  # per key: every queue
        self.logs: dict[str, ScopeLog] = {}
        self.periods: dict[str, int] = {}  # per scope, the longest window checked there
        if limits.rate is not None:
            self._read_logs({queue_scope(queue): (limits.rate.count, limits.rate.period_ms)})
            self.periods[queue_scope(queue)] = limits.rate.period_ms
        self.taken: dict[str, int] = defaultdict(int)  # jobs admitted per key
        self.taken_starts: dict[str, int] = defaultdict(int)  # starts this claim will log, per key scope
        self.taken_total = 0
        self.held_back: list[Candidate] = []
        # Keys whose places (with those taken) may fill a job's own max_running: the read passes
        # over those jobs of theirs, so a busy key's waiting jobs cost no round.
        self._full_keys: set[str] = set(self.key_running)
        self._full_rates: set[tuple[str, int, int]] = set()  # (key, rate, period) whose window is full

    # --- counting -------------------------------------------------------------------------------

    def queue_room(self) -> int | None:
        """How many more jobs the queue's own limits let start now; None when it has none."""
        if self.limits.max_running is None and self.limits.rate is None:
            return None
        rooms = []
        if self.limits.max_running is not None:
            rooms.append(self.limits.max_running - self.queue_running - self.taken_total)
        if self.limits.rate is not None:
            started = self.logs[queue_scope(self.queue)].in_window(self.taken_total, self.now_ms, self.limits.rate.period_ms)
            rooms.append(self.limits.rate.count - started)
        return max(0, min(rooms)) if rooms else None

    def _running_full(self, candidate: Candidate) -> bool:
        key, at_most = candidate.key, candidate.max_running
        return key is not None and at_most is not None and self.key_running.get(key, 0) + self.taken[key] >= at_most

    def _rate_full(self, candidate: Candidate) -> bool:
        if candidate.own_rate is None:
            return False
        key, count, period_ms = candidate.own_rate
        return self.logs[key_scope(key)].full(self.taken_starts[key], self.now_ms, count, period_ms)

    def admits(self, candidate: Candidate) -> bool:
        """Whether ``candidate``'s own limits (its key's running places and start window) have room."""
        return not self._running_full(candidate) and not self._rate_full(candidate)

    def take(self, candidate: Candidate) -> None:
        if candidate.key is not None:
            self.taken[candidate.key] += 1
        if candidate.own_rate is not None:
            self.taken_starts[candidate.own_rate[0]] += 1
        self.taken_total += 1

    def opens_at(self) -> int | None:
        """When a rate window next lets a held-back job (or the queue) start; None if no rate holds them back."""
        times: list[int] = []
        rate = self.limits.rate
        if rate is not None:
            opens = self.logs[queue_scope(self.queue)].opens_at(self.taken_total, self.now_ms, rate.count, rate.period_ms)
            if opens is not None:
                times.append(opens)
        for candidate in self.held_back:
            if candidate.own_rate is not None:
                key, count, period_ms = candidate.own_rate
                opens = self.logs[key_scope(key)].opens_at(self.taken_starts[key], self.now_ms, count, period_ms)
                if opens is not None:
                    times.append(opens)
        return min(times) if times else None

    # --- reading ----------------------------------------------------------------------------------

    def admit(self, limit: int) -> list[Candidate]:
        """Pick up to ``limit`` jobs the limits let start, in claim order; the rest read are ``held_back``."""
        accepted: list[Candidate] = []
        seen: set[int] = set()
        for round_ in range(ROUNDS):
            room = self.queue_room()
            want = limit - len(accepted) if room is None else min(limit - len(accepted), room)
            if want <= 0:
                break
            # Each round reads further than the last: where one key's jobs come in a block, a
            # round's read finds a few keys that fill at once, and the next must look further.
            count = (want + SLACK) * (round_ + 1)
            # Jobs whose lease expired are claimed again first (their worker is gone or cut off).
            rows = self._candidates(count, seen, expired=True) if round_ == 0 else []
            rows += self._candidates(count, seen, expired=False)
            if not rows:
                break
            self._meet(rows)
            for candidate in rows:
                if len(accepted) == limit:
                    break  # the claim is full: the rest were neither admitted nor held back
                seen.add(candidate.id)
                if self.queue_room() != 0 and self.admits(candidate):
                    self.take(candidate)
                    accepted.append(candidate)
                    continue
                self.held_back.append(candidate)
                if candidate.key is not None and self._running_full(candidate):
                    self._full_keys.add(candidate.key)
                if candidate.own_rate is not None and self._rate_full(candidate):
                    self._full_rates.add(candidate.own_rate)
        return accepted

    def _meet(self, candidates: Sequence[Candidate]) -> None:
        """Read the start logs of the rates met for the first time (or deeper, or further back)."""
        wants: dict[str, tuple[int, int]] = {}
        for candidate in candidates:
            if candidate.own_rate is None:
                continue
            key, count, period_ms = candidate.own_rate
            scope = key_scope(key)
            self.periods[scope] = max(self.periods.get(scope, 0), period_ms)
            known = self.logs.get(scope)
            if known is None or not known.covers(count, period_ms):
                depth, longest_ms = wants.get(scope, (known.depth, known.period_ms) if known is not None else (0, 0))
                wants[scope] = (max(depth, count), max(longest_ms, period_ms))
        self._read_logs(wants)

    def _read_logs(self, wants: dict[str, tuple[int, int]]) -> None:
        self.logs.update(starts.read(self.dialect, self.now_ms, wants))

    def _candidates(self, count: int, seen: set[int], *, expired: bool) -> list[Candidate]:
        """Jobs of the queue that could start, in claim order, leaving out those held back for a known reason."""
        params: list[Any] = [self.queue, self.now_ms]
        if expired:
            where = "status = 'running' AND lease_expires_ms <= %s AND attempts < max_attempts"
            order = "lease_expires_ms"
        else:
            where = "status = 'waiting' AND run_at_ms <= %s"
            order = "priority DESC, run_at_ms, id"
        by_count: dict[int, list[str]] = defaultdict(list)
        for key in sorted(self._full_keys):
            by_count[self.key_running.get(key, 0) + self.taken[key]].append(key)
        for held, keys in sorted(by_count.items()):
            # Those of these keys whose own max_running the keys' places and this claim's jobs fill.
            marks = ", ".join(["%s"] * len(keys))
            where += f" AND NOT (COALESCE(limit_key, '') IN ({marks}) AND COALESCE(limit_running, 0) BETWEEN 1 AND %s)"
            params += [*keys, held]
        for key, rate, period_ms in sorted(self._full_rates):
            # Those of the key with this very rate, whose window is full.
            where += " AND NOT (COALESCE(limit_key, '') = %s AND COALESCE(limit_rate, 0) = %s"
            where += " AND COALESCE(limit_period_ms, 0) = %s)"
            params += [key, rate, period_ms]
        if seen:
            where += f" AND id NOT IN ({', '.join(['%s'] * len(seen))})"
            params += sorted(seen)
        hint = "" if expired else f" {self.dialect.claim_index_hint}"
        rows = self.dialect.fetchall(
            f"SELECT {_COLUMNS} FROM {JOB}{hint} WHERE queue = %s AND {where} ORDER BY {order} LIMIT %s",
            [*params, count],
        )
        return [Candidate._make(row) for row in rows]

    # --- what the claim leaves behind ---------------------------------------------------------

    def record_starts(self, started: Sequence[Candidate]) -> None:
        """Log the starts of the claimed jobs that a rate counts, and forget what no window counts any more."""
        rows: list[tuple[str, int]] = []
        if self.limits.rate is not None:
            rows += [(queue_scope(self.queue), self.limits.rate.period_ms)] * len(started)
        rows += [(key_scope(c.own_rate[0]), c.own_rate[2]) for c in started if c.own_rate is not None]
        keep = {scope: max(period, self.logs[scope].keep_ms) for scope, period in self.periods.items() if scope in self.logs}
        starts.record(self.dialect, self.now_ms, rows, keep)
