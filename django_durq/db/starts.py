"""The start log of rate limits (``durq_start``): one row per start of a rate-limited job, per scope.

A queue's rate counts the starts of scope ``q:<queue>``; a key's rate counts those of scope
``key:<key>``, whatever the queue and the job type that started them. A rate allows at most
``count`` starts in any window of its period ending now, on the database's clock: no boundary
between two fixed windows lets twice the rate through, and hosts whose clocks disagree count
the same starts.

- **Counting reads at most ``count`` rows.** A claim reads, per scope, only its newest starts, as
  many as the largest count of a rate it checks there: the window is full exactly when the
  ``count``-th newest start lies inside it, and it opens when that start leaves it.
- **The log is kept as long as its longest window.** Each row carries ``period_ms``: the longest
  window counted on its scope when it was written (the period of the limit that started it, of
  every other rate the writing claim checked on the scope, and the one the scope's newest row
  carried). A scope's rows are deleted only once they are older than the period its newest row
  carries, plus ``FORGET_AFTER_MS``: a ``10/s`` job sharing a key with a ``2/h`` job does not
  delete the starts the hourly window still counts.
"""

from __future__ import annotations

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
    """What a claim read of one scope: its newest starts, newest first, and how long the scope keeps them."""

    depth: int  # how many of the newest starts were asked for
    newest: list[int] = field(default_factory=list)
    keep_ms: int = 0  # the period the scope's newest row carries

    def starts_with(self, taken: int, now_ms: int) -> list[int]:
        """The newest starts, newest first, with ``taken`` starts of the claim in progress at ``now_ms``."""
        return sorted([now_ms] * taken + self.newest, reverse=True)

    def full(self, taken: int, now_ms: int, count: int, period_ms: int) -> bool:
        """Whether ``count`` starts (those taken now included) lie in the window of ``period_ms`` ending now."""
        starts = self.starts_with(taken, now_ms)
        return len(starts) >= count and starts[count - 1] > now_ms - period_ms

    def in_window(self, taken: int, now_ms: int, period_ms: int) -> int:
        """Starts in the window ending now, counted as far as ``depth`` reaches."""
        return sum(1 for started in self.starts_with(taken, now_ms) if started > now_ms - period_ms)

    def opens_at(self, taken: int, now_ms: int, count: int, period_ms: int) -> int | None:
        """When the window next lets one more start; None when it does now."""
        if not self.full(taken, now_ms, count, period_ms):
            return None
        return self.starts_with(taken, now_ms)[count - 1] + period_ms


def read(dialect: Dialect, depths: Mapping[str, int]) -> dict[str, ScopeLog]:
    """The newest starts of each scope, as many as ``depths`` asks for it, in one statement."""
    if not depths:
        return {}
    scopes = sorted(depths)
    # One subquery per scope, each an index range read backwards that stops after ``depth`` rows.
    parts = [
        f"SELECT * FROM (SELECT scope, started_ms, period_ms FROM {STARTS} WHERE scope = %s"
        f" ORDER BY started_ms DESC LIMIT %s) AS s{n}"
        for n in range(len(scopes))
    ]
    params: list[object] = [value for scope in scopes for value in (scope, depths[scope])]
    found: dict[str, list[tuple[int, int]]] = {scope: [] for scope in scopes}
    for scope, started, period in dialect.fetchall(" UNION ALL ".join(parts), params):
        found[scope].append((int(started), int(period or 0)))
    logs = {}
    for scope, rows in found.items():
        rows.sort(reverse=True)
        logs[scope] = ScopeLog(depths[scope], [started for started, _ in rows], rows[0][1] if rows else 0)
    return logs


def record(dialect: Dialect, now_ms: int, started: Iterable[tuple[str, int]], keep_ms: Mapping[str, int]) -> None:
    """Log one start at ``now_ms`` per (scope, period) in ``started``, and forget what no window counts any more.

    ``keep_ms``: per scope, the longest window the claim counted there (its newest row's period
    included); each new row carries it on.
    """
    rows = list(started)
    if not rows:
        return
    keep = dict(keep_ms)
    for scope, period in rows:
        keep[scope] = max(keep.get(scope, 0), period)
    for scope in sorted({scope for scope, _ in rows}):
        kept_ms = keep[scope]
        if 0 <= now_ms - _pruned_at.get(scope, 0) < PRUNE_EVERY_MS:
            continue
        _pruned_at[scope] = now_ms
        forget = now_ms - kept_ms - FORGET_AFTER_MS
        dialect.execute(f"DELETE FROM {STARTS} WHERE scope = %s AND started_ms <= %s", (scope, forget))
    marks = ", ".join(["(%s, %s, %s)"] * len(rows))
    params = [value for scope, _ in rows for value in (scope, now_ms, keep[scope])]
    dialect.execute(f"INSERT INTO {STARTS} (scope, started_ms, period_ms) VALUES {marks}", params)
