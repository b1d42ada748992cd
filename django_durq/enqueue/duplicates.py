"""An enqueue whose dedupe key is already held: return the holder, changed if it waits and was asked.

``on_duplicate`` (see ``options.ON_DUPLICATE``) decides. ``"keep"`` returns the holder as it
is. ``"replace"`` and ``"reschedule"`` change a holder of the same job type that has not started
(``waiting``, or ``blocked`` in a workflow) in place: one row stays, so the unique index on
``unique_active`` still allows one active job per key, and the enqueue returns the holder's id
with its new values. A running holder is never changed, as its handler may already have read its
arguments; the enqueue then returns it unchanged. The change never touches the status: a blocked
holder takes the new due time as its own and still starts only once its upstream jobs have ended
(at the later of the two).

The holder is found by a plain read; a holder that has not started is then changed by an
``UPDATE`` of its primary key that tests its status and type again, and whose row lock is held to the caller's
commit: on PostgreSQL and MariaDB a claim skips the locked row and takes it after the commit
with the new values. On SQLite the failed insert already took the database's one write lock,
which a claim (one ``UPDATE … RETURNING``) needs too: a claim sees the old row or the new one,
never a mix.

Why no ``SELECT … FOR UPDATE`` on the key: on MariaDB the failed insert leaves a shared lock on
the key's index entry until the caller commits. Upgrading it to an exclusive one deadlocks with
a worker whose ``DELETE`` of the finishing holder waits for that entry, and InnoDB may then roll
back the caller's whole transaction. A running holder is returned without any lock, and the
``UPDATE`` locks the row by its primary key only, so the enqueue never waits for a worker while
it holds that shared lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction

from ..db import dialect_for, wakeup
from ..handlers.options import REPLACE, RESCHEDULE, OnDuplicate

if TYPE_CHECKING:
    from ..models import Job

# What each change takes from the new enqueue's row. The limit columns follow the arguments:
# a Limit's key is computed from them (NULL when the handler has no limit); the expiry follows
# the due time (NULL when the new enqueue has none). Queue, attempts, errors and creation time
# stay the holder's.
_TAKEN = {
    REPLACE: (
        "arguments",
        "priority",
        "run_at_ms",
        "expires_ms",
        "limit_key",
        "limit_running",
        "limit_rate",
        "limit_period_ms",
    ),
    RESCHEDULE: ("run_at_ms", "expires_ms"),
}


def holder(key: str, alias: str) -> Job | None:
    """The active job holding ``key``, marked ``deduplicated``; ``None`` when there is none."""
    from ..models import ACTIVE_STATUSES, Job  # app loading: django_durq imports this module

    found = Job.objects.using(alias).filter(unique_key=key, status__in=ACTIVE_STATUSES).order_by("id").first()
    if found is not None:
        found.deduplicated = True
    return found


def insert_or_change(values: dict[str, Any], alias: str, on_duplicate: OnDuplicate, insert: Callable[[], Job]) -> Job | None:
    """``insert()`` the job or, when its key is held, change the holder as ``on_duplicate`` asks.

    Returns the new job or the holder (``deduplicated``, and ``replaced`` when changed); ``None``
    when the key came free after the insert failed: the caller tries again.
    """
    from ..models import Job, Status  # app loading: django_durq imports this module

    not_started = (Status.WAITING, Status.BLOCKED)
    key = values["unique_key"]
    jobs = Job.objects.using(alias)
    # The outer savepoint lets a lock wait that times out be retried inside a caller's
    # transaction; the inner one undoes the failed insert alone. On MariaDB the turn spans the
    # insert and the change: a failed insert keeps a shared lock on the key's index entry until
    # commit, so with the turn released in between, one enqueuer would wait to lock the row
    # while another, holding a shared lock, waits for the turn: a deadlock InnoDB cannot see.
    with transaction.atomic(using=alias), dialect_for(connections[alias]).dedupe_turn(key):
        try:
            with transaction.atomic(using=alias):
                return insert()
        except IntegrityError:
            pass
        found = jobs.filter(unique_active=key).first()
        if found is None:
            return None
        found.deduplicated = True
        # A key is shared by every job type: another handler's arguments would be wrong for this one.
        if found.status not in not_started or found.name != values["name"]:
            return found
        changes = {column: values.get(column) for column in _TAKEN[on_duplicate]}
        # The write tests the status again, under the row's lock: a claim may have taken the job
        # since the read, and a running job must never change.
        if not jobs.filter(pk=found.pk, status__in=not_started, name=values["name"]).update(**changes):
            # Claimed since the read: return it running, unchanged, still without a lock (a
            # worker may be deleting it). Not started yet means a hand-back, or a snapshot older
            # than the row (REPEATABLE READ): the caller tries again.
            now = jobs.filter(pk=found.pk, unique_active=key).first()
            if now is None or now.status in not_started:
                return None
            now.deduplicated = True
            return now
        if found.status == Status.WAITING and values["run_at_ms"] < found.run_at_ms:
            # Idle workers may be sleeping until the old, later due time.
            wakeup.wake_on_commit(alias, [found.queue])
        # Read back under the lock (on MariaDB a locking read sees the latest row, not the snapshot).
        found = jobs.select_for_update().get(pk=found.pk)
    found.deduplicated = found.replaced = True
    return found
