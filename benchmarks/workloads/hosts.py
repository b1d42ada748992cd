"""Workload 3b, hosts: django-durq on MariaDB with the producer as on another host.

An enqueue rings the bell of an idle worker on its own host; a job enqueued on another host is
found only by the worker's watcher, which reads the newest job ids every 25 ms for a second after
it saw a job and less and less often after, down to once a second. The producer here gets a
temporary directory of its own, so it cannot ring the worker's bell, as on another host.

- ``busy``: 200 jobs 20 ms apart, as in the latency workload: the watcher's fast reads.
- ``quiet``: 10 jobs 8 s apart, the worker idle for 8 s before the first: every job comes after
  the watcher has slowed to its idle interval, so the figures show the bound after a quiet spell.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..adapters import Adapter
from ..core import procs
from ..core.session import Session
from . import latency

NAME = "hosts"
VARIANTS = {"busy": (latency.JOBS, latency.GAP_MS), "quiet": (10, 8000)}


def applies(adapter: Adapter, database: str) -> bool:
    return adapter.name == "durq" and database == "mysql"


def run(session: Session, adapter: Adapter, database: str) -> None:
    for variant, (jobs, gap_ms) in VARIANTS.items():
        for repeat in range(session.options.repeats):
            elsewhere = Path(session.work) / session.next_tag("other-host-tmp")
            elsewhere.mkdir()
            load = procs.loadavg()
            metrics = measure(session, adapter, database, repeat, elsewhere, jobs, gap_ms)
            session.record(NAME, adapter, database, {"variant": variant, "jobs": jobs, "gap_ms": gap_ms}, repeat, metrics, load)
            session.say(
                f"  {variant}, producer on another host #{repeat + 1}: p50 {_ms(metrics.get('p50_ms'))}"
                f" p99 {_ms(metrics.get('p99_ms'))} max {_ms(metrics.get('max_ms'))}{' ERROR' if 'error' in metrics else ''}"
            )


def measure(
    session: Session, adapter: Adapter, database: str, repeat: int, elsewhere: Path, jobs: int, gap_ms: int
) -> dict[str, Any]:
    settle_s = max(2.0, gap_ms / 1000)
    producer_env = {"TMPDIR": str(elsewhere)}
    return latency.measure(session, adapter, database, repeat, False, producer_env, jobs=jobs, gap_ms=gap_ms, settle_s=settle_s)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"
