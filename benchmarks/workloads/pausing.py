"""Workload 12, pausing: how long a pause and a resume take to act on a running worker.

- Resume: the queue is paused with 200 due jobs and an idle worker (concurrency 4) that has
  looked and gone to sleep; the latency is from the resume's commit to the first job's start.
- Pause: the worker drains a backlog of no-op jobs; the latency is from the pause's commit to the
  last job that starts after it (jobs already claimed ahead may still start: ``PREFETCH``).
"""

from __future__ import annotations

import time
from typing import Any

from ..adapters import Adapter
from ..core import procs, ticks
from ..core.session import Session
from . import drain

NAME = "pausing"
CONCURRENCY = 4
RESUME_JOBS = 200
PAUSE_BACKLOG = 50_000


def applies(adapter: Adapter, database: str) -> bool:
    return adapter.name == "durq" and database in ("sqlite", "postgres", "mysql")


def run(session: Session, adapter: Adapter, database: str) -> None:
    for repeat in range(session.options.repeats):
        load = procs.loadavg()
        resumed = resume_latency(session, adapter, database, repeat)
        session.record(NAME, adapter, database, {"variant": "resume", "jobs": RESUME_JOBS}, repeat, resumed, load)
        paused = pause_latency(session, adapter, database, repeat)
        session.record(NAME, adapter, database, {"variant": "pause", "jobs": PAUSE_BACKLOG}, repeat, paused, load)
        session.say(
            f"  pausing #{repeat + 1}: resume acts after {_fmt(resumed.get('latency_ms'), 1)} ms,"
            f" pause after {_fmt(paused.get('latency_ms'), 1)} ms ({paused.get('started_after', '-')} jobs started after it),"
            f" load {load[0]:.2f}{' ERROR' if 'error' in resumed or 'error' in paused else ''}"
        )
        for metrics in (resumed, paused):
            if "error" in metrics:
                session.say(metrics["error"][-1500:])


def resume_latency(session: Session, adapter: Adapter, database: str, repeat: int) -> dict[str, Any]:
    with session.fresh_database(adapter, database, f"pausing-resume-r{repeat}") as db:
        session.agent(adapter, db, "durq-switch", "--pause")
        drain.enqueue(session, adapter, db, RESUME_JOBS)
        tick_file = session.ticks_file(f"{adapter.name}-pausing-resume-r{repeat}")
        group = session.start_workers(adapter, db, CONCURRENCY, tick_file)
        try:
            time.sleep(3.0)  # started, probed, asleep
            if ticks.count(tick_file):
                return {"error": "a job of the paused queue ran"}
            resumed = session.agent(adapter, db, "durq-switch")["committed_at"]
            finished = ticks.wait_for(tick_file, RESUME_JOBS, timeout_s=60, alive=group.alive)
        finally:
            group.stop()
        starts = sorted(t for _, t in ticks.read(tick_file))
        if not finished or not starts:
            return {"error": f"{len(starts)} of {RESUME_JOBS} jobs ran after the resume; log tail:\n{group.log_tail()}"}
        return {"latency_ms": (starts[0] - resumed) * 1000}


def pause_latency(session: Session, adapter: Adapter, database: str, repeat: int) -> dict[str, Any]:
    with session.fresh_database(adapter, database, f"pausing-pause-r{repeat}") as db:
        drain.enqueue(session, adapter, db, PAUSE_BACKLOG)
        tick_file = session.ticks_file(f"{adapter.name}-pausing-pause-r{repeat}")
        group = session.start_workers(adapter, db, CONCURRENCY, tick_file)
        try:
            ticks.wait_for(tick_file, 2_000, timeout_s=60, alive=group.alive)  # draining at full speed
            paused = session.agent(adapter, db, "durq-switch", "--pause")["committed_at"]
            time.sleep(2.0)
        finally:
            group.stop()
        starts = sorted(t for _, t in ticks.read(tick_file))
        after = [t for t in starts if t > paused]
        if len(starts) >= PAUSE_BACKLOG:
            return {"error": "the backlog ran out before the pause"}
        return {"latency_ms": ((after[-1] - paused) * 1000) if after else 0.0, "started_after": len(after)}


def _fmt(value: Any, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
