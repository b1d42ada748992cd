"""Cron expressions: validation and due times, as pure functions of (expression, time zone, after_ms).

Expressions are evaluated by `cronsim`_, which matches Debian cron, including how it treats
daylight-saving changes: a job at a fixed local time (minute and hour fields both given) whose
time is skipped when clocks go forward runs at the first moment after the gap, and one whose
time repeats when clocks go back runs only at the first occurrence. Jobs with a ``*`` minute or
hour run by elapsed time instead, so ``*/30 * * * *`` runs 50 times on a 25-hour day.

Whatever the zone and whichever pass of a repeated hour ``after_ms`` falls in, the due time
returned is strictly after it, and it is the one a search from any earlier moment would reach:
due times never come back and none is stepped over.

Two forms are accepted: five fields (``minute hour day-of-month month day-of-week``) and six,
with seconds first (``*/15 * * * * *``), plus the aliases in :data:`ALIASES`.

.. _cronsim: https://pypi.org/project/cronsim/
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from datetime import timezone as fixed_offset
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


class CronError(ValueError):
    """An expression or time zone that cannot be evaluated, or one that never comes due."""


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name`` ("Europe/Berlin", "UTC"); :class:`CronError` if there is none."""
    if not isinstance(name, str) or not name or name != name.strip():
        raise CronError(f"time zone {name!r} is not an IANA time zone name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as error:
        raise CronError(f"time zone {name!r} is not an IANA time zone name") from error


def fields(expression: str) -> list[str]:
    """The five or six fields of ``expression``, aliases expanded; :class:`CronError` otherwise."""
    if not isinstance(expression, str):
        raise CronError(f"cron expression {expression!r} is not a string")
    text = ALIASES.get(expression.strip().lower(), expression)
    parts = text.split()
    if len(parts) not in (5, 6):
        raise CronError(f"cron expression {expression!r} has {len(parts)} fields; expected 5, or 6 with seconds first")
    return parts


def problem(expression: str, timezone: str = "UTC", now_ms: int = 0) -> str | None:
    """Why ``expression`` in ``timezone`` cannot be scheduled after ``now_ms``, or None when it can."""
    try:
        next_due_ms(expression, timezone, now_ms)
    except CronError as error:
        return str(error)
    return None


def next_due_ms(expression: str, timezone: str, after_ms: int) -> int:
    """The first due time strictly after ``after_ms``, in epoch ms (always a whole second)."""
    parts = fields(expression)
    tz = zone(timezone)
    if len(parts) == 6 and _fixed_time(parts[1:]):
        return _next_with_seconds(parts, tz, after_ms)
    return _next(" ".join(parts), tz, after_ms, expression)


def due_times(expression: str, timezone: str, after_ms: int, until_ms: int) -> Iterator[int]:
    """Every due time in ``(after_ms, until_ms]``, in order."""
    due = next_due_ms(expression, timezone, after_ms)
    while due <= until_ms:
        yield due
        due = next_due_ms(expression, timezone, due)


def describe(expression: str) -> str:
    """A short English reading of ``expression`` ("Every fifth minute"), or the expression itself."""
    try:
        return CronSim(" ".join(fields(expression)), datetime(2000, 1, 1, tzinfo=UTC)).explain()
    except Exception:  # noqa: BLE001 - the description is a courtesy; the expression is checked elsewhere
        return str(expression)


def _fixed_time(five: list[str]) -> bool:
    # The test Debian cron (and cronsim) use to decide that a job runs at a fixed local time.
    return not five[0].startswith("*") and not five[1].startswith("*")


def _next(expression: str, tz: ZoneInfo, after_ms: int, original: str) -> int:
    try:
        parts = expression.split()
        if len(parts) == 5 and _fixed_time(parts):
            return _next_wall_clock(expression, tz, after_ms)
        return _next_elapsed(expression, tz, after_ms)
    except CronSimError as error:
        raise CronError(f"cron expression {original!r} is not valid: {error}") from error
    except StopIteration:
        raise CronError(f"cron expression {original!r} never comes due") from None


def _next_wall_clock(expression: str, tz: ZoneInfo, after_ms: int) -> int:
    # For a fixed local time cronsim searches wall-clock time and answers with the first pass of
    # a repeated hour; searching from inside the second pass, that answer lies in the past (it is
    # the occurrence that already ran), so the search goes on from there until it passes
    # ``after_ms``. It starts a minute early: a time skipped by a gap that ends within a minute
    # (zones left their local mean time by odd seconds) runs at the first whole minute after it,
    # which a search from inside that minute would otherwise step over.
    start = datetime.fromtimestamp(after_ms // 1000 - 60, tz)
    while True:
        due = next(CronSim(expression, start))
        if due.timestamp() * 1000 > after_ms:
            return int(due.timestamp()) * 1000
        start = due


def _next_elapsed(expression: str, tz: ZoneInfo, after_ms: int) -> int:
    # A due time is an instant whose local time, in the offset in force at that instant, matches.
    # cronsim steps hours in the zone itself and can step over an hour that an offset change of
    # 30 or 45 minutes cuts short, so the search runs in one fixed offset at a time: a due time
    # found before the offset next changes is the answer; otherwise it starts again at the change.
    start_s = after_ms // 1000
    while True:
        offset = _offset(tz, start_s + 1)
        due_s = int(next(CronSim(expression, datetime.fromtimestamp(start_s, fixed_offset(offset)))).timestamp())
        change = _offset_change(tz, start_s + 1, due_s)
        if change is None:
            return due_s * 1000
        start_s = change - 1


def _offset(tz: ZoneInfo, epoch_s: int) -> timedelta:
    return datetime.fromtimestamp(epoch_s, tz).utcoffset() or timedelta(0)


def _offset_change(tz: ZoneInfo, first_s: int, last_s: int) -> int | None:
    """The first second in ``[first_s, last_s]`` whose UTC offset differs from ``first_s``'s, or None.

    It looks every six hours, then narrows down: no zone has changed its offset and back within six hours.
    """
    offset = _offset(tz, first_s)
    low = first_s
    while low < last_s:
        high = min(low + 6 * 3600, last_s)
        if _offset(tz, high) != offset:
            while high - low > 1:
                middle = (low + high) // 2
                if _offset(tz, middle) == offset:
                    low = middle
                else:
                    high = middle
            return high
        low = high
    return None


def _next_with_seconds(parts: list[str], tz: ZoneInfo, after_ms: int) -> int:
    # cronsim applies the daylight-saving rules above to five-field expressions only. For six
    # fields at a fixed local time, the minutes come from the five-field part (so they follow
    # those rules) and the seconds field picks seconds within each such minute.
    seconds = _seconds(parts[0], " ".join(parts))
    # Start just before the local minute holding ``after_ms`` (not the UTC one: some zones were
    # once offset by odd seconds): some of its seconds may still be ahead.
    minute_start = after_ms // 1000 * 1000 - datetime.fromtimestamp(after_ms // 1000, tz).second * 1000
    minute = _next(" ".join(parts[1:]), tz, minute_start - 1_000, " ".join(parts))
    for _ in range(3):
        for second in seconds:
            due = minute + second * 1000
            if due > after_ms:
                return due
        minute = _next(" ".join(parts[1:]), tz, minute, " ".join(parts))
    raise CronError(f"cron expression {' '.join(parts)!r} never comes due")  # pragma: no cover - seconds is non-empty


@functools.lru_cache(maxsize=256)
def _seconds(field: str, original: str) -> tuple[int, ...]:
    """The seconds a seconds field selects, read from cronsim by iterating one minute."""
    start = datetime(2000, 1, 1, tzinfo=UTC) - timedelta(seconds=1)
    try:
        ticks = CronSim(f"{field} * * * * *", start)
        found: list[int] = []
        for due in ticks:
            if due.minute != 0:
                break
            found.append(due.second)
    except CronSimError as error:
        raise CronError(f"cron expression {original!r} is not valid: {error}") from error
    if not found:
        raise CronError(f"cron expression {original!r} is not valid: no second matches")
    return tuple(found)
