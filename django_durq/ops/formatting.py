"""Times and durations as the admin and the ``durq`` command show them."""

from __future__ import annotations

from django.utils import timezone
from django.utils.dateformat import format as date_format

from ..clock import ms_to_datetime


def local_time(ms: int | None) -> str:
    """An epoch-ms time as a date and time in Django's current time zone, to the second."""
    moment = ms_to_datetime(ms)
    if moment is None:
        return "-"
    return date_format(timezone.localtime(moment), "Y-m-d H:i:s T")


def format_age(ms: int | None) -> str:
    """A duration in its two largest units: ``3 min 12 s``, ``2 h 5 min``."""
    if ms is None:
        return "-"
    seconds = int(ms // 1000)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if seconds >= size:
            rest = (seconds % size) // sub_size
            return f"{seconds // size} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{seconds} s" if seconds else f"{int(ms)} ms"
