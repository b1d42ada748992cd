"""Medians, ranges and percentiles of small samples."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """Median, min and max of the values that are not None, and how many there were."""
    present = [value for value in values if value is not None]
    if not present:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(present), "min": min(present), "max": max(present), "n": len(present)}


def distribution_ms(seconds: Sequence[float]) -> dict[str, float | None]:
    """p50 / p90 / p99 / max of durations given in seconds, in milliseconds."""
    millis = [value * 1000 for value in seconds]
    return {
        "p50_ms": percentile(millis, 50),
        "p90_ms": percentile(millis, 90),
        "p99_ms": percentile(millis, 99),
        "max_ms": max(millis) if millis else None,
    }
