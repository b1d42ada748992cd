"""The queue's monotonic totals: counters and histograms per queue and job type (see ``db/counters.py``)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ..db import counters
from .reading import alias_of


@dataclass
class Histogram:
    buckets: list[tuple[str, int]]  # (upper bound in seconds, observations up to it), cumulative, ending with +Inf
    count: int
    sum_s: float


@dataclass
class Totals:
    """Every count of one queue and job type since the queue's first job: they only grow."""

    queue: str
    job_name: str
    counts: dict[str, int] = field(default_factory=dict)  # counters.COUNTERS, each present
    histograms: dict[str, Histogram] = field(default_factory=dict)  # counters.HISTOGRAMS, each present


def totals(*, using: str | None = None) -> list[Totals]:
    """Per (queue, job type) that ever counted anything, every counter and histogram, zeros included.

    One read of the summed rows, so every value is of one moment: a count that has been folded
    (``counters.fold``) is read either before or after, never both or neither.
    """
    raw: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for queue, name, metric, value in counters.totals(alias_of(using)):
        raw[(queue, name)][metric] = value
    result = []
    for (queue, name), values in sorted(raw.items()):
        entry = Totals(queue, name, {metric: values.get(metric, 0) for metric in counters.COUNTERS})
        for histogram in counters.HISTOGRAMS:
            running = 0
            buckets = []
            for bound in [f"{bound:g}" for bound in counters.BUCKETS_S] + [counters.INF]:
                running += values.get(f"{histogram}_le:{bound}", 0)
                buckets.append((bound, running))
            entry.histograms[histogram] = Histogram(buckets, running, values.get(f"{histogram}_sum_ms", 0) / 1000)
        result.append(entry)
    return result
