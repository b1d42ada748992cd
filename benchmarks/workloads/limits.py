"""Workload 10, limits: what flow control costs a drain, limits on against limits off, in the same run.

Each variant drains the same number of no-op jobs with one ``durq_worker`` at concurrency 4:

- ``off``: plain jobs, no limit anywhere (the fast claim);
- ``per_key``: every job carries ``Limit(max_running=1)`` on one of 1,000 keys, so keys are
  plentiful and the limit never holds a job back: the drain measures what enforcing it costs;
- ``queue_cap``: the queue has ``max_running`` of 100,000, never reached;
- ``queue_rate``: the queue has a rate of 1,000,000 a second, never reached (every start logged);
- ``rate_held``: the queue has a rate of ``HELD_RATE`` a second, which holds the drain back all
  along: what it measures is the rate delivered, against the rate configured.

Repeats go round the variants in turn, so a change in the machine's load weighs on each alike;
each variant's jobs/s is also reported as a ratio to ``off`` of the same repeat.
"""

from __future__ import annotations

import time
from typing import Any

from ..adapters import Adapter
from ..core import procs
from ..core.session import Session
from . import drain

NAME = "limits"
CONCURRENCY = 4
# The rate of ``rate_held``: with the default 5,000 jobs, five windows' worth.
HELD_RATE = 1_000
VARIANTS: dict[str, dict[str, str]] = {
    "off": {},
    "per_key": {"BENCH_DURQ_JOB": "keyed"},
    "queue_cap": {"BENCH_DURQ_MAX_RUNNING": "100000"},
    "queue_rate": {"BENCH_DURQ_RATE": "1000000/s"},
    "rate_held": {"BENCH_DURQ_RATE": f"{HELD_RATE}/s"},
}


def applies(adapter: Adapter, database: str) -> bool:
    return adapter.name == "durq" and database in ("sqlite", "postgres", "mysql")


def run(session: Session, adapter: Adapter, database: str) -> None:
    options = session.options
    jobs = options.jobs
    for repeat in range(options.repeats):
        baseline: float | None = None
        for variant in VARIANTS:
            load = procs.loadavg()
            t0 = time.monotonic()
            label = f"limits-{variant}-r{repeat}"
            metrics = drain_variant(session, adapter, database, variant, jobs, label)
            rate = metrics.get("jobs_per_s")
            if variant == "off":
                baseline = rate
            elif variant != "rate_held" and rate and baseline:
                metrics["ratio_to_off"] = rate / baseline
            params = {"jobs": jobs, "concurrency": CONCURRENCY, "variant": variant}
            session.record(NAME, adapter, database, params, repeat, metrics, load)
            session.say(
                f"  limits {variant:<10} #{repeat + 1}: {_fmt(rate)} jobs/s"
                f"{_ratio(metrics)}, cpu {_fmt(metrics.get('cpu_ms_per_job'), 3)} ms/job, load {load[0]:.2f}"
                f"{' ERROR' if 'error' in metrics else ''} ({time.monotonic() - t0:.0f} s)"
            )
            if "error" in metrics:
                session.say(metrics["error"][-1500:])


def drain_variant(
    session: Session, adapter: Adapter, database: str, variant: str, jobs: int, label: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """One variant's drain on a fresh database (``env``: settings both sides share); for ``rate_held``,
    the rate delivered too."""
    starts: list[float] = []
    variant_env = (env or {}) | VARIANTS[variant]
    metrics = drain.drain_once(session, adapter, database, jobs, CONCURRENCY, label, env=variant_env, starts=starts)
    if variant == "rate_held" and "error" not in metrics:
        metrics.update(_delivered(starts))
    return metrics


def _delivered(starts: list[float]) -> dict[str, Any]:
    """The rate a held-back drain delivered: ``HELD_RATE`` over the mean time from a start to the one
    ``HELD_RATE`` starts later (a second, for a limiter that starts held jobs as their window opens).
    """
    gaps = [later - earlier for earlier, later in zip(starts, starts[HELD_RATE:], strict=False)]
    if not gaps:
        return {"configured_per_s": HELD_RATE}
    return {"configured_per_s": HELD_RATE, "delivered_per_s": HELD_RATE / (sum(gaps) / len(gaps))}


def _ratio(metrics: dict[str, Any]) -> str:
    if "configured_per_s" in metrics:
        return f" (delivered {_fmt(metrics.get('delivered_per_s'))}/s of {metrics['configured_per_s']:,}/s)"
    ratio = metrics.get("ratio_to_off")
    return "" if ratio is None else f" ({ratio:.2f}× off)"


def _fmt(value: Any, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
