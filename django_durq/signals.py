"""Signals django-durq sends, and how it sends them."""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_durq")

# Sent when a job becomes a dead letter, with job_id, name, queue and errors (every attempt's).
# When a handler's exception made it one, sys.exc_info() in a receiver is that exception.
job_dead = Signal()

# Sent when a job finished and its completion is recorded, with job_id, name, queue and result
# (the handler's return value).
job_finished = Signal()


def send(signal: Signal, sender: Any, error: BaseException | None = None, **kwargs: Any) -> None:
    """Send ``signal`` in this thread; receivers' errors are logged, never raised.

    With ``error``, receivers run inside an ``except`` block handling it, so that
    ``sys.exc_info()`` (and logging's ``exc_info=True``) in a receiver is the job's own error.
    """
    if not signal.has_listeners(sender):
        return
    if error is None:
        responses = signal.send_robust(sender=sender, **kwargs)
    else:
        try:
            raise error
        except BaseException:  # noqa: BLE001 - raised only so that receivers see it in sys.exc_info()
            responses = signal.send_robust(sender=sender, **kwargs)
    for receiver, response in responses:
        if isinstance(response, Exception):
            logger.error("durq: a signal receiver (%r) raised", receiver, exc_info=response)
