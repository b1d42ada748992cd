"""Ending jobs that expired before they started: the one a claim found, and the ones no claim reaches.

A job's ``expires_ms`` is the latest moment it may start. Nothing in the claim reads it (the
claim is the same for every job); two writers end an expired job instead, each changing only a
job that has not started:

- the worker that claimed it, before the handler would start (``end_claimed``): fenced by the
  claim's (id, token) like every write after a claim, and giving the claim's attempt back;
- the maintenance sweep (``end_waiting``), for jobs that no claim takes: their queue is paused,
  no worker serves it, a limit holds them back. It locks what it ends (skipping rows a claim holds),
  and its ``UPDATE`` tests ``status = 'waiting'`` again, so a job claimed meanwhile runs or is
  ended by its worker, never both.

Either way the job ends ``cancelled`` with an ``expired`` entry in its errors, and what waits for
it in a workflow is counted in the same transaction (``dependencies.settle``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import transaction

from ..clock import ms_to_datetime
from .dependencies import settle
from .rows import JOB

if TYPE_CHECKING:
    from .base import Dialect, Lease


@dataclass(frozen=True)
class Expired:
    """A waiting job the sweep ended."""

    id: int
    name: str
    queue: str
    attempts: int
    expires_ms: int


def _waiting_expiry(dialect: Dialect) -> tuple[str, str]:
    """The column whose index holds waiting jobs' expiries (migration 0009), and the condition that
    names exactly the rows of that index: a partial index's own predicate, or the virtual column
    that is NULL on every other row (a condition on the status would tempt MariaDB's planner to
    scan the waiting rows instead)."""
    if dialect.partial_indexes:
        return "expires_ms", "status = 'waiting' AND expires_ms IS NOT NULL"
    return "expires_waiting", "expires_waiting IS NOT NULL"


def end_claimed(dialect: Dialect, lease: Lease, now_ms: int, errors: str) -> bool:
    """End a claimed job that expired before its handler started; its attempt is not counted."""
    return (
        dialect.execute(
            f"UPDATE {JOB} SET status = 'cancelled', finished_ms = %s, lease_expires_ms = NULL, attempts = attempts - 1,"
            " errors = %s WHERE status = 'running' AND id = %s AND claim_token = %s",
            [now_ms, errors, lease[0], lease[1]],
        )
        == 1
    )


def next_expiry(dialect: Dialect) -> int | None:
    """The earliest expiry of a waiting job, or None: one read of the expiry index."""
    column, indexed = _waiting_expiry(dialect)
    rows = dialect.fetchall(f"SELECT MIN({column}) FROM {JOB} WHERE {indexed}")
    return rows[0][0] if rows and rows[0][0] is not None else None


def end_waiting(dialect: Dialect, now_ms: int, limit: int) -> list[Expired]:
    """End up to ``limit`` waiting jobs whose expiry has come, earliest first, in one transaction."""
    column, indexed = _waiting_expiry(dialect)
    # Rows a claim holds are skipped, not waited for; where writers are serialized (SQLite) the
    # transaction already holds the only write lock.
    lock = "" if dialect.serialized_writes else " FOR UPDATE SKIP LOCKED"
    with transaction.atomic(using=dialect.connection.alias):
        rows = dialect.fetchall(
            f"SELECT id, name, queue, attempts, expires_ms, errors, dependents FROM {JOB}"
            f" WHERE {indexed} AND {column} <= %s ORDER BY {column} LIMIT %s{lock}",
            [now_ms, limit],
        )
        groups: dict[str, list[int]] = defaultdict(list)
        for job_id, _, _, attempts, expires_ms, errors, _ in rows:
            groups[_with_expiry(errors, attempts, expires_ms, now_ms)].append(job_id)
        for errors, ids in groups.items():
            marks = ", ".join(["%s"] * len(ids))
            dialect.execute(
                f"UPDATE {JOB} SET status = 'cancelled', finished_ms = %s, errors = %s"
                f" WHERE status = 'waiting' AND id IN ({marks})",
                [now_ms, errors, *ids],
            )
        ended = [Expired(row[0], row[1], row[2], row[3], row[4]) for row in rows]
        settle(dialect, now_ms, [row[0] for row in rows if row[6]])  # what waits for them, in this transaction
    return ended


def expiry_message(expires_ms: int) -> str:
    moment = ms_to_datetime(expires_ms)
    return f"expired at {moment.isoformat(timespec='milliseconds') if moment is not None else expires_ms}, before it started"


def _with_expiry(errors: str, attempts: int, expires_ms: int, now_ms: int) -> str:
    """The errors text of a job, with the entry that says it expired."""
    entries: list[Any] = json.loads(errors or "[]")
    entries.append(
        {
            "attempt": attempts,
            "at_ms": now_ms,
            "worker": "",
            "kind": "expired",
            "type": "",
            "message": expiry_message(expires_ms),
            "traceback": "",
        }
    )
    return json.dumps(entries)
