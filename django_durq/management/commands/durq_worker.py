"""``manage.py durq_worker``: run the queue's worker pools in this process."""

from __future__ import annotations

import ctypes
import gc
import logging
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

from django.core.checks import WARNING, run_checks
from django.core.management import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor
from django.utils import autoreload

from ...conf import get_settings
from ...db.checks import database_problems
from ...handlers.registry import registry
from ...models import Job
from ...worker import Supervisor, exit_status
from ...worker.runtime import Runtime

# A worker often starts together with its database (a reboot, docker compose): wait this long for it.
DATABASE_PATIENCE_S = 120.0

logger = logging.getLogger("django_durq")


class StoppedDuringStartUp(BaseException):
    """A signal arrived before anything was claimed: there is nothing to drain, so stop at once.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` on the way (logging,
    a database driver) swallows it.
    """


def _stop_at_once(signum: int, frame: FrameType | None) -> None:
    raise StoppedDuringStartUp(signal.Signals(signum).name)


def _release_startup_memory() -> None:
    """Hand back to the OS what start-up (imports, system checks) allocated and freed.

    A worker lives for days; without this, the freed pages stay in its RSS (about 1 MB). glibc
    only: elsewhere the memory stays with the process, as it would anyway. What start-up left
    alive (modules, settings, the app registry) lives as long as the process: frozen, it is no
    longer walked by the cyclic garbage collector, neither by its full collections while the
    worker runs nor by the one at exit, which took most of an idle worker's stop (0.1–0.4 s).
    """
    gc.collect()
    gc.freeze()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


def parse_queue_spec(spec: str, default_size: int) -> tuple[str, int]:
    """``video`` or ``video:2`` -> (name, pool size); ValueError with a one-line reason."""
    name, sep, size_text = spec.partition(":")
    if not name:
        raise ValueError(f"--queue {spec!r}: the queue name is empty")
    if not sep:
        return name, default_size
    try:
        size = int(size_text)
    except ValueError:
        raise ValueError(f"--queue {spec!r}: pool size {size_text!r} is not a whole number") from None
    if size < 1:
        raise ValueError(f"--queue {spec!r}: pool size must be at least 1")
    return name, size


class Command(BaseCommand):
    help = "Run durq worker pools: one bounded pool of threads per named queue."
    requires_system_checks: list[str] = []  # run below, so that an error exits with status 2
    _supervisor: Supervisor | None = None
    _thread: threading.Thread | None = None  # with --reload: the thread the worker runs in

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            default=[],
            metavar="NAME[:SIZE]",
            help="Queue to work, optionally with its pool size; repeat for several. Default: every queue in settings.",
        )
        parser.add_argument("--burst", action="store_true", help="Exit 0 once no due job remains.")
        parser.add_argument("--max-jobs", type=str, default=None, help="Exit cleanly after this many jobs.")
        parser.add_argument("--max-memory", type=str, default=None, metavar="MB", help="Exit cleanly once RSS is above this.")
        parser.add_argument(
            "--grace", type=str, default=None, metavar="SECONDS", help="How long shutdown waits for running jobs."
        )
        parser.add_argument("--worker-id", default=None, help="Name of this worker process (default host:pid:random).")
        parser.add_argument("--reload", action="store_true", help="Development: restart the worker when a Python module changes.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["reload"]:
                self._run_with_reloader(options)
                return
            code = self._run(options, in_main_thread=True)
        except ValueError as error:
            raise CommandError(str(error), returncode=exit_status.REFUSED) from None
        if code:
            sys.exit(code)

    def _run(self, options: dict[str, Any], *, in_main_thread: bool) -> int:
        """Start-up checks, then the supervisor until it stops; ValueError for what a user must fix."""
        settings = get_settings()
        queues = self._queues(options["queue"], settings)
        max_jobs = _positive(options["max_jobs"], "--max-jobs", int)
        max_memory = _positive(options["max_memory"], "--max-memory", float)
        grace = _non_negative(options["grace"], "--grace")
        if settings.database not in connections.settings:
            raise ValueError(
                f'DURQ["DATABASE"] is {settings.database!r}, which is not in DATABASES (known: {", ".join(connections.settings)})'
            )
        _configure_logging(options["verbosity"])
        if in_main_thread:
            signal.signal(signal.SIGTERM, _stop_at_once)
            signal.signal(signal.SIGINT, _stop_at_once)
        try:
            self._start_up(settings.database)
            _release_startup_memory()
            supervisor = Supervisor(
                queues,
                settings,
                burst=options["burst"],
                max_jobs=max_jobs,
                max_memory_mb=max_memory,
                grace_ms=round(grace * 1000) if grace is not None else None,
                worker_id=options["worker_id"],
                on_tick=self._progress if options["burst"] and self.stdout.isatty() else None,
            )
            if in_main_thread:
                supervisor.install_signal_handlers()  # from here on a signal drains
        except StoppedDuringStartUp as stopped:
            logger.info("durq: stopped during start-up (received %s)", stopped)
            return exit_status.CLEAN
        self._queue_names = list(queues)
        self._supervisor = supervisor
        self._started = time.monotonic()
        self._last_progress = 0.0
        code = supervisor.run()
        if options["burst"]:
            self._summary(supervisor.runtime)
        return code

    def _start_up(self, alias: str) -> None:
        """Everything that must hold before the first claim; a signal meanwhile raises StoppedDuringStartUp."""
        _wait_for_database(alias)
        problems = database_problems(connections[alias], for_worker=True)
        if problems:
            raise ValueError(problems[0])
        self._run_checks(alias)
        unapplied = _unapplied_migrations(alias)
        if unapplied:
            flag = "" if alias == "default" else f" --database {alias}"
            raise ValueError(
                f"database {alias!r} lacks the queue's tables or indexes ({', '.join(unapplied)} not applied); "
                f"run manage.py migrate{flag}"
            )

    # --- --reload ------------------------------------------------------------------------------

    def _run_with_reloader(self, options: dict[str, Any]) -> None:
        """Development: Django's autoreloader restarts the process when a module changes.

        The worker runs in the reloader's thread. A change stops it as a signal would (claiming
        stops, handlers are asked to stop, the grace period applies) before the process restarts.
        """
        if options["burst"]:
            raise ValueError("--reload restarts a long-running worker; it does not go with --burst")
        autoreload.file_changed.connect(self._restart_on_change, weak=False)
        # Ctrl-C ends the reloader through KeyboardInterrupt, which a process started in the
        # background would not get: such a process inherits SIGINT ignored.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            autoreload.run_with_reloader(self._run_reloaded, options)
        finally:
            self._stop_reloaded(reason="stopping")

    def _run_reloaded(self, options: dict[str, Any]) -> None:
        self._thread = threading.current_thread()
        try:
            self._run(options, in_main_thread=False)
        except (ValueError, CommandError) as error:
            # The reloader keeps watching: fix the code or the settings and it starts again.
            logger.error("durq: %s", error)

    def _restart_on_change(self, sender: object, file_path: object, **kwargs: Any) -> None:
        logger.info("durq: %s changed; restarting the worker", file_path)
        self._stop_reloaded(reason=f"{file_path} changed")

    def _stop_reloaded(self, reason: str) -> None:
        supervisor, thread = self._supervisor, self._thread
        if supervisor is None or thread is None or not thread.is_alive():
            return
        supervisor.runtime.request_stop(reason)
        supervisor.runtime.shutdown.set()
        thread.join()

    def _run_checks(self, alias: str) -> None:
        """System checks before anything is claimed: errors stop the worker, warnings are logged."""
        messages = [m for m in run_checks(databases=[alias]) if not m.is_silenced()]
        errors = [m for m in messages if m.is_serious()]
        if errors:
            listing = "\n".join(f"  {message}" for message in errors)
            raise CommandError(f"system checks failed; fix these first:\n{listing}", returncode=exit_status.REFUSED)
        for message in messages:
            if message.level >= WARNING:
                logger.warning("%s", message)

    def _queues(self, specs: list[str], settings: Any) -> dict[str, int]:
        known = set(settings.queues) | registry.queues()
        if not specs:
            return {name: queue.concurrency for name, queue in settings.queues.items()}
        queues: dict[str, int] = {}
        for spec in specs:
            name, size = parse_queue_spec(spec, settings.queue(spec.partition(":")[0]).concurrency)
            if name not in known:
                raise ValueError(f"--queue {name!r}: no setting or job names this queue (known: {', '.join(sorted(known))})")
            queues[name] = size
        return queues

    def _progress(self, runtime: Runtime) -> None:
        now = time.monotonic()
        if now - self._last_progress < 0.5:
            return
        self._last_progress = now
        elapsed = max(now - self._started, 1e-9)
        remaining = Job.objects.filter(queue__in=list(self._queue_names)).due(runtime.clock.now_ms()).count()
        self.stdout.write(
            f"\r  {runtime.jobs_done} jobs done, {remaining} due, {runtime.jobs_done / elapsed:,.0f} jobs/s   ", ending=""
        )
        self.stdout.flush()

    def _summary(self, runtime: Runtime) -> None:
        elapsed = time.monotonic() - self._started
        if self.stdout.isatty():
            self.stdout.write("")
        self.stdout.write(f"durq_worker --burst: {runtime.jobs_done} jobs in {elapsed:.1f} s")
        width = max([len(name) for name in runtime.outcomes] + [7])
        for outcome, count in sorted(runtime.outcomes.items()):
            self.stdout.write(f"  {outcome:<{width}}  {count:>8}")


def _wait_for_database(alias: str) -> None:
    """Connect to the queue database, waiting up to DATABASE_PATIENCE_S while it is unreachable."""
    connection = connections[alias]
    started = time.monotonic()
    delay = 0.5
    while True:
        try:
            connection.ensure_connection()
            return
        except DatabaseError as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            if time.monotonic() - started > DATABASE_PATIENCE_S:
                raise CommandError(
                    f"database {alias!r} still unreachable after {DATABASE_PATIENCE_S:g} s: {reason}",
                    returncode=exit_status.DATABASE_UNREACHABLE,
                ) from None
            logger.warning("durq: cannot reach database %r (%s); retrying in %g s", alias, reason, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _unapplied_migrations(alias: str) -> list[str]:
    """django_durq's migrations that database ``alias`` lacks, as ``app.name``, in the order migrate applies them."""
    executor = MigrationExecutor(connections[alias])
    targets = [node for node in executor.loader.graph.leaf_nodes() if node[0] == "django_durq"]
    return [f"{migration.app_label}.{migration.name}" for migration, _backwards in executor.migration_plan(targets)]


def _positive(text: str | None, flag: str, kind: type) -> Any:
    if text is None:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{flag} {text!r} is not a number") from None
    if value <= 0:
        raise ValueError(f"{flag} must be greater than 0, not {text}")
    return value


def _non_negative(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{flag} {text!r} is not a number of seconds") from None
    if value < 0:
        raise ValueError(f"{flag} must be 0 or more seconds")
    return value


def _configure_logging(verbosity: int) -> None:
    logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
