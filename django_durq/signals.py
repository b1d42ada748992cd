"""Signals django-durq sends, and how it sends them.

Two kinds, by the thread they run on (docs/runtime.md):

- ``job_prerun`` and ``job_postrun`` run in the handler's own thread, around the handler alone,
  for what must happen there: a thread-local context, a tracing span, a connection to open or
  close. They hold up the handler (their time counts toward its ``timeout``), never the lease
  keeper. ``job_postrun`` comes before the outcome is recorded, so it cannot tell whether the
  outcome will be (a lost lease discards it).
- ``job_finished`` and ``job_dead`` run on the worker's events thread once the outcome they
  announce is committed: a webhook or an e-mail there delays only the receivers after it.

A receiver that raises, of either kind, is logged with the job and changes nothing: the handler
still runs, the outcome is still recorded, the worker goes on.
"""

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

# Sent in the handler's thread just before the handler runs, with job_id, name, queue, attempt
# (1 on the first run) and ctx (the JobContext the handler gets).
job_prerun = Signal()

# Sent in the handler's thread just after the handler returned or raised, before the outcome is
# recorded, with the same and result (its return value, None when it raised) and error (what it
# raised, a Retry or Abort included; None when it returned). With an error, sys.exc_info() in a
# receiver is that error.
job_postrun = Signal()


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


def send_in_handler_thread(
    signal: Signal, sender: Any, raised: BaseException | None, extra: dict[str, Any], **kwargs: Any
) -> None:
    """Send ``signal`` in this thread, a handler's: whatever a receiver raises is logged with the job
    (``extra``), never raised, ``SystemExit`` and ``KeyboardInterrupt`` included. With ``raised``,
    receivers run inside an ``except`` block handling it, as ``send`` does.

    A receiver that raises one of those two ends the sending (Django's ``send_robust`` stops there),
    so the receivers after it are not called for this job; the log says so.
    """
    traceback = raised.__traceback__ if raised is not None else None
    try:
        if raised is None:
            responses = signal.send_robust(sender=sender, **kwargs)
        else:
            try:
                raise raised
            except BaseException:  # noqa: BLE001 - raised only so that receivers see it in sys.exc_info()
                responses = signal.send_robust(sender=sender, **kwargs)
            finally:
                raised.__traceback__ = traceback  # as the handler raised it, for the log line that follows
    except BaseException as stopped:  # user code must not end the handler's thread
        logger.error(
            "durq: a signal receiver raised %s; the receivers after it were not called for job %s",
            type(stopped).__name__,
            extra.get("job_id"),
            exc_info=stopped,
            extra=extra,
        )
        return
    for receiver, response in responses:
        if isinstance(response, Exception):
            logger.error(
                "durq: a signal receiver (%r) raised for job %s", receiver, extra.get("job_id"), exc_info=response, extra=extra
            )
