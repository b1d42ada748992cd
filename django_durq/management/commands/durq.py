"""``manage.py durq stats|show|recent|failed|retry|purge|cancel|pause|resume|limits|schedules|workflows|workflow``.

Thin: arguments are checked at the edge (a bad one exits with status 2 and one line saying
why), then :mod:`django_durq.ops` does the work. A retry or cancel that leaves some of the
named jobs alone says which and why, and exits with status 1.

The arguments' checks are in ``management/arguments.py``; ``show``, ``recent`` and ``failed`` in
``management/job_commands.py``, ``workflows`` and ``workflow`` in ``management/workflow_commands.py``.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management import BaseCommand, CommandError, CommandParser
from django.utils.translation import ngettext

from ... import ops
from ...clock import now_ms
from ...schedules import format_schedules
from .. import job_output
from ..arguments import (
    NOT_ALL_DONE,
    USAGE_ERROR,
    OneLineParser,
    duration_ms,
    job_id,
    operator,
    positive_int,
    queue_name,
    reason_text,
)
from ..job_commands import JobCommands
from ..limits_cli import show_limits
from ..workflow_commands import WorkflowCommands, add_workflow_parsers


class Command(JobCommands, WorkflowCommands, BaseCommand):
    help = "Operate the queue: stats, jobs, retries, purges, cancels, pauses, limits, schedules and workflows."
    requires_system_checks: list[str] = []  # an operator needs these most when something is wrong

    def add_arguments(self, parser: CommandParser) -> None:
        parser.error = OneLineParser.error.__get__(parser)  # type: ignore[method-assign]
        commands = parser.add_subparsers(
            dest="action",
            required=True,
            metavar="{stats,show,recent,failed,retry,purge,cancel,pause,resume,limits,schedules,workflows,workflow}",
            parser_class=OneLineParser,
        )

        stats = commands.add_parser(
            "stats", help="Counts per queue: waiting, delayed, blocked, running, dead, oldest wait, throughput."
        )
        stats.add_argument("--json", action="store_true", help="Print JSON instead of a table.")

        show = commands.add_parser("show", help="Did it run? One job's state, times, duration, result and last error.")
        show.add_argument("ids", nargs="+", type=job_id, metavar="ID", help="Job ids.")
        show.add_argument("--json", action="store_true", help="Print JSON with every attempt's error.")

        recent = commands.add_parser("recent", help="Jobs that ended (finished, dead, cancelled), most recent first.")
        recent.add_argument("--queue", type=queue_name, help="Only this queue.")
        recent.add_argument("--limit", type=positive_int, default=20, help="At most this many (default 20).")
        recent.add_argument("--json", action="store_true", help="Print JSON instead of a table.")

        failed = commands.add_parser("failed", help="List dead letters, most recent first.")
        failed.add_argument("--queue", type=queue_name, help="Only this queue.")
        failed.add_argument("--limit", type=positive_int, default=50, help="At most this many (default 50).")
        failed.add_argument("--json", action="store_true", help="Print JSON with every attempt's error.")

        retry = commands.add_parser("retry", help="Dead or cancelled jobs back to waiting, due now, attempts reset.")
        retry.add_argument("ids", nargs="*", type=job_id, metavar="ID", help="Job ids.")
        retry.add_argument("--all-failed", action="store_true", help="Every dead letter (of --queue).")
        retry.add_argument("--queue", type=queue_name, help="With --all-failed: only this queue.")

        purge = commands.add_parser("purge", help="Delete dead letters that died at least this long ago.")
        purge.add_argument("--older-than", type=duration_ms, required=True, metavar="AGE", help="e.g. 7d, 12h, 30m.")
        purge.add_argument("--queue", type=queue_name, help="Only this queue.")
        purge.add_argument("--dry-run", action="store_true", help="Count, delete nothing.")

        cancel = commands.add_parser("cancel", help="Cancel waiting jobs; ask running ones to stop.")
        cancel.add_argument("ids", nargs="+", type=job_id, metavar="ID", help="Job ids.")

        pause = commands.add_parser("pause", help="Start no more jobs of these queues, on any worker; running jobs finish.")
        pause.add_argument("queues", nargs="+", type=queue_name, metavar="QUEUE", help="Queue names.")
        pause.add_argument("--reason", type=reason_text, default="", help="Why, recorded with who and when.")

        resume = commands.add_parser("resume", help="Start jobs of these paused queues again, at once.")
        resume.add_argument("queues", nargs="+", type=queue_name, metavar="QUEUE", help="Queue names.")
        resume.add_argument("--reason", type=reason_text, default="", help="Why, recorded with who and when.")

        commands.add_parser("schedules", help="Cron schedules with their last and next due time.")

        limits = commands.add_parser("limits", help="Limits at work: running and started against limits, keys at theirs.")
        limits.add_argument("--queue", type=queue_name, help="Only this queue.")
        limits.add_argument("--json", action="store_true", help="Print JSON.")
        add_workflow_parsers(commands, positive_int)

    def handle(self, *args: Any, **options: Any) -> None:
        getattr(self, f"do_{options['action']}")(options)

    # --- subcommands -------------------------------------------------------------------------------

    def do_limits(self, options: dict[str, Any]) -> None:
        show_limits(self, options)

    def do_schedules(self, options: dict[str, Any]) -> None:
        self.stdout.write(format_schedules(now_ms()))

    def do_stats(self, options: dict[str, Any]) -> None:
        now = now_ms()
        rows = ops.stats(now_ms=now)
        if options["json"]:
            self.stdout.write(json.dumps([row.as_dict() for row in rows], indent=2))
        else:
            self._stats_table(rows)
        # On stderr, so that the table and the JSON stay as they are for whatever reads them.
        for row in rows:
            if row.unknown_type_last_hour:
                self.stderr.write(
                    self.style.WARNING(
                        f"Warning: {row.unknown_type_last_hour} job(s) of queue {row.queue!r} handed back in the last hour "
                        "by a worker with no handler for their type (attempts not counted): a deploy under way, or a "
                        "type no worker has any more; the workers' logs name the types."
                    )
                )
        for queue, count in ops.unserved(now_ms=now).items():
            waits = ngettext("it waits", "they wait", count)
            self.stderr.write(
                self.style.WARNING(
                    f"Warning: {ops.due_jobs(count)} in queue {queue!r}, which no live worker serves: "
                    f"{waits} until a worker runs that queue."
                )
            )

    def _stats_table(self, rows: list[ops.QueueStats]) -> None:
        table = [
            [
                "QUEUE",
                "STATE",
                "WAITING",
                "DELAYED",
                "BLOCKED",
                "RUNNING",
                "DEAD",
                "OLDEST WAIT",
                "DONE 1m/1h",
                "FAILED 1m/1h",
                "WORKERS",
            ]
        ]
        for row in rows:
            table.append(
                [
                    row.queue,
                    "paused" if row.paused else "active",
                    str(row.waiting),
                    str(row.delayed),
                    str(row.blocked),
                    str(row.running),
                    str(row.dead),
                    ops.format_age(row.oldest_wait_ms),
                    f"{row.finished_last_minute}/{row.finished_last_hour}",
                    f"{row.failed_last_minute}/{row.failed_last_hour}",
                    f"{row.workers} ({row.slots} slots)",
                ]
            )
        self._table(table)

    def do_retry(self, options: dict[str, Any]) -> None:
        ids, every = options["ids"], options["all_failed"]
        if ids and every:
            raise CommandError("retry: give job ids or --all-failed, not both", returncode=USAGE_ERROR)
        if not ids and not every:
            raise CommandError("retry: give job ids, or --all-failed to retry every dead letter", returncode=USAGE_ERROR)
        if options["queue"] is not None and not every:
            raise CommandError("retry: --queue goes with --all-failed", returncode=USAGE_ERROR)
        now = now_ms()
        result = ops.retry_failed(queue=options["queue"], now_ms=now) if every else ops.retry(ids, now_ms=now)
        count = len(result.retried)
        if count:
            retried = ngettext("Retried %(count)d job", "Retried %(count)d jobs", count) % {"count": count}
            self.stdout.write(f"{retried}{job_output.id_list(result.retried)}: due now.")
        elif not result.skipped:
            self.stdout.write("No dead letters to retry.")
        self._skipped("retried", result.skipped)

    def do_purge(self, options: dict[str, Any]) -> None:
        now = now_ms()
        bound = ops.local_time(now - options["older_than"])
        count = ops.purge(older_than_ms=options["older_than"], queue=options["queue"], now_ms=now, dry_run=options["dry_run"])
        where = f" in queue {options['queue']!r}" if options["queue"] else ""
        verb = "Would purge" if options["dry_run"] else "Purged"
        letters = ngettext("%(count)d dead letter", "%(count)d dead letters", count) % {"count": count}
        self.stdout.write(f"{verb} {letters}{where} that died at or before {bound}.")

    def do_pause(self, options: dict[str, Any]) -> None:
        now = now_ms()
        known = set(ops.queue_names())
        for queue in dict.fromkeys(options["queues"]):
            if ops.pause(queue, now_ms=now, reason=options["reason"], by=operator()):
                self.stdout.write(f"Paused queue {queue!r}: workers start none of its jobs; running jobs finish.")
            else:
                switch = ops.queue_switches().get(queue)
                by = f" by {switch.by}" if switch and switch.by else ""
                why = f": {switch.reason}" if switch and switch.reason else ""
                since = ops.local_time(switch.at_ms if switch else None)
                self.stdout.write(f"Queue {queue!r} was already paused (since {since}{by}{why}).")
            if queue not in known:
                # Allowed (a queue may be paused before its first job), but more often a typo.
                self.stderr.write(
                    self.style.WARNING(f"Warning: no queue {queue!r} is configured, registered or holds jobs: is it misspelt?")
                )

    def do_resume(self, options: dict[str, Any]) -> None:
        now = now_ms()
        for queue in dict.fromkeys(options["queues"]):
            if ops.resume(queue, now_ms=now, reason=options["reason"], by=operator()):
                self.stdout.write(f"Resumed queue {queue!r}: its due jobs start now.")
            else:
                self.stdout.write(f"Queue {queue!r} was not paused.")

    def do_cancel(self, options: dict[str, Any]) -> None:
        result = ops.cancel(options["ids"], now_ms=now_ms())
        waiting, running = len(result.cancelled), len(result.stopping)
        if waiting:
            cancelled = ngettext("Cancelled %(count)d waiting job", "Cancelled %(count)d waiting jobs", waiting)
            self.stdout.write(f"{cancelled % {'count': waiting}}{job_output.id_list(result.cancelled)}.")
        if running:
            asked = ngettext("Asked %(count)d running job", "Asked %(count)d running jobs", running) % {"count": running}
            self.stdout.write(
                f"{asked}{job_output.id_list(result.stopping)} to stop: "
                "each is cancelled when its handler returns (ctx.should_stop() is now true)."
            )
        self._skipped("cancelled", result.skipped)

    # --- output ------------------------------------------------------------------------------------

    def _skipped(self, verb: str, skipped: dict[int, str]) -> None:
        if not skipped:
            return
        for job_id_, reason in skipped.items():
            self.stderr.write(f"Job {job_id_} not {verb}: {reason}.")
        count = len(skipped)
        left = ngettext("%(count)d job not %(verb)s", "%(count)d jobs not %(verb)s", count) % {"count": count, "verb": verb}
        raise CommandError(left, returncode=NOT_ALL_DONE)

    def _table(self, rows: list[list[str]]) -> None:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
