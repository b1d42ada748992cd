"""The ``DURQ`` setting, parsed once into one typed object.

Problems are collected rather than raised, so that ``manage.py check`` can report every one of
them with a stable id (see ``checks.py``); a field that fails to parse keeps its default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from ..clock import seconds_to_ms
from ..handlers.backoff import Backoff
from .queues import DEFAULT_QUEUE, QueueSettings, parse_queues
from .tasks import durq_backend_configured

# How long finished jobs stay visible (admin, ``manage.py durq``) unless KEEP_FINISHED says
# otherwise, so "did my job run, when, for how long" has an answer. An hour of history is at most
# 1,000,000 rows up to ~280 jobs/s sustained, the size at which docs/benchmarks.md measures the
# claim and the drain; busier queues set a shorter window (docs/cron.md, "Retention").
DEFAULT_KEEP_FINISHED_MS = 3600 * 1000
# How long finished jobs are kept when a TASKS backend reads results from them and KEEP_FINISHED
# is not set: a day covers a result read back by the next request, a retried page or a daily report.
TASK_RESULTS_KEEP_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class Problem:
    id: str
    message: str
    hint: str


@dataclass(frozen=True)
class MonitoringSettings:
    """Who may read the health and metrics views, and when health answers 503."""

    token: str | None = None
    public: bool = False
    max_wait_ms: int = 300_000
    min_workers: int = 1


@dataclass(frozen=True)
class DurqSettings:
    database: str = "default"
    # The alias a PostgreSQL worker LISTENs on for enqueues: the queue's own database unless
    # DURQ["LISTEN_DATABASE"] names a direct connection (the queue's goes through a transaction
    # pooler); None when it names none, and idle workers find new jobs by polling alone.
    listen_database: str | None = "default"
    queues: dict[str, QueueSettings] = field(default_factory=lambda: {DEFAULT_QUEUE: QueueSettings()})
    lease_ms: int = 60_000
    heartbeat_interval_ms: int = 10_000
    poll_interval_ms: int | None = None  # None: chosen by the worker (see worker/runtime.py)
    max_attempts: int = 5
    backoff: Backoff = field(default_factory=Backoff)
    max_payload_bytes: int = 1_048_576
    keep_finished_ms: int = DEFAULT_KEEP_FINISHED_MS
    keep_dead_ms: int | None = None
    shutdown_grace_ms: int = 30_000
    timeout_ms: int | None = None
    prefetch_ms_default: int = 20
    max_handbacks: int = 10
    # PostgreSQL: a claim that is its own transaction waits for its WAL flush too (see db/postgresql.py).
    durable_claims: bool = False
    schedules: dict[str, Any] = field(default_factory=dict)
    test_hooks_dir: str | None = None
    monitoring: MonitoringSettings = field(default_factory=MonitoringSettings)
    modules: tuple[str, ...] = ()
    problems: tuple[Problem, ...] = ()

    def queue(self, name: str) -> QueueSettings:
        return self.queues.get(name, QueueSettings())

    def prefetch_ms(self, queue: str) -> int:
        """How much work (in the pool's measured job time) a pool of ``queue`` may claim beyond its free slots."""
        own = self.queue(queue).prefetch_ms
        return own if own is not None else self.prefetch_ms_default


KNOWN_KEYS = {
    "DATABASE",
    "LISTEN_DATABASE",
    "QUEUES",
    "LEASE",
    "HEARTBEAT_INTERVAL",
    "POLL_INTERVAL",
    "MAX_ATTEMPTS",
    "BACKOFF",
    "MAX_PAYLOAD_BYTES",
    "KEEP_FINISHED",
    "KEEP_DEAD",
    "SHUTDOWN_GRACE",
    "TIMEOUT",
    "PREFETCH",
    "MAX_HANDBACKS",
    "DURABLE_CLAIMS",
    "SCHEDULES",
    "TEST_HOOKS_DIR",
    "MONITORING",
    "MODULES",
}


class _Parser:
    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        self.problems: list[Problem] = []

    def problem(self, id_: str, message: str, hint: str) -> None:
        self.problems.append(Problem(id_, message, hint))

    def duration_ms(self, key: str, default_ms: int | None, *, allow_none: bool = False, minimum_ms: int = 1) -> Any:
        if key not in self.raw:
            return default_ms
        value = self.raw[key]
        if value is None and allow_none:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)):
            self.problem(
                "durq.E002",
                f'DURQ["{key}"] is {value!r}; expected a number of seconds or a timedelta',
                f'Write for example DURQ["{key}"] = 30 or timedelta(seconds=30).',
            )
            return default_ms
        ms = seconds_to_ms(value)
        if ms < minimum_ms:
            self.problem(
                "durq.E002",
                f'DURQ["{key}"] is {value!r}; it must be at least {minimum_ms / 1000:g} seconds',
                f'Write a positive duration, for example DURQ["{key}"] = 30.',
            )
            return default_ms
        return ms

    def positive_int(self, container: dict[str, Any], key: str, default: int, label: str) -> int:
        if key not in container:
            return default
        value = container[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.problem(
                "durq.E003",
                f"{label} is {value!r}; expected a whole number of at least 1",
                f"Write for example {label} = {default}.",
            )
            return default
        return value


def parse(raw: Any, *, results_read: bool = False) -> DurqSettings:
    """A :class:`DurqSettings` from the raw ``DURQ`` value, with every problem recorded.

    ``results_read``: a task backend reads results from finished jobs, so unless ``KEEP_FINISHED``
    says otherwise they are kept for ``TASK_RESULTS_KEEP_MS`` rather than ``DEFAULT_KEEP_FINISHED_MS``.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        return DurqSettings(
            problems=(Problem("durq.E001", f"DURQ is {type(raw).__name__}; expected a dict", "Write DURQ = {...}."),)
        )
    p = _Parser(raw)
    for key in sorted(set(raw) - KNOWN_KEYS):
        p.problem("durq.E001", f'DURQ has an unknown key "{key}"', f"Known keys: {', '.join(sorted(KNOWN_KEYS))}.")

    database = raw.get("DATABASE", "default")
    if not isinstance(database, str):
        p.problem("durq.E004", f'DURQ["DATABASE"] is {database!r}; expected a database alias', 'Write "default".')
        database = "default"
    listen_database = raw.get("LISTEN_DATABASE", database)
    if listen_database is not None and not isinstance(listen_database, str):
        p.problem(
            "durq.E021",
            f'DURQ["LISTEN_DATABASE"] is {listen_database!r}; expected a database alias or None',
            'Write the alias of a connection straight to PostgreSQL, for example "direct", or None to poll only.',
        )
        listen_database = database

    defaults = DurqSettings()
    lease_ms = p.duration_ms("LEASE", defaults.lease_ms)
    heartbeat_ms = p.duration_ms("HEARTBEAT_INTERVAL", defaults.heartbeat_interval_ms)
    if heartbeat_ms * 2 > lease_ms:
        p.problem(
            "durq.E005",
            f'DURQ["LEASE"] ({lease_ms / 1000:g} s) must be at least twice DURQ["HEARTBEAT_INTERVAL"] '
            f"({heartbeat_ms / 1000:g} s), or one late heartbeat loses the lease",
            "Raise LEASE or lower HEARTBEAT_INTERVAL; three heartbeats per lease is a good ratio.",
        )
    poll_ms = p.duration_ms("POLL_INTERVAL", defaults.poll_interval_ms, allow_none=True, minimum_ms=10)
    grace_ms = p.duration_ms("SHUTDOWN_GRACE", defaults.shutdown_grace_ms, minimum_ms=0)
    timeout_ms = p.duration_ms("TIMEOUT", None, allow_none=True)
    keep_finished_default = TASK_RESULTS_KEEP_MS if results_read else DEFAULT_KEEP_FINISHED_MS
    keep_finished_ms = p.duration_ms("KEEP_FINISHED", keep_finished_default, minimum_ms=0)
    keep_dead_ms = p.duration_ms("KEEP_DEAD", None, allow_none=True, minimum_ms=0)
    prefetch_ms = p.duration_ms("PREFETCH", defaults.prefetch_ms_default, minimum_ms=0)
    max_attempts = p.positive_int(raw, "MAX_ATTEMPTS", defaults.max_attempts, 'DURQ["MAX_ATTEMPTS"]')
    max_handbacks = p.positive_int(raw, "MAX_HANDBACKS", defaults.max_handbacks, 'DURQ["MAX_HANDBACKS"]')
    max_payload = p.positive_int(raw, "MAX_PAYLOAD_BYTES", defaults.max_payload_bytes, 'DURQ["MAX_PAYLOAD_BYTES"]')
    durable_claims = raw.get("DURABLE_CLAIMS", defaults.durable_claims)
    if not isinstance(durable_claims, bool):
        p.problem(
            "durq.E024",
            f'DURQ["DURABLE_CLAIMS"] is {durable_claims!r}; expected True or False',
            'Write DURQ["DURABLE_CLAIMS"] = True to make every claim wait for its flush on PostgreSQL.',
        )
        durable_claims = defaults.durable_claims

    backoff = _parse_backoff(p, raw.get("BACKOFF", {}))
    queues = parse_queues(p, raw.get("QUEUES"))

    schedules = raw.get("SCHEDULES", {})
    if not isinstance(schedules, dict):
        p.problem("durq.E006", 'DURQ["SCHEDULES"] must be a dict of name -> schedule', "See docs/cron.md.")
        schedules = {}
    hooks = raw.get("TEST_HOOKS_DIR")
    monitoring = _parse_monitoring(p, raw.get("MONITORING", {}))
    modules = _parse_modules(p, raw.get("MODULES", []))
    return DurqSettings(
        database=database,
        listen_database=listen_database,
        queues=queues,
        lease_ms=lease_ms,
        heartbeat_interval_ms=heartbeat_ms,
        poll_interval_ms=poll_ms,
        max_attempts=max_attempts,
        backoff=backoff,
        max_payload_bytes=max_payload,
        keep_finished_ms=keep_finished_ms,
        keep_dead_ms=keep_dead_ms,
        shutdown_grace_ms=grace_ms,
        timeout_ms=timeout_ms,
        prefetch_ms_default=prefetch_ms,
        max_handbacks=max_handbacks,
        durable_claims=durable_claims,
        schedules=schedules,
        test_hooks_dir=str(hooks) if hooks else None,
        monitoring=monitoring,
        modules=modules,
        problems=tuple(p.problems),
    )


def _parse_modules(p: _Parser, raw: Any) -> tuple[str, ...]:
    """Dotted paths of modules imported at start-up, like each app's jobs.py."""
    valid = isinstance(raw, (list, tuple)) and all(
        isinstance(path, str) and path and all(part.isidentifier() for part in path.split(".")) for path in raw
    )
    if not valid:
        p.problem(
            "durq.E016",
            f'DURQ["MODULES"] is {raw!r}; expected a list of dotted module paths',
            'Write for example DURQ["MODULES"] = ["billing.handlers"].',
        )
        return ()
    return tuple(raw)


def _parse_monitoring(p: _Parser, raw: Any) -> MonitoringSettings:
    default = MonitoringSettings()
    if not isinstance(raw, dict):
        p.problem("durq.E015", 'DURQ["MONITORING"] must be a dict', 'Write {"TOKEN": os.environ["DURQ_MONITORING_TOKEN"]}.')
        return default
    unknown = set(raw) - {"TOKEN", "PUBLIC", "MAX_WAIT", "MIN_WORKERS"}
    if unknown:
        p.problem(
            "durq.E015", f'DURQ["MONITORING"] has unknown keys {sorted(unknown)}', "Known: TOKEN, PUBLIC, MAX_WAIT, MIN_WORKERS."
        )
    token = raw.get("TOKEN")
    if token is not None and (not isinstance(token, str) or len(token) < 16):
        p.problem(
            "durq.E015",
            'DURQ["MONITORING"]["TOKEN"] must be a string of at least 16 characters',
            "Generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'.",
        )
        token = None
    public = raw.get("PUBLIC", False)
    if not isinstance(public, bool):
        p.problem(
            "durq.E015",
            'DURQ["MONITORING"]["PUBLIC"] must be True or False',
            "Write False unless only a private network reaches it.",
        )
        public = False
    sub = _Parser(raw)
    max_wait_ms = sub.duration_ms("MAX_WAIT", default.max_wait_ms)
    min_workers = raw.get("MIN_WORKERS", default.min_workers)
    if isinstance(min_workers, bool) or not isinstance(min_workers, int) or min_workers < 0:
        p.problem("durq.E015", f'DURQ["MONITORING"]["MIN_WORKERS"] is {min_workers!r}; expected a whole number >= 0', "Write 1.")
        min_workers = default.min_workers
    p.problems.extend(sub.problems)
    return MonitoringSettings(token=token, public=public, max_wait_ms=max_wait_ms, min_workers=min_workers)


def _parse_backoff(p: _Parser, raw: Any) -> Backoff:
    default = Backoff()
    if not isinstance(raw, dict):
        p.problem("durq.E007", 'DURQ["BACKOFF"] must be a dict', 'Write {"base": 2, "factor": 2, "max": 3600, "jitter": 0.2}.')
        return default
    unknown = set(raw) - {"base", "factor", "max", "jitter"}
    if unknown:
        p.problem("durq.E007", f'DURQ["BACKOFF"] has unknown keys {sorted(unknown)}', "Known: base, factor, max, jitter.")
    try:
        backoff = Backoff(
            base_ms=seconds_to_ms(raw.get("base", default.base_ms / 1000)),
            factor=float(raw.get("factor", default.factor)),
            max_ms=seconds_to_ms(raw.get("max", default.max_ms / 1000)),
            jitter=float(raw.get("jitter", default.jitter)),
        )
    except (TypeError, ValueError):
        p.problem("durq.E007", f'DURQ["BACKOFF"] = {raw!r} has a value that is not a number', "Use numbers of seconds.")
        return default
    if backoff.base_ms < 0 or backoff.factor < 1 or backoff.max_ms < backoff.base_ms or not 0 <= backoff.jitter < 1:
        p.problem(
            "durq.E007",
            f'DURQ["BACKOFF"] = {raw!r} is out of range',
            "Need base >= 0, factor >= 1, max >= base and 0 <= jitter < 1.",
        )
        return default
    return backoff


_cached: DurqSettings | None = None


def get_settings() -> DurqSettings:
    """The parsed ``DURQ`` setting, built on first use and rebuilt when the setting changes."""
    global _cached
    if _cached is None:
        from django.conf import settings

        # Only TASKS says whether results are read (and so how long finished jobs are kept).
        _cached = parse(getattr(settings, "DURQ", None), results_read=durq_backend_configured())
    return _cached


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting in ("DURQ", "TASKS"):
        _cached = None
