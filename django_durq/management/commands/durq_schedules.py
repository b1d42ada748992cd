"""``manage.py durq_schedules``: list the cron schedules with their last and next due times."""

from __future__ import annotations

from typing import Any

from django.core.management import BaseCommand, CommandError, CommandParser

from ...schedules import UnknownSchedule, format_schedules, run_now


class Command(BaseCommand):
    help = "List cron schedules (last and next due time, in each schedule's time zone); --run-now NAME enqueues one run."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--run-now", metavar="NAME", default=None, help="Enqueue one run of this schedule now.")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["run_now"]
        if name is not None:
            try:
                job = run_now(name)
            except UnknownSchedule as error:
                raise CommandError(str(error), returncode=2) from None
            self.stdout.write(f"Enqueued job {job.pk} ({job.name}) for schedule {name!r}.")
            return
        self.stdout.write(format_schedules())
