"""Workload 5, scale: django-durq with a big table against an empty one.

"loaded": 1,000,000 finished and dead rows (90% / 10%) and 100,000 delayed jobs are put in
``durq_job`` straight in SQL (then ANALYZE, as autovacuum would) before the waiting jobs are
queued. Measured on both: the median of one claim of 4 jobs, of the fenced completion of those
4 and of the idle probe; the drain rate at concurrency 4; and the render time of the admin's job
list and dead-letter page, at 1,000 rows (empty variant) and 1,000,000 (loaded).
"""

from __future__ import annotations

from typing import Any

from ..adapters import Adapter
from ..core import databases, procs
from ..core.session import Session
from . import drain

NAME = "scale"
CONCURRENCY = 4
CLAIMS = 300
BATCH = 4


def applies(adapter: Adapter, database: str) -> bool:
    return adapter.name == "durq"


def run(session: Session, adapter: Adapter, database: str) -> None:
    rows = session.options.scale_rows
    jobs = session.options.jobs
    for variant in ("empty", "loaded"):
        for repeat in range(max(1, session.options.repeats // 3)):
            load = procs.loadavg()
            metrics = measure(session, adapter, database, variant, rows, jobs, repeat)
            params = {"variant": variant, "rows": rows if variant == "loaded" else 0, "jobs": jobs}
            session.record(NAME, adapter, database, params, repeat, metrics, load)
            admin = metrics.get("admin") or {}
            changelist = (admin.get("changelist") or {}).get("ms")
            dead = (admin.get("dead_letters") or {}).get("ms")
            session.say(
                f"  scale {variant} #{repeat + 1}: claim {metrics.get('claim_ms', 0):.2f} ms, "
                f"complete {metrics.get('complete_ms', 0):.2f} ms, probe {metrics.get('probe_ms', 0):.2f} ms, "
                f"drain {metrics.get('jobs_per_s') or 0:,.0f} jobs/s, admin list "
                f"{'-' if changelist is None else f'{changelist:.0f} ms'}, dead letters "
                f"{'-' if dead is None else f'{dead:.0f} ms'}{' ERROR' if 'error' in metrics else ''}"
            )


def measure(session: Session, adapter: Adapter, database: str, variant: str, rows: int, jobs: int, repeat: int) -> dict[str, Any]:
    def before(db: databases.Database) -> dict[str, Any]:
        result: dict[str, Any] = {}
        if variant == "loaded":
            dead = rows // 10
            fill = session.agent(
                adapter, db, "durq-fill", "--finished", str(rows - dead), "--dead", str(dead), "--delayed", str(rows // 10)
            )
            result["fill_seconds"] = fill["seconds"]
        # Jobs for the claim measurement come on top of those the worker drains.
        drain.enqueue(session, adapter, db, CLAIMS * BATCH, start=10_000_000)
        result.update(session.agent(adapter, db, "durq-claim-cost", "--n", str(CLAIMS), "--batch", str(BATCH)))
        return result

    def after(db: databases.Database) -> dict[str, Any]:
        if variant == "empty":
            session.agent(adapter, db, "durq-fill", "--finished", "900", "--dead", "100")
        return {"admin": session.agent(adapter, db, "admin-render", "--repeats", "5")}

    return drain.drain_once(session, adapter, database, jobs, CONCURRENCY, f"scale-{variant}-r{repeat}", before, after)
