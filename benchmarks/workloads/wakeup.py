"""Where the milliseconds from an enqueue to its handler's start go, job by job. Not in a default run.

The latency workload's set-up (an idle worker at concurrency 4, 200 jobs enqueued 20 ms apart by
another process, Django's default connection settings), with the worker recording its statements
(``sites/bench_durq/anatomy.py``) and the producer the moment each enqueue call began. For each job:

- ``enqueue``: the producer's call, from its start to its return (the INSERT and its commit);
- ``to claim``: from the call's return to the moment the dispatcher sent the claim that took the
  job (the wake-up: NOTIFY, a bell or a watcher's read, then the dispatcher's turn; negative when
  the wake-up arrived before the producer heard its commit confirmed);
- ``claim``: the claim statement, sent to answered (with its transaction on SQLite and MariaDB);
- ``to start``: from the claim's answer to the handler's start (the attempt entered, a slot woken).

Their sum from the call's return is the latency workload's figure; from the call's start, what
the caller of ``enqueue()`` waits in all.
"""

from __future__ import annotations

import bisect
import json
import os
import time
from typing import Any

from ..adapters import Adapter
from ..core import procs, stats, ticks
from ..core.session import Session
from . import anatomy, latency

NAME = "wakeup"
JOBS = 200


def applies(adapter: Adapter, database: str) -> bool:
    return adapter.name == "durq"


def run(session: Session, adapter: Adapter, database: str) -> None:
    for repeat in range(session.options.repeats):
        load = procs.loadavg()
        metrics = measure(session, adapter, database, repeat)
        session.record(NAME, adapter, database, {"jobs": JOBS, "gap_ms": latency.GAP_MS}, repeat, metrics, load)
        if "error" in metrics:
            session.say(f"  {metrics['error'][-1500:]}")
            continue
        parts = ", ".join(f"{name} {figures['p50_ms']:.2f}/{figures['p99_ms']:.2f}" for name, figures in metrics["parts"].items())
        session.say(f"  #{repeat + 1} (load {load[0]:.2f}) p50/p99 ms: {parts}")


def measure(session: Session, adapter: Adapter, database: str, repeat: int) -> dict[str, Any]:
    env = {"BENCH_DURQ_PG_DEFAULTS": os.environ.get("BENCH_DURQ_PG_DEFAULTS", "1")}
    with session.fresh_database(adapter, database, f"wakeup-r{repeat}") as db:
        tick_file = session.ticks_file(f"{adapter.name}-wakeup")
        record = session.work / f"{session.next_tag('wakeup')}-{database}.json"
        group = session.start_workers(adapter, db, latency.CONCURRENCY, tick_file, extra_env=env | {"BENCH_ANATOMY": str(record)})
        try:
            session.agent(adapter, db, "enqueue", "--n", "1", "--start", "-1", extra_env=env)
            if not ticks.wait_for(tick_file, 1, timeout_s=120, alive=group.alive):
                return {"error": "the worker never ran the warm-up job:\n" + group.log_tail()}
            time.sleep(2.0)
            commits_file = session.work / f"{session.next_tag('commits')}.json"
            calls_file = commits_file.with_suffix(".calls.json")
            args = ["latency", "--n", str(JOBS), "--gap-ms", str(latency.GAP_MS), "--out", str(commits_file)]
            session.agent(adapter, db, *args, "--calls-out", str(calls_file), extra_env=env)
            ticks.wait_for(tick_file, JOBS + 1, timeout_s=60, alive=group.alive)
        finally:
            group.stop()
        if not record.exists():
            return {"error": "the worker wrote no record:\n" + group.log_tail()}
        returned = dict(json.loads(commits_file.read_text()))
        called = dict(json.loads(calls_file.read_text()))
        started = {number: t for number, t in ticks.read(tick_file) if number >= 0}
        claims = _claims(json.loads(record.read_text())["statements"])
        return parts(called, returned, started, claims)


def _claims(recorded: list[list[Any]]) -> list[tuple[float, float]]:
    """(sent, answered) of every claim the dispatcher made, in order of sending."""
    found = []
    for moment, thread, source, sql, wall_ns, _ in recorded:
        if anatomy.role(thread) == "dispatcher" and source == "django" and anatomy.kind(anatomy.shape(sql)).startswith("claim"):
            found.append((moment, moment + wall_ns / 1e9))
    return sorted(found)


def parts(
    called: dict[int, float], returned: dict[int, float], started: dict[int, float], claims: list[tuple[float, float]]
) -> dict[str, Any]:
    """Each job's time split at the claim that took it: the last claim answered before its handler started."""
    answered = [end for _, end in claims]
    split: dict[str, list[float]] = {"enqueue": [], "to claim": [], "claim": [], "to start": [], "latency": [], "from call": []}
    for number, start in started.items():
        if number not in returned or number not in called:
            continue
        index = bisect.bisect_right(answered, start) - 1
        if index < 0:
            continue
        sent, done = claims[index]
        if sent < called[number]:
            continue  # not a claim made for this job (it was taken by an earlier, slower one)
        split["enqueue"].append(returned[number] - called[number])
        split["to claim"].append(sent - returned[number])
        split["claim"].append(done - sent)
        split["to start"].append(start - done)
        split["latency"].append(start - returned[number])
        split["from call"].append(start - called[number])
    return {"measured": len(split["latency"]), "parts": {name: stats.distribution_ms(values) for name, values in split.items()}}
