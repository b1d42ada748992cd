"""Signal receivers run here, on one thread of their own, after the outcome they announce is recorded.

A receiver is user code: a webhook that takes seconds, an error tracker, a ``task_finished``
handler. Run on a slot, the dispatcher or the monitor, it would hold up claims, completions or
timeouts; here it delays only the receivers after it. Events wait in a bounded queue: when
receivers fall that far behind, the threads that announce outcomes wait for room (leases are
kept meanwhile by the lease keeper, which never announces anything).

A failure is announced inside an ``except`` block that re-raises the handler's own exception,
so ``sys.exc_info()`` in a receiver is the error that failed the job, as logging integrations
expect.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from django.db import close_old_connections, connections
from django.dispatch import Signal

from ..conf import hooks
from ..signals import send

logger = logging.getLogger("django_durq")

MAX_PENDING = 10_000

_STOP = object()


class Events:
    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=MAX_PENDING)
        self._thread = threading.Thread(target=self._loop, name="durq-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (for up to ``timeout_s``), then end the thread."""
        self._queue.put(_STOP)
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():
            logger.warning("durq: signal receivers still busy at exit; %d event(s) not sent", self._queue.qsize())

    def emit(self, signal: Signal, sender: Any, error: BaseException | None = None, **kwargs: Any) -> None:
        if signal.has_listeners(sender):
            self._queue.put((signal, sender, error, [kwargs]))

    def emit_many(self, signal: Signal, sender: Any, each: list[dict[str, Any]]) -> None:
        """One announcement per item of ``each``, queued as one event (a batch of completions)."""
        if each and signal.has_listeners(sender):
            self._queue.put((signal, sender, None, each))

    def _loop(self) -> None:
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                signal, sender, error, each = item
                for kwargs in each:
                    hooks.jitter("receiver")
                    send(signal, sender, error, **kwargs)
                close_old_connections()
        finally:
            connections.close_all()
