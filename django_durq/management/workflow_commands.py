"""``manage.py durq workflows`` and ``durq workflow ID``: workflows from the shell, as the admin shows them.

A mixin of the ``durq`` command: its subparsers are added as one block, its handlers live here.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from django.core.management import CommandError

from .. import ops
from ..clock import ms_to_datetime
from ..models import Job
from ..ops.workflows import MAX_LIMIT

NOT_FOUND = 1
USAGE_ERROR = 2
# ASCII digits only, as the command's other ids.
_DIGITS = re.compile(r"[0-9]+")
STATUSES = ("waiting", "blocked", "running", "finished", "dead", "cancelled")


def workflow_id(text: str) -> int:
    if not _DIGITS.fullmatch(text) or len(text) > 18 or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a workflow id (a positive whole number)")
    return int(text)


def add_workflow_parsers(commands: Any, count_type: Any) -> None:
    """The ``workflows`` and ``workflow`` subcommands, on the ``durq`` command's subparsers."""
    listing = commands.add_parser("workflows", help="Recent workflows, newest first, with their state and jobs per status.")
    listing.add_argument("--limit", type=count_type, default=20, help="At most this many (default 20).")
    listing.add_argument("--json", action="store_true", help="Print JSON instead of a table.")
    one = commands.add_parser("workflow", help="One workflow: its jobs with their states, and what waits for what.")
    one.add_argument("id", type=workflow_id, metavar="ID", help="Workflow id.")
    one.add_argument("--json", action="store_true", help="Print JSON with every job's result and last error.")


class WorkflowCommands:
    """Handlers of ``durq workflows`` and ``durq workflow``; the command provides ``stdout`` and ``_table``."""

    stdout: Any
    _table: Any

    def do_workflows(self, options: dict[str, Any]) -> None:
        if options["limit"] > MAX_LIMIT:
            raise CommandError(f"workflows: --limit is at most {MAX_LIMIT}", returncode=USAGE_ERROR)
        rows = ops.workflows(limit=options["limit"])
        if options["json"]:
            self.stdout.write(json.dumps([_summary_dict(row) for row in rows], indent=2, ensure_ascii=False))
            return
        if not rows:
            self.stdout.write("No workflows. A workflow is pruned with its jobs once every one has ended and been kept.")
            return
        table = [["ID", "NAME", "STATE", "JOBS", *(status.upper() for status in STATUSES), "CREATED"]]
        for row in rows:
            counts = [str(row.counts.get(status, 0)) for status in STATUSES]
            table.append([str(row.id), _clip(row.name, 40), row.state, str(row.total), *counts, ops.local_time(row.created_ms)])
        self._table(table)

    def do_workflow(self, options: dict[str, Any]) -> None:
        try:
            detail = ops.workflow(options["id"])
        except ops.NoSuchWorkflow as error:
            raise CommandError(f"Workflow {options['id']}: {error}", returncode=NOT_FOUND) from None
        if options["json"]:
            data = {
                **_summary_dict(detail.summary),
                "jobs": [_member_dict(job, detail) for job in [*detail.external, *detail.jobs]],
                "edges": [
                    {"job": edge.job_id, "waits_for": edge.depends_on_id, "counted": edge.settled} for edge in detail.edges
                ],
            }
            self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))
            return
        summary = detail.summary
        counts = ", ".join(f"{summary.counts[status]} {status}" for status in STATUSES if summary.counts.get(status))
        self.stdout.write(f"Workflow {summary.id} ({summary.name}): {summary.state}, {summary.total} jobs ({counts or 'none'})")
        self.stdout.write(f"  created {ops.local_time(summary.created_ms)}; when a job it waits for fails: {summary.on_failure}")
        self.stdout.write("")
        table = [["ID", "NAME", "STATUS", "WAITS FOR", "ATTEMPTS", "PROGRESS", "ENDED", "RESULT / LAST ERROR"]]
        for job in [*detail.external, *detail.jobs]:
            waits = ", ".join(str(pk) for pk in detail.upstream(job.pk)) or "-"
            if job.deps_left:
                waits += f" ({job.deps_left} left)"
            outside = " (queued before)" if job.workflow_id != summary.id else ""
            table.append(
                [
                    str(job.pk),
                    job.name + outside,
                    job.state,
                    waits,
                    f"{job.attempts}/{job.max_attempts}",
                    _progress(job),
                    ops.local_time(job.finished_ms),
                    _clip(_outcome(job), 60),
                ]
            )
        self._table(table)


def _summary_dict(summary: ops.WorkflowSummary) -> dict[str, Any]:
    data = summary.as_dict()
    data["created_at"] = _iso(data.pop("created_ms"))
    data["last_ended_at"] = _iso(data.pop("last_ended_ms"))
    return data


def _member_dict(job: Job, detail: ops.WorkflowDetail) -> dict[str, Any]:
    return {
        "id": job.pk,
        "name": job.name,
        "queue": job.queue,
        "status": job.status,
        "in_workflow": job.workflow_id == detail.summary.id,
        "waits_for": detail.upstream(job.pk),
        "dependents": detail.downstream(job.pk),
        "deps_left": job.deps_left,
        "on_failure": job.on_failure,
        "cancelled_by": job.cancelled_by,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "progress": [job.progress_done, job.progress_total] if job.progress_done is not None else None,
        "created_at": _iso(job.created_ms),
        "started_at": _iso(job.started_ms),
        "ended_at": _iso(job.finished_ms),
        "result": json.loads(job.result) if job.result is not None else None,
        "last_error": job.last_error,
    }


def _outcome(job: Job) -> str:
    if job.status == "finished":
        return job.result or ""
    error = job.last_error or {}
    return (f"{error['type']}: " if error.get("type") else "") + str(error.get("message", ""))


def _progress(job: Job) -> str:
    if job.progress_done is None:
        return "-"
    return f"{job.progress_done}/{job.progress_total}" if job.progress_total else str(job.progress_done)


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _iso(ms: int | None) -> str | None:
    moment = ms_to_datetime(ms)
    return moment.isoformat() if moment is not None else None
