"""Where django-durq's worker spends its time during a drain: py-spy attached to ``durq_worker``.

Not part of a default run (a sampling profiler slows what it watches). The folded stacks are
kept in the run's scratch directory; the record holds the share of samples per phase of a
job's life (claim, handler, completion write, connection tidying, thread hand-off, ...) and,
from the sample count, an estimate of the time per job each phase costs.
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from ..adapters import Adapter
from ..core import envs, procs, ticks
from ..core.session import Session, Skip
from . import drain

NAME = "profile"
CONCURRENCY = 4
RATE = 250

# (phase, substrings any of which in a frame puts the sample there), tried from the leaf up.
PHASES: list[tuple[str, tuple[str, ...]]] = [
    ("handler (the no-op job)", ("bench_durq/jobs.py", "benchsite/tick.py")),
    ("complete + claim (one transaction)", ("complete_and_claim",)),
    ("claim", ("claim (django_durq/db/", "claim (django_durq/db/store.py")),
    ("idle probe / expired scan", ("next_due_ms", "_bury_expired", "expired_final_attempts")),
    (
        "completion write",
        (
            "complete (django_durq/db/",
            "_finish (django_durq/execution/executor.py",
            "finish (django_durq/db/",
            "_record_completions",
        ),
    ),
    ("payload decode", ("decode_arguments",)),
    ("lease renewal / heartbeat", ("renew (django_durq", "beat (django_durq", "flush (django_durq/worker/monitor")),
    ("wake-up watcher", ("django_durq/worker/watcher.py",)),
    ("maintenance duties", ("django_durq/worker/maintenance.py",)),
    ("connection tidying", ("tidy (django_durq/worker/pool.py", "after_idle (django_durq/worker/pool.py")),
    ("job context set-up", ("__init__ (django_durq/handlers/context.py",)),
    ("counters and bookkeeping", ("job_done", "count (django_durq/worker/runtime", "hooks.py", "_defer_completion")),
    ("executor (rest)", ("django_durq/execution/executor.py",)),
    (
        "thread hand-off (buffer, kick)",
        ("_work (django_durq/worker/pool.py", "_next_job (django_durq/worker/pool.py", "_dispatch (django_durq/worker/pool.py"),
    ),
    ("supervisor / monitor loops", ("django_durq/worker/supervisor.py", "django_durq/worker/monitor.py")),
]
DB_LAYER = ("django/db/", "sqlite3", "psycopg", "MySQLdb")
WAITING = "waiting (idle)"
_WAIT_CALL = re.compile(r"\.(get|wait|join|acquire)\(|sleep\(|select\(")
_FRAME = re.compile(r"^(?P<function>.+) \((?P<file>[^():]+):(?P<line>\d+)\)$")


def applies(adapter: Adapter, database: str) -> bool:
    return adapter.name == "durq"


def run(session: Session, adapter: Adapter, database: str) -> None:
    try:
        tools = session.tools_python()
    except envs.EnvError as error:
        raise Skip(f"py-spy unavailable: {error}") from None
    py_spy = tools.parent / "py-spy"
    jobs = max(session.options.jobs, 20_000)
    for concurrency in session.options.extra.get("concurrency", (CONCURRENCY,)):
        for view in ("threads", "gil"):
            load = procs.loadavg()
            metrics = profile_once(session, adapter, database, jobs, concurrency, py_spy, view)
            params = {"jobs": jobs, "concurrency": concurrency, "view": view}
            session.record(NAME, adapter, database, params, 0, metrics, load)
            report(session, view, concurrency, metrics)


def report(session: Session, view: str, concurrency: int, metrics: dict[str, Any]) -> None:
    rate = metrics.get("jobs_per_s") or 0
    if view == "gil":
        session.say(f"  c={concurrency}, Python holding the GIL ({rate:,.0f} jobs/s under py-spy): per job")
        for phase, share in metrics.get("phases", {}).items():
            session.say(
                f"    {phase:<36} {share['percent']:5.1f}%  {share['us_per_job']:7.1f} us/job"
                f"  ({share['db_percent_of_phase']:.0f}% under django.db)"
            )
    else:
        session.say(f"  c={concurrency}, each thread's time ({rate:,.0f} jobs/s under py-spy):")
        for role, phases in metrics.get("threads", {}).items():
            busy = ", ".join(f"{phase} {percent:.0f}%" for phase, percent in phases.items() if percent >= 1)
            session.say(f"    {role:<12} {busy}")
    session.say(f"    folded stacks: {metrics.get('folded')}")


def profile_once(
    session: Session, adapter: Adapter, database: str, jobs: int, concurrency: int, py_spy: Path, view: str
) -> dict[str, Any]:
    with session.fresh_database(adapter, database, "profile") as db:
        drain.enqueue(session, adapter, db, jobs)
        tick_file = session.ticks_file(f"{adapter.name}-profile")
        folded = session.work / f"{session.next_tag('profile')}-{database}-c{concurrency}-{view}.folded"
        group = session.start_workers(adapter, db, concurrency, tick_file)
        command = [str(py_spy), "record", "--pid", str(group.pgids[0]), "--rate", str(RATE), "--format", "raw",
                   "--output", str(folded)]  # fmt: skip
        command += ["--gil"] if view == "gil" else ["--threads", "--idle"]
        # py-spy attaches after start-up: the profile covers the steady drain.
        ticks.wait_for(tick_file, 1, timeout_s=120, alive=group.alive)
        spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            time.sleep(0.5)
            profiled_from = ticks.count(tick_file)
            t0 = time.time()
            finished = ticks.wait_for(tick_file, jobs, timeout_s=60 + jobs / 100, alive=group.alive)
            profiled_jobs = ticks.count(tick_file) - profiled_from
            seconds = time.time() - t0
            cpu = group.cpu_seconds()
        finally:
            spy.send_signal(signal.SIGINT)
            try:
                spy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()
            group.stop()
    metrics = drain.summarize(tick_file, jobs, group, cpu)
    shown = folded.relative_to(envs.REPO) if folded.is_relative_to(envs.REPO) else folded
    metrics.update({"folded": str(shown), "profiled_jobs": profiled_jobs, "profiled_seconds": seconds})
    if not finished:
        metrics["error"] = group.log_tail()
    if not folded.exists():
        metrics["error"] = f"py-spy wrote nothing: {spy.stderr.read().decode()[-1000:] if spy.stderr else ''}"
    elif view == "gil":
        metrics.update(attribute_gil(folded, profiled_jobs))
    else:
        metrics["threads"] = attribute_threads(folded)
    return metrics


def _samples(folded: Path) -> list[tuple[list[str], int]]:
    found = []
    for line in folded.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if count_text.isdigit():
            found.append((stack.split(";"), int(count_text)))
    return found


def attribute_gil(folded: Path, jobs: int) -> dict[str, Any]:
    """Samples of the thread holding the GIL, per phase: Python's CPU time per job."""
    phases: collections.Counter[str] = collections.Counter()
    in_db: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for frames, count in _samples(folded):
        total += count
        phase = classify(frames)
        phases[phase] += count
        if any(marker in frame for frame in frames for marker in DB_LAYER):
            in_db[phase] += count
        leaves[frames[-1]] += count
    return {
        "samples": total,
        "phases": {
            phase: {
                "percent": count * 100 / total,
                "us_per_job": count / RATE / max(jobs, 1) * 1e6,
                "db_percent_of_phase": in_db[phase] * 100 / count,
            }
            for phase, count in phases.most_common()
        },
        "top_leaves": [[frame, count * 100 / total] for frame, count in leaves.most_common(25)],
    }


def attribute_threads(folded: Path) -> dict[str, dict[str, float]]:
    """For each kind of thread, the share of its wall time in each phase, waiting included."""
    per_role: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for frames, count in _samples(folded):
        role = _role(frames[0])
        phase = WAITING if _waiting(frames[-1]) else classify(frames[1:])
        per_role[role][phase] += count
    result = {}
    for role, phases in sorted(per_role.items()):
        total = sum(phases.values())
        result[role] = {phase: count * 100 / total for phase, count in phases.most_common()}
    return result


def _role(thread_frame: str) -> str:
    name = thread_frame.rpartition(": ")[2].strip()
    if name.startswith("durq-") and name.endswith("-dispatch"):
        return "dispatcher"
    if re.match(r"^durq-.+-\d+$", name):
        return "slots"
    return name.removeprefix("durq-") or "?"


def _waiting(leaf: str) -> bool:
    match = _FRAME.match(leaf)
    if not match:
        return False
    function, path = match.group("function"), match.group("file")
    if path.endswith("threading.py") or path.endswith("queue.py") or path.endswith("selectors.py"):
        return function.rpartition(".")[2] in ("wait", "get", "join", "_wait_for_tstate_lock", "select", "acquire")
    source = envs.REPO / path
    if not source.exists():
        return False
    lines = source.read_text().splitlines()
    number = int(match.group("line"))
    return 0 < number <= len(lines) and bool(_WAIT_CALL.search(lines[number - 1]))


def classify(frames: list[str]) -> str:
    for frame in reversed(frames):
        for phase, markers in PHASES:
            if any(marker in frame for marker in markers):
                return phase
    return "other (start-up, Django, threads)"
