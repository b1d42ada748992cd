"""The exceptions django-durq raises at its boundaries, and the ones handlers raise to steer retries."""

from __future__ import annotations

from datetime import datetime, timedelta


class DurqError(Exception):
    """Base class of every error django-durq raises."""


class InvalidPayload(DurqError, TypeError):
    """Raised by ``enqueue()`` when an argument cannot be stored as JSON.

    ``path`` names where the offending value sits (``kwargs["when"]``, ``args[0][2]``);
    nothing is written when it is raised.
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class UnknownJobType(DurqError, LookupError):
    """Raised by ``enqueue()`` for a job name that no registered handler has."""


class Retry(Exception):
    """Raise inside a handler to reschedule this job explicitly.

    ``after`` is a delay (timedelta or seconds) or an aware datetime. The attempt counts
    toward ``max_attempts`` like any failure, but no traceback is recorded.
    """

    def __init__(self, after: timedelta | float | datetime = 0, reason: str = "") -> None:
        super().__init__(reason or "retry requested")
        self.after = after
        self.reason = reason


class Abort(Exception):
    """Raise inside a handler to send the job straight to the dead letters, without retries."""


class LeaseLost(DurqError):
    """The worker no longer holds this job's lease; its writes are ignored."""
