"""System checks ``durq.E001…`` / ``durq.W001…``: each says what to write instead.

| id        | what                                                        |
|-----------|-------------------------------------------------------------|
| durq.E001 | DURQ is not a dict, or has an unknown key                   |
| durq.E002 | a duration setting is not a positive number or timedelta    |
| durq.E003 | a count setting is not a whole number ≥ 1                   |
| durq.E004 | DURQ["DATABASE"] names no configured database               |
| durq.E005 | a lease is shorter than two heartbeat intervals              |
| durq.E006 | DURQ["SCHEDULES"] is malformed                              |
| durq.E007 | DURQ["BACKOFF"] is malformed                                |
| durq.E008 | DURQ["QUEUES"] is malformed                                 |
| durq.E009 | the database cannot run the queue (too old, unsupported)    |
| durq.E010 | a schedule's cron expression or interval is bad, or missing   |
| durq.E011 | a schedule's time zone is not an IANA time zone             |
| durq.E012 | a schedule names a job that is not registered               |
| durq.E013 | a schedule's options or arguments are malformed, or it is declared twice |
| durq.E015 | DURQ["MONITORING"] is malformed (a token shorter than 16 characters) |
| durq.E016 | DURQ["MODULES"] is not a list of dotted module paths          |
| durq.E017 | the queue database is MySQL, not MariaDB                      |
| durq.E020 | the PostgreSQL connection pool is smaller than a worker needs |
| durq.E021 | DURQ["LISTEN_DATABASE"] is not an alias, or names no configured database |
| durq.E022 | DURQ["LISTEN_DATABASE"] where the queue or the named database is not PostgreSQL |
| durq.E023 | prepared statements on a queue database that goes through a transaction pooler (found with --database) |
| durq.W001 | SQLite is not in WAL mode                                   |
| durq.W002 | SQLite transactions are not IMMEDIATE                       |
| durq.W003 | a @job queue that DURQ["QUEUES"] does not name              |
| durq.W004 | the LISTEN_DATABASE connection does not hear the queue's NOTIFY (--database) |
| durq.W006 | where workers would LISTEN goes through a transaction pooler: they poll (--database) |
| durq.W010 | queued jobs of a type no handler in this installation serves (--database) |
| durq.W011 | the MariaDB queue database sets an isolation level other than READ COMMITTED |
| durq.I001 | which claimers the queue's database keeps apart (--deploy)  |
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Info, Warning, register
from django.db import DatabaseError, connections

from .conf import DEFAULT_QUEUE, get_settings
from .db import dialect_for
from .db.checks import database_check_problems, listen_problems, pooler_problems, prepares_statements, sqlite_setup_warnings
from .handlers.registry import registry
from .ops.job_types import unhandled_types
from .schedules import schedule_problems
from .worker.runtime import connections_needed


@register("django_durq")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    settings = get_settings()
    messages: list[CheckMessage] = [Error(p.message, hint=p.hint, id=p.id) for p in settings.problems]
    for definition in registry.all():
        lease_ms = definition.lease_ms or settings.lease_ms
        if lease_ms < 2 * settings.heartbeat_interval_ms:
            messages.append(
                Error(
                    f"job {definition.name!r} has a lease of {lease_ms / 1000:g} s, less than two heartbeat intervals "
                    f"({settings.heartbeat_interval_ms / 1000:g} s each)",
                    hint="Give it a longer lease or lower DURQ['HEARTBEAT_INTERVAL'].",
                    id="durq.E005",
                )
            )
    if settings.database not in django_settings.DATABASES:
        messages.append(
            Error(
                f'DURQ["DATABASE"] is {settings.database!r}, which is not in DATABASES',
                hint=f"Use one of: {', '.join(django_settings.DATABASES)}.",
                id="durq.E004",
            )
        )
        return messages
    connection = connections[settings.database]
    try:
        dialect_for(connection)
    except NotImplementedError as error:
        messages.append(Error(str(error), id="durq.E009"))
        return messages
    if connection.vendor == "sqlite":
        for id_, message, hint in sqlite_setup_warnings(connection.settings_dict):
            messages.append(Warning(message, hint=hint, id=id_))
    pool = (connection.settings_dict.get("OPTIONS") or {}).get("pool")
    needed = connections_needed([queue.concurrency for queue in settings.queues.values()])
    if connection.vendor == "postgresql" and isinstance(pool, dict) and pool.get("max_size", needed) < needed:
        messages.append(
            Error(
                f"the connection pool of database {settings.database!r} has max_size {pool['max_size']}, but a worker "
                f"running every queue in DURQ['QUEUES'] holds up to {needed} connections at once",
                hint=f'Set OPTIONS["pool"]["max_size"] to at least {needed}, or lower the queues\' concurrency.',
                id="durq.E020",
            )
        )
    return messages


@register("django_durq")
def check_listen_database(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A ``LISTEN_DATABASE`` other than the queue's own says the queue's goes through a transaction pooler."""
    settings = get_settings()
    queue_alias, listen_alias = settings.database, settings.listen_database
    if listen_alias == queue_alias or queue_alias not in django_settings.DATABASES:
        return []  # today's behaviour, or durq.E004
    queue_db = connections[queue_alias]
    if queue_db.vendor != "postgresql":
        return [
            Error(
                f'DURQ["LISTEN_DATABASE"] is {listen_alias!r}, but the queue database {queue_alias!r} is '
                f"{queue_db.vendor}: only a worker on PostgreSQL LISTENs for new jobs",
                hint='Remove DURQ["LISTEN_DATABASE"].',
                id="durq.E022",
            )
        ]
    messages: list[CheckMessage] = []
    if listen_alias is not None and listen_alias not in django_settings.DATABASES:
        messages.append(
            Error(
                f'DURQ["LISTEN_DATABASE"] is {listen_alias!r}, which is not in DATABASES',
                hint=f"Add a database that connects straight to the PostgreSQL server of {queue_alias!r}, not "
                f"through the pooler, or use one of: {', '.join(django_settings.DATABASES)}; None polls only.",
                id="durq.E021",
            )
        )
    elif listen_alias is not None and connections[listen_alias].vendor != "postgresql":
        messages.append(
            Error(
                f'DURQ["LISTEN_DATABASE"] is {listen_alias!r}, a {connections[listen_alias].vendor} database; '
                f"workers LISTEN there for the NOTIFY of each enqueue into {queue_alias!r}, on PostgreSQL",
                hint=f"Point it at the PostgreSQL server and database of {queue_alias!r}, not through the pooler.",
                id="durq.E022",
            )
        )
    if prepares_statements(queue_db.settings_dict):
        messages.append(
            Error(
                f"database {queue_alias!r} prepares statements (OPTIONS server_side_binding and prepare_threshold), "
                'but DURQ["LISTEN_DATABASE"] says it goes through a transaction pooler, which runs each '
                "transaction on any of its server connections: a statement prepared on one is missing on the next",
                hint=f'Remove "prepare_threshold" from the OPTIONS of {queue_alias!r}. If the pooler is PgBouncer '
                "1.21 or newer with max_prepared_statements set, it carries them: silence durq.E023.",
                id="durq.E023",
            )
        )
    return messages


@register("django_durq")
def check_queues(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A job on a queue the settings do not name waits for ever under a plain ``durq_worker``."""
    configured = set(get_settings().queues)
    unworked: dict[str, list[str]] = {}
    for definition in registry.all():
        queue = definition.queue or DEFAULT_QUEUE
        if queue not in configured:
            unworked.setdefault(queue, []).append(definition.name)
    return [
        Warning(
            f'queue {queue!r} of job(s) {", ".join(names)} is not in DURQ["QUEUES"], so durq_worker does not work it',
            hint=f'Add "{queue}": {{"concurrency": 4}} to DURQ["QUEUES"], or run a worker with --queue {queue}.',
            id="durq.W003",
        )
        for queue, names in sorted(unworked.items())
    ]


@register("django_durq")
def check_isolation(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """MariaDB: the counts of ends that jobs wait for read what committed before each statement."""
    alias = get_settings().database
    if alias not in django_settings.DATABASES:
        return []  # durq.E004
    config = connections[alias].settings_dict
    level = str((config.get("OPTIONS") or {}).get("isolation_level") or "read committed").lower()
    if "mysql" not in str(config.get("ENGINE", "")) or level == "read committed":
        return []
    return [
        Warning(
            f"database {alias!r} sets the isolation level {level!r}: django-durq counts the ends of the jobs that "
            "others wait for (workflows, after=) with reads that must see every transaction committed before them, "
            "which READ COMMITTED gives; at another level a job can wait for an end already counted as not yet "
            "there, and stay blocked",
            hint=f'Remove "isolation_level" from DATABASES[{alias!r}]["OPTIONS"] (Django\'s default is READ COMMITTED),'
            ' or set it to "read committed".',
            id="durq.W011",
        )
    ]


# Deploy only: a fact about the set-up, not a problem, so ordinary commands do not print it.
@register("django_durq", deploy=True)
def check_exclusivity(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    settings = get_settings()
    if settings.database not in django_settings.DATABASES:
        return []  # durq.E004
    try:
        dialect = dialect_for(connections[settings.database])
    except NotImplementedError:
        return []  # durq.E009
    return [
        Info(
            f"durq: the queue lives in database {settings.database!r} ({dialect.vendor}); "
            f"a job is claimed exclusively across {dialect.exclusivity}",
            id="durq.I001",
        )
    ]


@register("django_durq", "database", deploy=False)
def check_database(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    settings = get_settings()
    if not databases or settings.database not in databases or settings.database not in django_settings.DATABASES:
        return []
    queue_db = connections[settings.database]
    problems = database_check_problems(queue_db, for_worker=False)
    messages: list[CheckMessage] = [Error(problem.message, hint=problem.hint or None, id=problem.id) for problem in problems]
    listen_alias = settings.listen_database
    if (
        problems
        or listen_alias is None
        or listen_alias not in django_settings.DATABASES
        or not queue_db.vendor == connections[listen_alias].vendor == "postgresql"
    ):
        return messages
    # Only a database can tell whether the alias keeps its sessions, and reaches the queue's database.
    found = pooler_problems(queue_db, connections[listen_alias])
    if listen_alias != settings.database:
        found += listen_problems(queue_db, connections[listen_alias])
    messages += [(Error if p.id.startswith("durq.E") else Warning)(p.message, hint=p.hint, id=p.id) for p in found]
    return messages


@register("django_durq", "database")
def check_queued_types(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Jobs queued for a handler that is gone are never run: say so at the deploy that removed it."""
    alias = get_settings().database
    if not databases or alias not in databases or alias not in django_settings.DATABASES:
        return []
    try:
        unhandled = unhandled_types(using=alias)
    except DatabaseError:
        return []  # the tables do not exist yet (migrate runs this before it creates them)
    return [
        Warning(
            f"{count} queued job(s) of type {name!r} in database {alias!r}, which no handler in this installation "
            "serves: they never run. A worker hands each back, attempt not counted, and after an hour makes it a "
            "dead letter that says so",
            hint=f"Register a handler under the name {name!r} again (a @job in an installed app's jobs.py, or a "
            'module in DURQ["MODULES"]), and keep it until those jobs are done; or cancel them (manage.py durq cancel).',
            id="durq.W010",
        )
        for name, count in sorted(unhandled.items())
    ]


@register("django_durq")
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    return [Error(p.message, hint=p.hint, id=p.id) for p in schedule_problems()]
