"""The start log of rate limits (``durq_start``): the starts of rate-limited jobs, per scope.

A queue's rate counts the starts of scope ``q:<queue>``; a key's rate counts those of scope
``key:<key>``, whatever the queue and the job type that started them. A rate allows at most
``count`` starts in any window of its period ending now, on the database's clock: no boundary
between two fixed windows lets twice the rate through, and hosts whose clocks disagree count
the same starts.

- **One row per claim and scope.** A claim logs the starts it admits on a scope as one row that
  carries how many they are (``starts``): all started at the claim's one instant. A queue rate
  that lets thousands of jobs a second through thus costs one row per claim to write and to read
  back, not one per job.
- **Counting reads at most ``count`` rows.** A claim reads, per scope, only its newest rows in
  the window, as many as the largest count of a rate it checks there (each row holds at least one
  start): the window is full exactly when the ``count``-th newest start lies inside it, and it
  opens when that start leaves it.
- **The log is kept as long as its longest window.** Each row carries ``period_ms``: the longest
  window counted on its scope when it was written (the period of the limit that started it, of
  every other rate the writing claim checked on the scope, and the one the scope's newest row
  carried). A scope's rows are deleted only once they are older than the period its newest row
  carries, plus ``FORGET_AFTER_MS``: a ``10/s`` job sharing a key with a ``2/h`` job does not
  delete the starts the hourly window still counts.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Dialect

STARTS = "durq_start"
# Starts are forgotten this long after their window has passed, not at once: a claimer whose
# clock reads a little behind another's still counts every start inside its own window.
FORGET_AFTER_MS = 60_000
# A claimer deletes forgotten starts of a scope at most this often, not at every claim.
PRUNE_EVERY_MS = 10_000
_pruned_at: dict[str, int] = {}  # scope -> when this process last deleted its forgotten starts


def queue_scope(queue: str) -> str:
    return f"q:{queue}"


def key_scope(key: str) -> str:
    return f"key:{key}"


@dataclass
class ScopeLog:
    """What a claim read of one scope: its newest starts in a window, and how long the scope keeps them."""

    depth: int  # the most rows read: the largest count of a rate checked on the scope
    period_ms: int  # how far back they were read: the longest window checked on the scope
    ascending: list[int] = field(default_factory=list)  # the times of the rows read, oldest first
    # Starts logged before each row read: ``before[i]`` counts those of ``ascending[:i]``; one more
    # entry at the end holds them all.
    before: list[int] = field(default_factory=lambda: [0])
    keep_ms: int = 0  # the period the scope's newest row carries

    def add(self, rows: list[tuple[int, int]]) -> None:
        """Take the rows read, each (time, starts), in any order."""
        for started, count in sorted(rows):
            self.ascending.append(started)
            self.before.append(self.before[-1] + count)

    def covers(self, count: int, period_ms: int) -> bool:
        """Whether what was read answers for a rate of ``count`` per ``period_ms``."""
        return count <= self.depth and period_ms <= self.period_ms

    def _after(self, ms: int) -> int:
        """Starts logged later than ``ms``."""
        return self.before[-1] - self.before[bisect_right(self.ascending, ms)]

    def _nth_newest_logged(self, n: int) -> int | None:
        """The time of the ``n``-th newest start logged (1: the newest); None if fewer were read."""
        total = self.before[-1]
        if n > total:
            return None
        # The row holding it: the last whose starts and those logged after it reach ``n``.
        return self.ascending[bisect_right(self.before, total - n) - 1]

    def in_window(self, taken: int, now_ms: int, period_ms: int) -> int:
        """Starts in the window of ``period_ms`` ending now (``taken`` now by the claim in progress included)."""
        return taken + self._after(now_ms - period_ms)

    def nth_newest(self, taken: int, now_ms: int, n: int) -> int | None:
        """The ``n``-th newest start (1: the newest), ``taken`` starts at ``now_ms`` counted in; None if fewer."""
        later = self._after(now_ms)  # logged by a clock ahead of this one
        if n <= later:
            return self._nth_newest_logged(n)
        if n <= later + taken:
            return now_ms
        return self._nth_newest_logged(n - taken)

    def full(self, taken: int, now_ms: int, count: int, period_ms: int) -> bool:
        """Whether ``count`` starts (those taken now included) lie in the window of ``period_ms`` ending now."""
        return self.in_window(taken, now_ms, period_ms) >= count

    def opens_at(self, taken: int, now_ms: int, count: int, period_ms: int) -> int | None:
        """When the window next lets one more start: when the ``count``-th newest leaves it; None when it does now."""
        if not self.full(taken, now_ms, count, period_ms):
            return None
        started = self.nth_newest(taken, now_ms, count)
        return None if started is None else started + period_ms


def read(dialect: Dialect, now_ms: int, wants: Mapping[str, tuple[int, int]]) -> dict[str, ScopeLog]:
    """Per scope, its newest starts within ``(depth, period_ms)`` of ``wants``, and its newest row's period.

    One statement: per scope, an index range read backwards that stops after ``depth`` rows of
    the window, and a read of its newest row, however old, which carries how long it is kept.
    """
    if not wants:
        return {}
    scopes = sorted(wants)
    parts: list[str] = []
    params: list[object] = []
    for n, scope in enumerate(scopes):
        depth, period_ms = wants[scope]
        parts.append(
            f"SELECT * FROM (SELECT scope, started_ms, period_ms, starts, 1 AS newest FROM {STARTS} WHERE scope = %s"
            f" ORDER BY started_ms DESC LIMIT 1) AS n{n}"
        )
        parts.append(
            f"SELECT * FROM (SELECT scope, started_ms, period_ms, starts, 0 AS newest FROM {STARTS} WHERE scope = %s"
            f" AND started_ms > %s ORDER BY started_ms DESC LIMIT %s) AS w{n}"
        )
        params += [scope, scope, now_ms - period_ms, depth]
    logs = {scope: ScopeLog(*wants[scope]) for scope in scopes}
    in_window: dict[str, list[tuple[int, int]]] = {scope: [] for scope in scopes}
    for scope, started, period, count, newest in dialect.fetchall(" UNION ALL ".join(parts), params):
        if newest:
            logs[scope].keep_ms = int(period or 0)
        else:
            in_window[scope].append((int(started), int(count)))
    for scope, rows in in_window.items():
        logs[scope].add(rows)
    return logs


def record(dialect: Dialect, now_ms: int, started: Iterable[tuple[str, int]], keep_ms: Mapping[str, int]) -> None:
    """Log one start at ``now_ms`` per (scope, period) in ``started``, and forget what no window counts any more.

    One row per scope holds its starts of this claim. ``keep_ms``: per scope, the longest window
    the claim counted there (its newest row's period included); each new row carries it on.
    """
    keep = dict(keep_ms)
    counts: dict[str, int] = {}
    for scope, period in started:
        keep[scope] = max(keep.get(scope, 0), period)
        counts[scope] = counts.get(scope, 0) + 1
    if not counts:
        return
    scopes = sorted(counts)
    for scope in scopes:
        if 0 <= now_ms - _pruned_at.get(scope, 0) < PRUNE_EVERY_MS:
            continue
        _pruned_at[scope] = now_ms
        forget = now_ms - keep[scope] - FORGET_AFTER_MS
        dialect.execute(f"DELETE FROM {STARTS} WHERE scope = %s AND started_ms <= %s", (scope, forget))
    marks = ", ".join(["(%s, %s, %s, %s)"] * len(scopes))
    params = [value for scope in scopes for value in (scope, now_ms, keep[scope], counts[scope])]
    dialect.execute(f"INSERT INTO {STARTS} (scope, started_ms, period_ms, starts) VALUES {marks}", params)
