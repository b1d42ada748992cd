"""Time for the whole queue: integer epoch milliseconds from one injectable clock.

Only :class:`SystemClock` reads the wall clock. Everything else is handed ``now_ms``
so leases, backoff and schedules are tested by moving a :class:`ManualClock`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to; thread-safe."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now

    def advance(self, ms: int | float | timedelta) -> int:
        with self._lock:
            self._now += to_ms(ms)
            return self._now

    def set(self, now_ms: int) -> None:
        with self._lock:
            self._now = now_ms


_current: Clock = SystemClock()


def now_ms() -> int:
    return _current.now_ms()


def get_clock() -> Clock:
    return _current


@contextlib.contextmanager
def use_clock(clock: Clock) -> Iterator[Clock]:
    """Make ``clock`` the process-wide clock for the duration of the block."""
    global _current
    previous, _current = _current, clock
    try:
        yield clock
    finally:
        _current = previous


def to_ms(value: int | float | timedelta) -> int:
    """Milliseconds from a timedelta, or from a number of milliseconds."""
    if isinstance(value, timedelta):
        return round(value.total_seconds() * 1000)
    return round(value)


def seconds_to_ms(value: int | float | timedelta) -> int:
    """Milliseconds from a timedelta, or from a number of seconds (as settings give them)."""
    if isinstance(value, timedelta):
        return round(value.total_seconds() * 1000)
    return round(value * 1000)


def datetime_to_ms(value: datetime) -> int:
    if value.tzinfo is None:
        raise ValueError("run_at must be an aware datetime (naive datetimes have no defined instant)")
    return round(value.timestamp() * 1000)


def ms_to_datetime(value: int | None) -> datetime | None:
    if value is None:
        return None
    return datetime.fromtimestamp(value / 1000, tz=UTC)
