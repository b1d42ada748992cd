"""The "Flow control and workflows" section of ``docs/benchmarks.md``: what limits cost a drain,
how fast a pause and a resume act, and what a fan-out's fan-in costs. Written from the results of
the ``limits``, ``pausing`` and ``workflows`` workloads by ``report.write``.
"""

from __future__ import annotations

from . import render
from .render import DB_LABEL, Line

ORDER = ("sqlite", "postgres", "mysql")
VARIANTS = (
    ("off", "no limit (the fast claim)"),
    ("per_key", "`Limit(max_running=1)` on 1,000 keys, never reached"),
    ("queue_cap", "queue `max_running` 100,000, never reached"),
    ("queue_rate", "queue rate 1,000,000/s, never reached (every start logged)"),
    ("rate_held", "queue rate 1,000/s, which holds the drain back: starts per second delivered"),
)


def _by_database(lines: list[Line], workload: str, **params: object) -> dict[str, list[Line]]:
    found: dict[str, list[Line]] = {}
    for line in lines:
        if line["workload"] != workload or line["system"] != "durq":
            continue
        if any(line.get("params", {}).get(key) != value for key, value in params.items()):
            continue
        found.setdefault(line["database"], []).append(line)
    return found


def section(lines: list[Line]) -> list[str]:
    present = {line["workload"] for line in lines}
    if not present & {"limits", "pausing", "workflows"}:
        return []
    out = ["## Flow control and workflows", ""]
    if "limits" in present:
        out += [
            "### Limits on against off",
            "",
            "One worker at concurrency 4 drains no-op jobs (`benchmarks/workloads/limits.py`). Every limit but the"
            " last is set so that it never holds a job back: the figures are what enforcing it costs. Ratio: jobs/s"
            " against `off` in the same repeat, median of the repeats. The last holds the drain back all along: its"
            " figure is the rate delivered (1,000 over the mean time from a start to the one 1,000 starts later).",
            "",
            "| database | variant | jobs/s | vs off | CPU ms/job | load |",
            "|---|---|---|---|---|---|",
        ]
        for database in ORDER:
            for variant, label in VARIANTS:
                rows = _by_database(lines, "limits", variant=variant).get(database)
                if not rows:
                    continue
                ratio = "1.00×" if variant == "off" else render.cell(rows, "ratio_to_off", 2, "×")
                speed = render.cell(rows, "jobs_per_s")
                if variant == "rate_held":  # held back all along: the rate delivered, not a speed
                    ratio, speed = "-", f"{render.cell(rows, 'delivered_per_s')} delivered"
                out.append(
                    f"| {DB_LABEL[database]} | {label} | {speed} | {ratio} |"
                    f" {render.cell(rows, 'cpu_ms_per_job', 3)} | {render.load_text(rows)} |"
                )
        out.append("")
    if "pausing" in present:
        out += [
            "### Pause and resume",
            "",
            "Resume: from the resume's commit to the first job's start, on an idle worker (concurrency 4) whose queue"
            " held 200 due jobs. Pause: from the pause's commit to the last job that started after it, on a worker"
            " draining a backlog (jobs it had claimed ahead may still start). `benchmarks/workloads/pausing.py`.",
            "",
            "| database | resume acts after | pause acts after | jobs started after the pause | load |",
            "|---|---|---|---|---|",
        ]
        for database in ORDER:
            resumed = _by_database(lines, "pausing", variant="resume").get(database)
            paused = _by_database(lines, "pausing", variant="pause").get(database)
            if not resumed or not paused:
                continue
            out.append(
                f"| {DB_LABEL[database]} | {render.cell(resumed, 'latency_ms', 1, ' ms')} |"
                f" {render.cell(paused, 'latency_ms', 1, ' ms')} | {render.cell(paused, 'started_after')} |"
                f" {render.load_text(resumed)} |"
            )
        out.append("")
    if "workflows" in present:
        out += [
            "### A 10,000-job fan-out and its fan-in callback",
            "",
            "One workflow of 10,000 no-op jobs and a callback that waits for all of them, queued in one transaction,"
            " against 10,000 plain jobs, each drained by one worker at concurrency 4 (`benchmarks/workloads/workflows.py`)."
            " Time and CPU per member: against a plain job of the same repeat. Callback: from the last member's start"
            " (they do nothing) to the callback's.",
            "",
            "| database | plain jobs/s | members/s | time per member | CPU per member | callback after the last member | load |",
            "|---|---|---|---|---|---|---|",
        ]
        for database in ORDER:
            plain = _by_database(lines, "workflows", variant="plain").get(database)
            fan_out = _by_database(lines, "workflows", variant="fan_out").get(database)
            if not plain or not fan_out:
                continue
            time_ratio = render.cell(fan_out, "time_per_member_ratio", 2, "×")
            cpu_ratio = render.cell(fan_out, "cpu_per_member_ratio", 2, "×")
            out.append(
                f"| {DB_LABEL[database]} | {render.cell(plain, 'jobs_per_s')} | {render.cell(fan_out, 'jobs_per_s')} |"
                f" {time_ratio} | {cpu_ratio} | {render.cell(fan_out, 'callback_latency_ms', 1, ' ms')} |"
                f" {render.load_text(fan_out)} |"
            )
        out.append("")
    return out
