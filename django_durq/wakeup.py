"""In-process wake-up: an enqueue that commits kicks the idle pools of its queue at once.

Pools subscribe a callback per queue. ``notify`` names the queues that got a job, so their
pools may claim without probing first; ``notify_all`` (a commit somewhere, or a watcher that
reconnected) only says "look". Cross-process wake-up
(PostgreSQL LISTEN, SQLite ``data_version``) lives in ``worker/watcher.py`` and ends up here too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

Wake = Callable[[bool], None]  # called with True when a notification named the queue

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


def notify_all() -> None:
    with _lock:
        wakes = [wake for wakes in _subscribers.values() for wake in wakes]
    for wake in wakes:
        wake(False)


def wake_on_commit(alias: str, queues: Sequence[str]) -> None:
    """Wake idle workers of ``queues`` once the current transaction commits (at once in autocommit).

    Other processes' workers through the database where it can notify (PostgreSQL), this
    process's through :func:`notify`; SQLite's and MariaDB's watchers notice commits themselves.
    """
    from django.db import connections, transaction

    from .db import dialect_for

    dialect = dialect_for(connections[alias])
    if dialect.supports_notify:
        dialect.notify(queues)
    transaction.on_commit(lambda: notify(queues), using=alias)
