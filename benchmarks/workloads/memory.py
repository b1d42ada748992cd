"""Workload 4, memory: RSS of every worker process while it drains many jobs at concurrency 4.

Reports the peak, and the RSS after 1,000 jobs against after all of them: a worker that keeps
something per job grows between the two. django-durq drains ``--memory-jobs`` (100,000);
peers drain a fifth of that, enough to show their footprint without an hour-long run of the
slowest. The RSS-over-time series is kept for the chart.
"""

from __future__ import annotations

from typing import Any

from ..adapters import Adapter
from ..core import procs
from ..core.session import Session
from . import drain

NAME = "memory"
CONCURRENCY = 4
EARLY = 1000


def applies(adapter: Adapter, database: str) -> bool:
    return database != "mysql"


def run(session: Session, adapter: Adapter, database: str) -> None:
    jobs = session.options.memory_jobs if adapter.name == "durq" else max(session.options.memory_jobs // 5, 2000)
    repeats = max(1, session.options.repeats // 3)
    for repeat in range(repeats):
        load = procs.loadavg()
        metrics = drain.drain_once(
            session, adapter, database, jobs, CONCURRENCY, f"memory-r{repeat}", sample_interval_s=0.1, series_points=300
        )
        metrics.update(growth(metrics.get("series", [])))
        session.record(NAME, adapter, database, {"jobs": jobs, "concurrency": CONCURRENCY}, repeat, metrics, load)
        session.say(
            f"  memory #{repeat + 1}: RSS after {EARLY:,} jobs {metrics.get('rss_early_mb', 0):.1f} MB, after {jobs:,} "
            f"{metrics.get('rss_end_mb', 0):.1f} MB ({metrics.get('rss_growth_percent', 0):+.1f}%), "
            f"peak {metrics.get('peak_rss_mb', 0):.1f} MB in {metrics.get('processes', 0)} process(es)"
            f"{' ERROR' if 'error' in metrics else ''}"
        )


def growth(series: list[list[float]]) -> dict[str, Any]:
    early = next((point[2] for point in series if point[1] >= EARLY), None)
    end = series[-1][2] if series else None
    if early is None or end is None:
        return {}
    return {"rss_early_mb": early, "rss_end_mb": end, "rss_growth_percent": (end - early) / early * 100}
