"""Workload 11, workflows: a fan-out of N no-op jobs with one fan-in callback, against N plain jobs, same run.

Both drain with one ``durq_worker`` at concurrency 4 on a fresh database. For the fan-out, the
whole workflow (N members, the callback, N edges) is queued in one transaction before the worker
starts. Reported: members per second and CPU per member against plain jobs (what counting each
member's end costs), and the callback's latency: from the last member's start (they do nothing,
so that is when it ended) to the callback's start.
"""

from __future__ import annotations

import time
from typing import Any

from ..adapters import Adapter
from ..core import databases, procs, ticks
from ..core.session import Session
from . import drain

NAME = "workflows"
CONCURRENCY = 4
MEMBERS = 10_000
CALLBACK_TICK = -1  # bench_durq.jobs.CALLBACK_TICK


def applies(adapter: Adapter, database: str) -> bool:
    return adapter.name == "durq" and database in ("sqlite", "postgres", "mysql")


def run(session: Session, adapter: Adapter, database: str) -> None:
    members = 2_000 if session.options.quick else MEMBERS
    for repeat in range(session.options.repeats):
        load = procs.loadavg()
        plain = drain.drain_once(session, adapter, database, members, CONCURRENCY, f"workflows-plain-r{repeat}")
        session.record(NAME, adapter, database, {"jobs": members, "variant": "plain"}, repeat, plain, load)
        t0 = time.monotonic()
        fanout = fan_out(session, adapter, database, members, repeat)
        if plain.get("jobs_per_s") and fanout.get("jobs_per_s"):
            fanout["time_per_member_ratio"] = plain["jobs_per_s"] / fanout["jobs_per_s"]
        if plain.get("cpu_ms_per_job") and fanout.get("cpu_ms_per_job"):
            fanout["cpu_per_member_ratio"] = fanout["cpu_ms_per_job"] / plain["cpu_ms_per_job"]
        session.record(NAME, adapter, database, {"jobs": members, "variant": "fan_out"}, repeat, fanout, load)
        time_ratio, cpu_ratio = _fmt(fanout.get("time_per_member_ratio"), 2), _fmt(fanout.get("cpu_per_member_ratio"), 2)
        session.say(
            f"  workflows #{repeat + 1}: plain {_fmt(plain.get('jobs_per_s'))} jobs/s, fan-out {_fmt(fanout.get('jobs_per_s'))}"
            f" members/s ({time_ratio}× the time, {cpu_ratio}× the CPU per job), callback"
            f" {_fmt(fanout.get('callback_latency_ms'), 1)} ms after the last member,"
            f" load {load[0]:.2f}{' ERROR' if 'error' in fanout else ''} ({time.monotonic() - t0:.0f} s)"
        )
        if "error" in fanout:
            session.say(fanout["error"][-1500:])


def fan_out(session: Session, adapter: Adapter, database: str, members: int, repeat: int) -> dict[str, Any]:
    with session.fresh_database(adapter, database, f"workflows-fanout-r{repeat}") as db:
        queued = session.agent(adapter, db, "durq-workflow", "--n", str(members), timeout_s=3600)
        databases.analyze(db)
        tick_file = session.ticks_file(f"{adapter.name}-workflows-r{repeat}")
        group = session.start_workers(adapter, db, CONCURRENCY, tick_file)
        group.start_sampling()
        try:
            finished = ticks.wait_for(tick_file, members + 1, timeout_s=120 + members / 20, alive=group.alive)
            cpu = group.cpu_seconds()
        finally:
            group.stop_sampling()
            group.stop()
        records = ticks.read(tick_file)
        member_starts = sorted(t for number, t in records if number != CALLBACK_TICK)
        callbacks = [t for number, t in records if number == CALLBACK_TICK]
        metrics: dict[str, Any] = {
            "enqueue_s": queued["seconds"],
            "done": len(member_starts),
            "callbacks": len(callbacks),
            "cpu_ms_per_job": cpu * 1000 / max(len(member_starts), 1),
        }
        if len(member_starts) >= 2:
            metrics["jobs_per_s"] = (len(member_starts) - 1) / (member_starts[-1] - member_starts[0])
        if callbacks and member_starts:
            metrics["callback_latency_ms"] = (callbacks[0] - member_starts[-1]) * 1000
        if not finished or len(callbacks) != 1:
            metrics["error"] = f"{len(member_starts)} members and {len(callbacks)} callbacks ran; log tail:\n{group.log_tail()}"
        return metrics


def _fmt(value: Any, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
