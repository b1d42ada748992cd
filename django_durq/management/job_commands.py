"""``manage.py durq show|recent|failed``: jobs read from the shell, one in full or the latest in a table.

A mixin of the ``durq`` command, as ``workflow_commands.py``.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management import CommandError
from django.utils.translation import ngettext

from .. import ops
from ..clock import now_ms
from ..conf import get_settings
from ..models import Job
from . import job_output
from .arguments import NOT_ALL_DONE


class JobCommands:
    """Handlers of ``durq show``, ``durq recent`` and ``durq failed``.

    The command provides ``stdout``, ``stderr`` and ``_table``.
    """

    stdout: Any
    stderr: Any
    _table: Any

    def do_show(self, options: dict[str, Any]) -> None:
        ids: list[int] = list(dict.fromkeys(options["ids"]))
        found = ops.jobs_by_id(ids)
        ended = ops.ended_workers([job.claimed_by for job in found.values() if job.status == "running"])
        if options["json"]:
            shown = [job_output.job_dict(found[i], found[i].claimed_by in ended) for i in ids if i in found]
            self.stdout.write(json.dumps(shown, indent=2, ensure_ascii=False))
        else:
            for index, job in enumerate(found[i] for i in ids if i in found):
                if index:
                    self.stdout.write("")
                self._show(job, job.status == "running" and job.claimed_by in ended)
        missing = [i for i in ids if i not in found]
        if missing:
            keep = get_settings().keep_finished_ms
            kept = f"finished jobs are kept for {ops.format_age(keep)} (KEEP_FINISHED)" if keep else "KEEP_FINISHED is 0"
            for job_id_ in missing:
                self.stderr.write(f"Job {job_id_}: no such job: it never existed, or it ended and was removed ({kept}).")
            raise CommandError(
                ngettext("%(count)d job not found", "%(count)d jobs not found", len(missing)) % {"count": len(missing)},
                returncode=NOT_ALL_DONE,
            )

    def _show(self, job: Job, orphaned: bool) -> None:
        took = job_output.took_s(job)
        lines = [
            f"Job {job.pk} ({job.name}) in queue {job.queue!r}: {job.state}" + (" (orphaned)" if orphaned else ""),
            f"  created   {ops.local_time(job.created_ms)}",
            f"  due       {job_output.due(job)}",
            f"  started   {ops.local_time(job.started_ms)} (attempt {job.attempts} of {job.max_attempts})",
            f"  ended     {ops.local_time(job.finished_ms)}" + (f", after {took:.3f} s" if took is not None else ""),
        ]
        lines += job_output.holder_lines(job, orphaned, now_ms())
        if job.result is not None:
            lines.append(f"  result    {job_output.clip(job.result, 200)}")
        if job.last_error:
            lines.append(f"  error     {job_output.clip(job_output.last_error(job), 200)}")
        for line in lines:
            self.stdout.write(line)

    def do_recent(self, options: dict[str, Any]) -> None:
        jobs = ops.recent(queue=options["queue"], limit=options["limit"])
        if options["json"]:
            self.stdout.write(json.dumps([job_output.job_dict(job) for job in jobs], indent=2, ensure_ascii=False))
            return
        if not jobs:
            keep = get_settings().keep_finished_ms
            self.stdout.write(
                f"No jobs ended in the last {ops.format_age(keep)} (KEEP_FINISHED)." if keep else "No ended jobs kept."
            )
            return
        table = [["ID", "NAME", "QUEUE", "STATUS", "ENDED", "TOOK", "ATTEMPTS", "RESULT / LAST ERROR"]]
        for job in jobs:
            took = job_output.took_s(job)
            outcome = job.result if job.status == "finished" else job_output.last_error(job)
            table.append(
                [
                    str(job.pk),
                    job.name,
                    job.queue,
                    job.status,
                    ops.local_time(job.finished_ms),
                    f"{took:.3f} s" if took is not None else "-",
                    f"{job.attempts}/{job.max_attempts}",
                    job_output.clip(outcome or "", 60),
                ]
            )
        self._table(table)

    def do_failed(self, options: dict[str, Any]) -> None:
        jobs = ops.failed(queue=options["queue"], limit=options["limit"])
        if options["json"]:
            data = [
                {
                    "id": job.pk,
                    "name": job.name,
                    "queue": job.queue,
                    "attempts": job.attempts,
                    "max_attempts": job.max_attempts,
                    "died_at": job_output.iso(job.finished_ms),
                    "arguments": json.loads(job.arguments),
                    "errors": job.error_list,
                }
                for job in jobs
            ]
            self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))
            return
        if not jobs:
            self.stdout.write("No dead letters.")
            return
        table = [["ID", "NAME", "QUEUE", "ATTEMPTS", "DIED", "LAST ERROR"]]
        for job in jobs:
            table.append(
                [
                    str(job.pk),
                    job.name,
                    job.queue,
                    f"{job.attempts}/{job.max_attempts}",
                    ops.local_time(job.finished_ms),
                    job_output.clip(job_output.last_error(job), 80),
                ]
            )
        self._table(table)
