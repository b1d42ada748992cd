"""The compressed day's verdict, from the producers' acknowledged ids, the handlers' ledger and the job rows.

| figure | how it is counted |
|---|---|
| jobs lost | acknowledged, and never started, or still waiting or running after the drain |
| dead letters | acknowledged and dead: no job of the day should end so, unless each of its attempts ran on a |
|  | worker that was killed (at-least-once counts an attempt lost with its worker): those are shown apart |
| duplicates beyond the jobs in flight | jobs started under two claim tokens that were not running on a killed worker or |
|  | at the database's restart |
| attempts burned by deploys | attempts beyond the first of jobs that were in flight at no fault, plus dead letters |
|  | that a kill did not end on every attempt |
| takeover time | from a kill until no job of the killed worker is left ``running`` under its id |
| enqueue to start | the handler's start minus the time the producer read just before its enqueue call |
| unexpected runs | jobs started that no producer saw acknowledged: at most the jobs of failed enqueue calls, which |
|  | may have committed before the error |
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .harness import Day, resilient


@dataclass
class Run:
    job_id: int
    token: int
    attempt: int
    start_ms: int
    queued_ms: int
    pid: int


def read_runs(folder: Path) -> list[Run]:
    runs = []
    for path in folder.glob("runs-*.txt"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 6:
                runs.append(Run(*map(int, parts)))
    return runs


def read_acked(paths: list[Path]) -> tuple[set[int], int, int]:
    """Acknowledged ids; enqueue calls that failed, and how many jobs they asked for."""
    acked, failed_calls, failed_jobs = set(), 0, 0
    for path in paths:
        for line in path.read_text().split() if path.exists() else []:
            if line.startswith("?"):
                failed_calls += 1
                failed_jobs += int(line.rsplit(":", 1)[1])
            else:
                acked.add(int(line))
    return acked, failed_calls, failed_jobs


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def _mb(value: float) -> str:
    return f"{value / 1_048_576:.1f}"


def verdict(day: Day, acked: set[int], failed: tuple[int, int], drained: bool) -> dict[str, Any]:
    from django_durq.models import Job, QueueStat

    runs = read_runs(day.workdir / "ledger")
    by_job: dict[int, list[Run]] = defaultdict(list)
    for run in runs:
        by_job[run.job_id].append(run)
    rows = resilient(
        lambda: {pk: (status, attempts) for pk, status, attempts in Job.objects.values_list("pk", "status", "attempts")}
    )
    active = {pk for pk in acked if rows.get(pk, ("finished", 0))[0] in ("waiting", "running")}
    lost = sorted(pk for pk in acked if pk not in by_job or pk in active)
    dead = sorted(pk for pk in acked if rows.get(pk, ("", 0))[0] == "dead")
    kills_of = Counter(pk for kill in day.kills for pk in kill.running)
    # Each attempt ran on a worker killed while it ran: lost with its worker, as the promise counts it.
    killed_each_time = [pk for pk in dead if kills_of[pk] >= rows[pk][1]]
    duplicated = [pk for pk, started in by_job.items() if len({run.token for run in started}) > 1]
    unexplained = sorted(pk for pk in duplicated if pk not in day.in_flight)
    burned_jobs = {pk: max(run.attempt for run in started) for pk, started in by_job.items() if pk not in day.in_flight}
    burned_jobs = {pk: attempt for pk, attempt in burned_jobs.items() if attempt > 1}
    burned = sum(attempt - 1 for attempt in burned_jobs.values())
    unexpected = sorted(set(by_job) - acked)
    first_runs = [min(started, key=lambda run: run.token) for started in by_job.values()]
    latency = [run.start_ms - run.queued_ms for run in first_runs if run.job_id in acked]
    # Jobs queued outside every rolling restart and the database's restart (and its 20 s after).
    calm = [
        run.start_ms - run.queued_ms
        for run in first_runs
        if run.job_id in acked and not any(begin <= run.queued_ms <= end + 20_000 for begin, end in day.windows)
    ]
    taken = [kill.taken_s for kill in day.kills if kill.taken_s is not None]
    unknown = resilient(lambda: sum(QueueStat.objects.values_list("unknown_type", flat=True)))
    return {
        "acked": len(acked),
        "failed enqueue calls": failed[0],
        "jobs of failed calls": failed[1],
        "started": len(by_job),
        "drained": drained,
        "lost": lost,
        "dead": dead,
        "duplicated": len(duplicated),
        "in flight at faults": len(day.in_flight),
        "unexplained": unexplained,
        "unexpected": unexpected,
        "killed each attempt": killed_each_time,
        "burned": burned + len(dead) - len(killed_each_time),
        "burned jobs": sorted(burned_jobs),
        "unknown type hand-backs": unknown,
        "kills": len(day.kills),
        "kills with running jobs": len([kill for kill in day.kills if kill.running]),
        "takeover s": taken,
        "latency ms": latency,
        "calm latency ms": calm,
    }


def print_report(day: Day, result: dict[str, Any], command: str) -> bool:
    args = day.args
    taken, latency = result["takeover s"], result["latency ms"]
    print()
    print(f"=== durq compressed day: {args.db}, {args.minutes:g} min, {args.rate:g} jobs/s ===")
    print(f"command                  {command}")
    print(f"database restart         {day.db_restart or 'none'}")
    print(f"rolling restarts         {len(day.releases)} (releases {[release for _, release in day.releases]})")
    print(f"kills (SIGKILL)          {result['kills']}, {result['kills with running jobs']} with jobs running")
    print(f"jobs acknowledged        {result['acked']} (failed enqueue calls: {result['failed enqueue calls']})")
    print(f"jobs started             {result['started']}; drained: {'yes' if result['drained'] else 'NO'}")
    print(f"jobs lost                {len(result['lost'])} {result['lost'][:10]}")
    print(f"dead letters             {len(result['dead'])} {result['dead'][:10]}")
    if result["killed each attempt"]:
        killed = result["killed each attempt"]
        print(f"    of which on a killed worker at every attempt: {len(killed)} {killed[:10]}")
    print(f"duplicates               {result['duplicated']}, beyond the jobs in flight at a fault: {len(result['unexplained'])}")
    print(f"jobs in flight at faults {result['in flight at faults']}")
    print(
        f"unexpected runs          {len(result['unexpected'])} (jobs of failed enqueue calls that committed before the error:"
        f" at most {result['jobs of failed calls']})"
    )
    print(
        f"attempts burned          {result['burned']} (attempts beyond the first of jobs in flight at no fault, dead"
        " letters not killed at every attempt)"
    )
    if result["burned jobs"]:
        print(f"    jobs {result['burned jobs'][:20]}")
    print(f"unknown-type hand-backs  {result['unknown type hand-backs']} (attempts not counted)")
    if taken:
        print(f"takeover after a kill    p50 {statistics.median(taken):.2f} s, max {max(taken):.2f} s ({len(taken)} kills)")
        for kill in day.kills:
            when = (kill.at - day.started) / 60
            took = "-" if kill.taken_s is None else f"{kill.taken_s:.2f} s"
            print(f"    min {when:5.1f}  {len(kill.running):3} jobs of {kill.worker_id}  taken over after {took}")
    for label, values in (("enqueue to start", latency), ("  outside deploys/restart", result["calm latency ms"])):
        if values:
            p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
            print(f"{label:<27}p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {max(values):.0f} ms ({len(values)} jobs)")
    print("table and claim index (MB) over time:")
    for minute, table, claim in day.sizes:
        print(f"    min {minute:5.1f}  table {_mb(table):>8}  claim index {_mb(claim):>7}")
    print("worker RSS (MB) by minute: median, max")
    by_minute: dict[int, list[float]] = defaultdict(list)
    for minute, mb in day.rss:
        by_minute[int(minute)].append(mb)
    for minute in sorted(by_minute):
        values = by_minute[minute]
        print(f"    min {minute:>3}  {statistics.median(values):6.1f}  {max(values):6.1f}")
    problems = problem_lines(day.logs)
    print(f"ERROR lines / tracebacks in worker logs: {sum(problems.values())}")
    for text, count in problems.most_common(5):
        print(f"    {count} x {text}")
    unexpected = len(result["unexpected"]) > result["jobs of failed calls"]
    ok = result["drained"] and not (result["lost"] or result["unexplained"] or result["burned"] or unexpected)
    print(f"DAY {'PASS' if ok else 'FAIL'}")
    return ok


def problem_lines(logs: list[Path]) -> Counter[str]:
    problems: Counter[str] = Counter()
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if " ERROR " in line or " CRITICAL " in line:
                problems[line.split(" ERROR ", 1)[-1][:110]] += 1
            elif line.startswith("Traceback"):
                problems["Traceback"] += 1
    return problems
