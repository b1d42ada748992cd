"""Flow-control declarations: how many jobs of a key may run at once, and how many may start per period.

A :class:`Limit` on ``@job`` is evaluated at enqueue: its ``key`` (the job's name when not given)
and its numbers are stored on the row, so every worker enforces the same limit whatever code it
runs, and an older worker that knows nothing of limits cannot be confused by them. The claim
enforces them (``db/flow.py``), counting the places of running handlers and recent starts, with
one scope per key across every queue and job type: a handler holds its place until its thread
ends, a dead worker's place frees once its process is known to have ended, and only the worker
holding a place frees it.

Per-queue limits (``DURQ["QUEUES"][name]["max_running"]`` and ``["rate"]``) are settings.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .options import MAX_UNIQUE_LENGTH

_UNITS_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smhd])\s*$")
# A window longer than this would keep too many start rows to count at each claim.
MAX_PERIOD_MS = 86_400_000


@dataclass(frozen=True)
class Rate:
    """At most ``count`` starts in any window of ``period_ms`` (a sliding window: no burst at its edges)."""

    count: int
    period_ms: int

    @classmethod
    def parse(cls, value: object, label: str = "rate") -> Rate:
        """``"50/m"``, ``"3/s"``, ``"10/5m"``, ``"1000/h"``, ``"1/d"``; a ``Rate`` passes through."""
        if isinstance(value, Rate):
            return value
        if not isinstance(value, str):
            raise TypeError(f'{label} must be a string like "50/m" (50 starts a minute), not {type(value).__name__}')
        match = _RATE.match(value)
        if match is None:
            raise ValueError(f'{label} {value!r} is not a rate: write "<count>/<period>", as "50/m", "3/s" or "10/5m"')
        count, multiple, unit = int(match[1]), int(match[2] or 1), match[3]
        period_ms = multiple * _UNITS_MS[unit]
        if count < 1 or multiple < 1:
            raise ValueError(f"{label} {value!r} must allow at least 1 start in a period of at least 1{unit}")
        if period_ms > MAX_PERIOD_MS:
            raise ValueError(f"{label} {value!r} has a period over a day; use a count per day at most")
        return cls(count, period_ms)

    def __str__(self) -> str:
        for unit, unit_ms in sorted(_UNITS_MS.items(), key=lambda item: -item[1]):
            if self.period_ms % unit_ms == 0:
                multiple = self.period_ms // unit_ms
                return f"{self.count}/{multiple if multiple > 1 else ''}{unit}"
        return f"{self.count}/{self.period_ms}ms"  # pragma: no cover - every parsed period is whole seconds


@dataclass(frozen=True)
class QueueLimits:
    """A queue's own limits from ``DURQ["QUEUES"]``: running jobs and starts, across every worker."""

    max_running: int | None = None
    rate: Rate | None = None

    @property
    def any(self) -> bool:
        return self.max_running is not None or self.rate is not None


def check_max_running(value: object, label: str = "max_running") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{label} must be a whole number of at least 1, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{label} is {value}; it must be at least 1 (pause the queue to run none)")
    return value


class Limit:
    """Limits on one job type, per key: ``@job(limit=Limit(max_running=1, key=lambda video_id: video_id))``.

    ``key`` takes the job's arguments (not the context) and returns the key (str or int); jobs
    with equal keys, of any type, count together. Without ``key`` the limit is per job type.
    ``max_running``: at most this many run at once across every worker. ``rate``: at most
    ``"N/period"`` start in any sliding window of that period.
    """

    def __init__(
        self,
        *,
        max_running: int | None = None,
        rate: str | Rate | None = None,
        key: Callable[..., str | int] | None = None,
    ) -> None:
        if max_running is None and rate is None:
            raise ValueError("a Limit needs max_running, rate or both")
        self.max_running = check_max_running(max_running) if max_running is not None else None
        self.rate = Rate.parse(rate) if rate is not None else None
        if key is not None and not callable(key):
            raise TypeError(f"key must be a function of the job's arguments, not {type(key).__name__}")
        self.key = key

    def __repr__(self) -> str:
        parts = [f"max_running={self.max_running}"] if self.max_running is not None else []
        if self.rate is not None:
            parts.append(f"rate={str(self.rate)!r}")
        return f"Limit({', '.join(parts)})"

    def columns(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The row's flow-control columns for one enqueue of job ``name``; a bad key raises here."""
        key: object = name
        if self.key is not None:
            key = self.key(*args, **kwargs)
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                raise TypeError(f"the limit key of job {name!r} must be a str or int, not {type(key).__name__}")
            key = str(key)
        if not key or len(str(key)) > MAX_UNIQUE_LENGTH:
            raise ValueError(f"the limit key of job {name!r} must be 1 to {MAX_UNIQUE_LENGTH} characters, not {key!r}")
        return {
            "limit_key": str(key),
            "limit_running": self.max_running,
            "limit_rate": self.rate.count if self.rate else None,
            "limit_period_ms": self.rate.period_ms if self.rate else None,
        }
