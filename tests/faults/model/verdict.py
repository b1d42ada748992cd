"""Every check over one scenario's history, and the failure message and files that explain a verdict."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

from . import flow_checks, job_checks, workflow_checks
from .history import History, Violation

CHECKS = (
    job_checks.check_executions,
    flow_checks.check_limits,
    flow_checks.check_rates,
    flow_checks.check_delivery,
    flow_checks.check_pause,
    workflow_checks.check_order,
    workflow_checks.check_cancel,
    job_checks.check_cancels,
    job_checks.check_lost,
    job_checks.check_stuck,
    job_checks.check_exits,
)
SHOWN_PER_INVARIANT = 3


def judge(history: History) -> list[Violation]:
    return [violation for check in CHECKS for violation in check(history)]


def explain(history: History, violations: list[Violation], vendor: str, replay: str, folder: Path) -> str:
    """The failure message: seed, database, each broken invariant with its jobs and ledger rows, the scenario."""
    counts = Counter(v.invariant for v in violations)
    lines = [
        f"model chaos seed {history.scenario.seed} on {vendor} broke {len(counts)} invariant(s): "
        + ", ".join(f"{name} x{count}" for name, count in counts.items()),
        f"replay: {replay}",
        f"ledger, rows, actions and worker logs: {folder}",
    ]
    shown: Counter[str] = Counter()
    for violation in violations:
        if shown[violation.invariant] < SHOWN_PER_INVARIANT:
            lines += violation.lines(history)
        shown[violation.invariant] += 1
    lines.append(history.scenario.describe())
    lines.append("actions: " + "; ".join(f"{a.op.kind} {a.op.target} at {history.t(a.began_ms)}" for a in history.record.actions))
    return "\n".join(lines)


def save(history: History, violations: list[Violation], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    record = history.record
    data = {
        "seed": history.scenario.seed,
        "started_ms": record.started_ms,
        "quiet": record.quiet,
        "acked": record.acked,
        "enqueued_ms": record.enqueued_ms,
        "flows": record.flows,
        "actions": [dataclasses.asdict(action) for action in record.actions],
        "blackouts": [dataclasses.asdict(blackout) for blackout in record.blackouts],
        "deaths": record.deaths,
        "slots": record.slots,
        "exits": record.exits,
        "jobs": [dataclasses.asdict(job) for job in history.jobs.values()],
        "spans": [dataclasses.asdict(span) for span in history.spans],
        "violations": [f"[{v.invariant}] {v.message}; jobs {v.jobs}" for v in violations],
    }
    (folder / "history.json").write_text(json.dumps(data, indent=1, default=str))
    (folder / "scenario.txt").write_text(history.scenario.describe())
    for index, log in enumerate(record.logs):
        (folder / f"worker-{index}.log").write_text(log)
