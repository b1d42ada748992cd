"""Per-enqueue options, and the rules every job option is checked by where it is given.

``@job`` and ``using()`` apply the same rules with the same messages, before any SQL runs, so a
refused option leaves a caller's transaction usable.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timedelta
from typing import Literal

from ..clock import seconds_to_ms
from .backoff import Backoff

# The widths of the columns these values are stored in (models.Job).
MAX_NAME_LENGTH = 200
MAX_QUEUE_LENGTH = 100
MAX_UNIQUE_LENGTH = 255
PRIORITY_RANGE = (-32768, 32767)

# What an enqueue does when its dedupe key is held by a waiting job (see enqueue.py): leave that
# job as it is, give it the new enqueue's arguments, priority and due time, or only its due time.
# A running job is never changed, whichever is asked.
OnDuplicate = Literal["keep", "replace", "reschedule"]
KEEP: OnDuplicate = "keep"
REPLACE: OnDuplicate = "replace"
RESCHEDULE: OnDuplicate = "reschedule"
ON_DUPLICATE: tuple[OnDuplicate, ...] = (KEEP, REPLACE, RESCHEDULE)


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """Per-enqueue options; ``None`` means "the definition's (or the settings') default"."""

    queue: str | None = None
    priority: int | None = None
    unique: str | None = None
    run_at: datetime | None = None
    run_in: timedelta | float | None = None
    max_attempts: int | None = None
    lease: timedelta | float | None = None
    timeout: timedelta | float | None = None
    on_duplicate: OnDuplicate | None = None
    # Not started by then, the job never runs: a duration from the enqueue, or an aware datetime.
    expires: timedelta | float | datetime | None = None

    def __post_init__(self) -> None:
        """Refuse a bad option where it is given, before any SQL, with the message ``@job`` gives."""
        if self.queue is not None:
            check_queue(self.queue)
        if self.priority is not None:
            check_priority(self.priority)
        if self.unique is not None:
            check_unique(self.unique)
        if self.run_at is not None:
            if not isinstance(self.run_at, datetime):
                raise TypeError(f"run_at must be an aware datetime, not {type(self.run_at).__name__}")
            if self.run_at.tzinfo is None or self.run_at.utcoffset() is None:
                raise ValueError("run_at must be an aware datetime (naive datetimes have no defined instant)")
        if self.run_in is not None:
            check_duration("run_in", self.run_in, allow_zero=True)
        if self.run_at is not None and self.run_in is not None:
            raise ValueError("pass run_at or run_in, not both")
        if self.max_attempts is not None:
            check_max_attempts(self.max_attempts)
        if self.lease is not None:
            check_lease(self.lease)
        if self.timeout is not None:
            check_duration("timeout", self.timeout)
        if self.on_duplicate is not None:
            check_on_duplicate(self.on_duplicate, self.unique)
        if self.expires is not None:
            check_expires(self.expires)


def check_handler_options(
    name: object,
    queue: object,
    priority: object,
    max_attempts: object,
    lease: object,
    timeout: object,
    backoff: object,
    cron: object,
    expires: object = None,
) -> None:
    """The options ``@job`` is given, checked with the rules and messages ``using()`` applies."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"job name {name!r} is not valid: a string of 1 to {MAX_NAME_LENGTH} characters")
    if queue is not None:
        check_queue(queue)
    check_priority(priority)
    if max_attempts is not None:
        check_max_attempts(max_attempts)
    if lease is not None:
        check_lease(lease)
    if timeout is not None:
        check_duration("timeout", timeout)
    if backoff is not None and not isinstance(backoff, Backoff):
        raise TypeError(f"backoff must be a django_durq.handlers.backoff.Backoff, not {type(backoff).__name__}")
    if cron is not None and not isinstance(cron, str):
        raise TypeError(f"cron must be a cron expression (str), not {type(cron).__name__}")
    if expires is not None:
        check_duration("expires", expires)  # a handler's expiry counts from each enqueue


def check_expires(expires: object) -> None:
    """A positive duration, or an aware datetime: when a job not started by then is dropped."""
    if isinstance(expires, datetime):
        if expires.tzinfo is None or expires.utcoffset() is None:
            raise ValueError("expires must be an aware datetime (naive datetimes have no defined instant)")
        return
    if isinstance(expires, bool) or not isinstance(expires, (int, float, timedelta)):
        raise TypeError(f"expires must be a timedelta, a number of seconds or an aware datetime, not {type(expires).__name__}")
    check_duration("expires", expires)


def check_queue(queue: object) -> None:
    if not isinstance(queue, str):
        raise TypeError(f"queue must be a queue name (str), not {type(queue).__name__}")
    if not queue or ":" in queue or len(queue) > MAX_QUEUE_LENGTH:
        raise ValueError(f"queue name {queue!r} is not valid: 1 to {MAX_QUEUE_LENGTH} characters, no ':'")


def check_priority(priority: object) -> None:
    low, high = PRIORITY_RANGE
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be a whole number from {low} to {high}, not {type(priority).__name__}")
    if not low <= priority <= high:
        raise ValueError(f"priority {priority} is out of range ({low} to {high})")


def check_unique(unique: object) -> None:
    if not isinstance(unique, str):
        raise TypeError(f"unique must be a string (the dedupe key), not {type(unique).__name__}")
    if not unique or len(unique) > MAX_UNIQUE_LENGTH:
        raise ValueError(f"unique must be a non-empty string of at most {MAX_UNIQUE_LENGTH} characters")


def check_on_duplicate(on_duplicate: object, unique: str | None) -> None:
    """One of ``ON_DUPLICATE``, and only with a dedupe key: without one there is no duplicate to act on."""
    if not isinstance(on_duplicate, str):
        raise TypeError(f"on_duplicate must be one of {', '.join(map(repr, ON_DUPLICATE))}, not {type(on_duplicate).__name__}")
    if on_duplicate not in ON_DUPLICATE:
        raise ValueError(f"on_duplicate {on_duplicate!r} is not one of {', '.join(map(repr, ON_DUPLICATE))}")
    if unique is None:
        raise ValueError(f"on_duplicate={on_duplicate!r} acts on a dedupe key: pass unique=... too")


def check_max_attempts(max_attempts: object) -> None:
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise TypeError(f"max_attempts must be a whole number of at least 1, not {type(max_attempts).__name__}")
    if max_attempts < 1:
        raise ValueError(f"max_attempts is {max_attempts}; it must be at least 1")


# The shortest lease a job may ask for. The lease keeper renews each lease three times per lease
# whatever HEARTBEAT_INTERVAL is, but a lease that has to be renewed every few milliseconds would
# keep the database busy and tell handlers to stop at every hiccup.
MIN_LEASE_S = 1.0


def check_lease(value: object) -> None:
    check_duration("lease", value)
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)  # type: ignore[arg-type]
    if seconds < MIN_LEASE_S:
        raise ValueError(f"lease is {value!r}; it must be at least {MIN_LEASE_S:g} second")


def check_duration(option: str, value: object, *, allow_zero: bool = False) -> None:
    """``value`` is a timedelta or a number of seconds, positive (or zero where ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)):
        raise TypeError(f"{option} must be a timedelta or a number of seconds, not {type(value).__name__}")
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"{option} is {value!r}; it must be a finite duration")
    if seconds < 0 or (seconds_to_ms(value) == 0 and not allow_zero):
        least = "zero or more" if allow_zero else "at least a millisecond"
        raise ValueError(f"{option} is {value!r}; it must be {least}")
