"""In-process wake-up: an enqueue that commits kicks the idle pools of its queue at once.

Pools subscribe an ``Event`` per queue; ``notify`` sets them. Cross-process wake-up
(PostgreSQL LISTEN, SQLite ``data_version``) lives in ``worker/watcher.py`` and ends up here too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

_lock = threading.Lock()
_subscribers: dict[str, set[threading.Event]] = {}


def subscribe(queue: str, event: threading.Event) -> None:
    with _lock:
        _subscribers.setdefault(queue, set()).add(event)


def unsubscribe(queue: str, event: threading.Event) -> None:
    with _lock:
        _subscribers.get(queue, set()).discard(event)


def notify(queues: Iterable[str]) -> None:
    with _lock:
        events = [event for queue in queues for event in _subscribers.get(queue, ())]
    for event in events:
        event.set()


def notify_all() -> None:
    with _lock:
        events = [event for events in _subscribers.values() for event in events]
    for event in events:
        event.set()
