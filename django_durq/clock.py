"""Time for the whole queue: integer epoch milliseconds from one injectable clock.

Only :class:`SystemClock` reads the wall clock. Everything else is handed ``now_ms``
so leases, backoff and schedules are tested by moving a :class:`ManualClock`.

Lease expiry, due times and cron compare times written by different hosts, so on PostgreSQL
and MariaDB every process reads the *database server's* clock: :class:`ServerClock` measures
it once in a while and counts forward on this host's monotonic clock, so neither a host whose
wall clock is off nor a step of that clock (NTP) moves the queue's timeline. SQLite is used on
one host only, whose clock all processes share. Reading the server needs the dialects:
:func:`~django_durq.db.clock.database_clock` does, and ``apps.py`` hands it in as the default.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
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


class ServerClock:
    """The database server's clock: measured every ``refresh_s`` seconds, counted on the monotonic clock between.

    ``read_server_ms`` returns the server's time in epoch milliseconds (a fraction carries the
    microseconds), or None where there is no other host to agree with (SQLite): then this is
    ``base``. A measurement is placed at the middle of its round trip, so it is off by at most
    half the round trip (``uncertainty_ms``); the monotonic clock then drifts from the server's by
    what NTP slews, a few ms a minute at most. When the server cannot be read, the last
    measurement goes on counting.
    """

    READINGS = 3

    def __init__(self, read_server_ms: Callable[[], float | None], base: Clock | None = None, refresh_s: float = 30.0) -> None:
        self._read = read_server_ms
        self.base = base or SystemClock()
        self.refresh_s = refresh_s
        self.uncertainty_ms = 0.0
        self.offset_ms = 0  # the server's clock minus this host's, at the last measurement
        self._anchor: tuple[float, int] | None = None  # (server ms, monotonic ns) of the last measurement
        self._measured_ns = 0
        self._measured_once = False
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        # Read for every job a worker claims, starts and finishes: one monotonic read when no measurement is due.
        mono_ns = time.monotonic_ns()
        if not self._measured_once or mono_ns - self._measured_ns > self.refresh_s * 1e9:
            self.measure(quiet=True)
            mono_ns = time.monotonic_ns()
        anchor = self._anchor
        if anchor is None:
            return self.base.now_ms()
        return int(anchor[0] + (mono_ns - anchor[1]) / 1_000_000)

    def measure(self, quiet: bool = False) -> None:
        """Read the server's clock now; with ``quiet``, a failure keeps the last measurement.

        Of ``READINGS`` readings the one with the shortest round trip is kept: a reading is placed
        at the middle of its round trip, and the first may also have opened the connection (a few
        milliseconds in which the server's time was read only at the end), which would put this
        process's clock ahead of every other's by half of that.
        """
        with self._lock:
            self._measured_ns = time.monotonic_ns()
            self._measured_once = True
            best: tuple[int, float, int] | None = None  # (round trip ns, server ms, middle ns)
            for _ in range(self.READINGS):
                before = time.monotonic_ns()
                try:
                    server = self._read()
                except Exception:
                    if quiet:
                        return
                    raise
                after = time.monotonic_ns()
                if server is None:
                    self._anchor = None
                    return
                if best is None or after - before < best[0]:
                    best = (after - before, server, (before + after) // 2)
            assert best is not None
            round_trip, server, middle = best
            self._anchor = (server, middle)
            self.uncertainty_ms = round_trip / 2e6
            self.offset_ms = round(server - self.base.now_ms() + (time.monotonic_ns() - middle) / 1_000_000)


class ShiftedClock:
    """``base`` moved by a fixed offset: a host whose wall clock is off, for tests and drills."""

    def __init__(self, offset_ms: int, base: Clock | None = None) -> None:
        self.offset_ms = offset_ms
        self.base = base or SystemClock()

    def now_ms(self) -> int:
        return self.base.now_ms() + self.offset_ms


class CappedClock:
    """``base``, never read past ``until_ms``: a bound a caller must not cross, however late it reads."""

    def __init__(self, base: Clock, until_ms: int) -> None:
        self.base = base
        self.until_ms = until_ms

    def now_ms(self) -> int:
        return min(self.base.now_ms(), self.until_ms)


_current: Clock | None = None
# What the process-wide clock is unless set: the database's timeline (``db/clock.py``), handed in by
# ``apps.py`` once Django's apps are loaded, since reading it needs the dialects, a layer above.
_default: Callable[[], Clock] | None = None


def now_ms() -> int:
    return get_clock().now_ms()


def get_clock() -> Clock:
    """The process-wide clock: the database's timeline unless a test or an embedder set another."""
    global _current
    if _current is None:
        if _default is None:
            return SystemClock()  # before app loading handed the database's timeline in; not kept
        _current = _default()
    return _current


def set_default_clock(make: Callable[[], Clock]) -> None:
    """Make ``make()`` the process-wide clock whenever none is set (``apps.py``: the database's)."""
    global _default
    _default = make


def set_clock(clock: Clock | None) -> None:
    """Make ``clock`` the process-wide clock (None: back to the database's timeline)."""
    global _current
    _current = clock


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
