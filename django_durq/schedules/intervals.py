"""Interval schedules ("every 45 minutes"): their length, their text, and their due times.

An interval's due times lie on a grid: the first one a whole interval after the schedule was
declared (on a whole second), each next one a whole interval after the one before. A pass that
comes late takes the due time it finds and the grid goes on from it, so runs never drift later
and later however late the passes come; after downtime, the missed due times follow the
schedule's ``missed`` policy as a cron schedule's do. Time zones play no part: an interval is
elapsed time.
"""

from __future__ import annotations

import math
from datetime import timedelta

_UNITS = (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))


class IntervalError(ValueError):
    """An interval that is not a whole number of seconds of at least one."""


def interval_ms(every: object) -> int:
    """``every`` (a timedelta or a number of seconds) in milliseconds; :class:`IntervalError` otherwise."""
    if isinstance(every, bool) or not isinstance(every, (int, float, timedelta)):
        raise IntervalError(f"every={every!r} is not an interval: give a timedelta or a number of seconds")
    seconds = every.total_seconds() if isinstance(every, timedelta) else float(every)
    if not math.isfinite(seconds) or seconds < 1 or seconds != int(seconds):
        raise IntervalError(f"every={every!r} is not a whole number of seconds of at least one")
    return int(seconds) * 1000


def text(every_ms: int) -> str:
    """How a schedule of this interval is shown and stored: ``every 45m``, ``every 1h30m``, ``every 1d5s``."""
    left = every_ms // 1000
    parts = []
    for unit, seconds in _UNITS:
        count, left = divmod(left, seconds)
        if count:
            parts.append(f"{count}{unit}")
    return "every " + "".join(parts)


def next_due_ms(every_ms: int, after_ms: int, on_grid_ms: int | None = None) -> int:
    """The first due time strictly after ``after_ms``: on the grid through ``on_grid_ms`` (a due time
    of the schedule), or, for a schedule with none yet, one interval after ``after_ms`` on a whole second."""
    if on_grid_ms is None:
        return -(-(after_ms + every_ms) // 1000) * 1000
    return on_grid_ms + ((after_ms - on_grid_ms) // every_ms + 1) * every_ms
