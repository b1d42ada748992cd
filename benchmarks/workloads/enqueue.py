"""Workload 1, enqueue: N no-op jobs from one process, one call and one transaction each, then in bulk.

The process is started fresh on a fresh database; one warm-up enqueue (connection, imports)
is left out of the timing. "Bulk" is each system's own bulk call where it has one, otherwise
the loop a user would write (inside one transaction for a database queue).

A single enqueue is one commit, so its rate follows the disk's flush rate, which drifts by 10%
and more over a few minutes on a shared machine. The repeats are therefore interleaved: each
round measures every system once, back to back, so a drift hits all of them alike.
"""

from __future__ import annotations

from ..adapters import Adapter
from ..core import procs
from ..core.session import Session

NAME = "enqueue"
MODES = ("single", "bulk")
INTERLEAVED = True


def applies(adapter: Adapter, database: str) -> bool:
    return True


def run(session: Session, adapter: Adapter, database: str, repeat: int) -> None:
    jobs = session.options.jobs
    for mode in MODES:
        with session.fresh_database(adapter, database, f"enqueue-{mode}-r{repeat}") as db:
            load = procs.loadavg()
            metrics = session.agent(adapter, db, "enqueue", "--n", str(jobs), "--mode", mode, "--warmup")
        session.record(NAME, adapter, database, {"jobs": jobs, "mode": mode}, repeat, metrics, load)
        session.say(f"  enqueue {mode} #{repeat + 1}: {metrics['jobs_per_s']:,.0f} jobs/s ({metrics['method']})")
