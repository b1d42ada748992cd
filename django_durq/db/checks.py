"""What a database must offer the queue, checked before a worker starts and by ``manage.py check``."""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import Problem

MIN_SQLITE = (3, 35, 0)  # RETURNING
MIN_MARIADB = (10, 6, 0)  # SKIP LOCKED, INSERT/DELETE … RETURNING


def sqlite_version() -> tuple[int, ...]:
    import sqlite3  # only on SQLite sites: the module loads the library

    return sqlite3.sqlite_version_info


def is_sqlite_memory(settings_dict: dict[str, Any]) -> bool:
    name = str(settings_dict.get("NAME") or "")
    return name in ("", ":memory:") or "mode=memory" in name


def database_problems(connection: BaseDatabaseWrapper, *, for_worker: bool) -> list[str]:
    """One-line problems that make the database unusable for the queue (empty when fine)."""
    return [problem.message for problem in database_check_problems(connection, for_worker=for_worker)]


def database_check_problems(connection: BaseDatabaseWrapper, *, for_worker: bool) -> list[Problem]:
    """The problems of :func:`database_problems`, each with its check id and a hint."""
    problems: list[Problem] = []
    if connection.vendor == "sqlite":
        if sqlite_version() < MIN_SQLITE:
            found = ".".join(map(str, sqlite_version()))
            problems.append(
                Problem("durq.E009", f"SQLite {found} is too old: django-durq needs 3.35 or newer (UPDATE … RETURNING)", "")
            )
        if for_worker and is_sqlite_memory(connection.settings_dict):
            problems.append(
                Problem(
                    "durq.E009",
                    f"database {connection.alias!r} is an in-memory SQLite database, which no other process can see; "
                    "point NAME at a file",
                    "",
                )
            )
    elif connection.vendor == "mysql":
        try:
            connection.ensure_connection()
        except Exception as error:  # noqa: BLE001 - reported, not raised
            return [Problem("durq.E009", f"cannot connect to database {connection.alias!r}: {error}", "")]
        problem = mysql_family_problem(
            connection.mysql_is_mariadb,  # type: ignore[attr-defined]
            tuple(connection.mysql_version),  # type: ignore[attr-defined]
        )
        if problem is not None:
            problems.append(problem)
    return problems


def listen_problems(queue: BaseDatabaseWrapper, listen: BaseDatabaseWrapper) -> list[Problem]:
    """Why workers would not hear the queue's NOTIFY on ``listen`` (``DURQ["LISTEN_DATABASE"]``); empty when they do."""
    from .postgresql import PROBE_WAIT_S, hears_notifications  # optional: only the vendor in use is loaded

    poll_only = "idle workers would find new jobs only at their poll interval"
    hint = f'Point DURQ["LISTEN_DATABASE"] at the server and database of {queue.alias!r} directly, not through the pooler.'
    try:
        heard = hears_notifications(listen, queue)
    except Exception as error:  # noqa: BLE001 - reported, not raised
        return [Problem("durq.W004", f"cannot LISTEN on database {listen.alias!r} ({error}): {poll_only}", hint)]
    if heard:
        return []
    return [
        Problem(
            "durq.W004",
            f"a session of database {listen.alias!r} that LISTENs did not hear a NOTIFY sent through {queue.alias!r} "
            f"within {PROBE_WAIT_S:g} s, so they are not the same database, or {listen.alias!r} goes through a "
            f"transaction pooler too: {poll_only}",
            hint,
        )
    ]


def pooler_problems(queue: BaseDatabaseWrapper, session: BaseDatabaseWrapper) -> list[Problem]:
    """What goes wrong when ``session`` (``DURQ["LISTEN_DATABASE"]``) goes through a transaction pooler.

    Asks the server (``pooler.lends_sessions``), as every worker does when it starts: a worker
    keeps no session state on such a connection, and works all the same, polling.
    """
    from .pooler import lends_sessions  # optional: PostgreSQL's probe, loaded only where it runs

    where = f"database {session.alias!r}" if session.alias == queue.alias else f'DURQ["LISTEN_DATABASE"] {session.alias!r}'
    without = (
        "workers keep no session state there: no LISTEN, no session lock, no prepared claim. They record their "
        "presence and take the maintenance duties through rows, and an idle worker finds a new job at its poll "
        "interval instead of at once"
    )
    hint = (
        "For wake-ups at once, add an alias of the same database that reaches PostgreSQL directly, not through the "
        'pooler, and name it: DURQ["LISTEN_DATABASE"] = "direct". To poll on purpose, write '
        'DURQ["LISTEN_DATABASE"] = None.'
    )
    try:
        pooled = lends_sessions(session)
    except Exception as error:  # noqa: BLE001 - reported, not raised
        return [Problem("durq.W006", f"cannot tell whether {where} keeps its server sessions ({error}): {without}", hint)]
    if not pooled:
        return []
    problems = [
        Problem(
            "durq.W006",
            f"{where} goes through a transaction pooler, which lends its server sessions to other clients between "
            f"transactions: {without}",
            hint,
        )
    ]
    if session.alias == queue.alias and prepares_statements(queue.settings_dict):
        problems.append(
            Problem(
                "durq.E023",
                f"database {queue.alias!r} prepares statements (OPTIONS server_side_binding and prepare_threshold) and "
                "goes through a transaction pooler, which runs each transaction on any of its server connections: a "
                "statement prepared on one is missing on the next",
                f'Remove "prepare_threshold" from the OPTIONS of {queue.alias!r}. If the pooler is PgBouncer 1.21 or '
                "newer with max_prepared_statements set, it carries them: silence durq.E023.",
            )
        )
    return problems


def mysql_family_problem(is_mariadb: bool, version: tuple[int, ...]) -> Problem | None:
    """Why a server of Django's ``mysql`` backend cannot hold the queue, or None when it can."""
    found = ".".join(map(str, version))
    if not is_mariadb:
        return Problem(
            "durq.E017",
            f"MySQL {found} is not supported: django-durq needs MariaDB 10.6 or newer "
            "(completing a job uses DELETE … RETURNING, which MySQL does not have)",
            "Run the queue on MariaDB 10.6 or newer, or on PostgreSQL or SQLite.",
        )
    if version < MIN_MARIADB:
        return Problem("durq.E009", f"MariaDB {found} is too old: django-durq needs 10.6 or newer (SKIP LOCKED)", "")
    return None


def sqlite_setup_warnings(settings_dict: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(id, message, hint) for a SQLite database set up without the options a busy queue needs."""
    options = settings_dict.get("OPTIONS") or {}
    warnings = []
    init_command = str(options.get("init_command", "")).lower().replace(" ", "")
    if "journal_mode=wal" not in init_command:
        warnings.append(
            (
                "durq.W001",
                f"SQLite database {settings_dict.get('NAME')!r} is not set to WAL mode; in the default rollback "
                "journal a worker and the web app block each other's reads and writes",
                'Add "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;" to OPTIONS.',
            )
        )
    if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
        warnings.append(
            (
                "durq.W002",
                "SQLite transactions are DEFERRED; a transaction that reads then writes fails with "
                '"database is locked" at once instead of waiting for the busy timeout',
                'Add "transaction_mode": "IMMEDIATE" to OPTIONS (Django 5.1 or newer).',
            )
        )
    return warnings


def prepares_statements(settings_dict: dict[str, Any]) -> bool:
    """psycopg prepares repeated statements on this database's connections (docs/postgresql.md).

    Only server-side binding prepares: Django's default client-side cursors never do, and
    Django turns ``prepare_threshold`` off unless ``OPTIONS`` sets it.
    """
    options = settings_dict.get("OPTIONS") or {}
    return options.get("server_side_binding") is True and options.get("prepare_threshold") is not None


def database_now_ms(connection: BaseDatabaseWrapper) -> float | None:
    """The database server's clock in epoch milliseconds, to the microsecond; None where the database shares our host.

    Microseconds, not whole milliseconds: every process places its own reading of this clock, so
    a rounding to the millisecond would put two processes up to a millisecond apart, and a job
    queued by one would look not yet due to another that claims it a moment later.
    """
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp()) * 1000")
        elif connection.vendor == "mysql":
            # UTC_TIMESTAMP less the epoch, in microseconds: plain arithmetic. UNIX_TIMESTAMP(NOW(6))
            # goes through the session's time zone, and in the hour a fall-back repeats it answers an
            # hour early (SYSTEM, or any zone with daylight saving time).
            cursor.execute("SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000")
        else:
            return None
        return float(cursor.fetchone()[0])
