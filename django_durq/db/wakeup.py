"""Wake-up on commit: an enqueue kicks the idle pools of its queue, in this process and others.

Pools subscribe a callback per queue. ``notify`` names the queues that got a job, so their
pools may claim without probing first; ``offer`` does the same for one job and says whether a
pool had a free slot for it; ``notify_all`` (a commit somewhere, or a watcher that reconnected)
only says "look". Other processes hear of a commit through PostgreSQL's ``NOTIFY`` or, on the
same host, a ring of their bell (``db/doorbell.py``); ``worker/watcher.py`` turns both into calls here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

from . import dialect_for, doorbell

# Called with True when a notification named the queue; returns whether the pool has a free slot
# for one more job (it then claims at once).
Wake = Callable[[bool], object]

_lock = threading.Lock()
_subscribers: dict[str, set[Wake]] = {}


def subscribe(queue: str, wake: Wake) -> None:
    with _lock:
        _subscribers.setdefault(queue, set()).add(wake)


def unsubscribe(queue: str, wake: Wake) -> None:
    with _lock:
        _subscribers.get(queue, set()).discard(wake)


def subscribed() -> list[str]:
    """The queues that have a pool in this process, sorted."""
    with _lock:
        return sorted(queue for queue, wakes in _subscribers.items() if wakes)


def notify(queues: Iterable[str]) -> None:
    with _lock:
        wakes = [wake for queue in queues for wake in _subscribers.get(queue, ())]
    for wake in wakes:
        wake(True)


def offer(queue: str) -> bool:
    """One job of ``queue`` was queued: wake its pools here; True when one has a free slot for it."""
    with _lock:
        wakes = list(_subscribers.get(queue, ()))
    taken = False
    for wake in wakes:
        taken = bool(wake(True)) or taken
    return taken


def after_commit(alias: str, queues: Sequence[str], jobs: int | None = None) -> None:
    """Wake workers for ``jobs`` (None: any number of) jobs of ``queues`` that were just committed.

    This process's pools first; then workers on this host through their bells, one per job (none
    when the job is one and a pool here has room for it). PostgreSQL's ``NOTIFY`` is sent with
    the insert itself (see ``wake_on_commit``).
    """
    if jobs == 1 and len(queues) == 1 and offer(queues[0]):
        return
    if jobs != 1:
        notify(queues)
    doorbell.ring(alias, queues, jobs)


def notify_all() -> None:
    with _lock:
        wakes = [wake for wakes in _subscribers.values() for wake in wakes]
    for wake in wakes:
        wake(False)


def wake_on_commit(alias: str, queues: Sequence[str], jobs: int | None = None) -> None:
    """Wake idle workers of ``queues`` once the current transaction commits (at once in autocommit).

    Other processes' workers through the database where it can notify (PostgreSQL), and through
    :func:`after_commit` those of this process and of this host. ``jobs``: how many jobs the
    transaction made due, when known.
    """
    from django.db import connections, transaction

    dialect = dialect_for(connections[alias])
    if dialect.supports_notify:
        dialect.notify(queues)
    transaction.on_commit(lambda: after_commit(alias, queues, jobs), using=alias)
