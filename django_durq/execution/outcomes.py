"""What an attempt ends in: the outcomes a worker counts, a failure as recorded, and the fields of its log lines."""

from __future__ import annotations

import json
import logging
import traceback
from dataclasses import dataclass
from typing import Any

from django.dispatch import Signal

from ..clock import ms_to_datetime
from ..db import ClaimedJob
from ..handlers.context import JobContext
from ..signals import send

# One line per job outcome (finished with its duration, failed, dead, cancelled, expired, handed
# back), with the job's id, name, queue and attempt as structured ``extra`` fields. Every other
# line about one job carries the same fields. A line quotes a message whole, never cut.
jobs_log = logging.getLogger("django_durq.jobs")

MAX_TRACEBACK_CHARS = 20_000
MAX_MESSAGE_CHARS = 2_000

# Outcomes, as counted by the worker.
FINISHED = "finished"
RETRYING = "retrying"
DEAD = "dead"
RELEASED = "released"
CANCELLED_OUTCOME = "cancelled"
LOST = "lost"
EXPIRED = "expired"  # claimed after its expiry: ended cancelled, never started
ABANDONED = "abandoned"  # another recorder (a timeout) settled this attempt first
UNKNOWN_TYPE = "unknown type"  # handed back: this process has no handler for the job's type
PAUSED = "paused"  # its queue was found paused right before its handler would start: never started


@dataclass
class Completion:
    """A finished attempt whose completion a worker pool commits in a batch."""

    result: Any  # the handler's return value, for job_finished
    keep: bool  # keep the finished row (retention on) rather than delete it
    stored: str | None  # the result as stored when kept
    finished_ms: int


@dataclass
class Failure:
    kind: str  # exception, timeout, unknown_job, decode, arguments, lease_expired, worker_lost, retry
    message: str
    type: str = ""
    traceback: str = ""
    retry_at_ms: int | None = None
    final: bool = False
    error: BaseException | None = None  # the exception itself (a Retry too), for receivers and log handlers


def _send_each(signal: Signal, sender: Any, each: list[dict[str, Any]]) -> None:
    for kwargs in each:
        send(signal, sender, **kwargs)


def _iso(ms: int | None) -> str:
    moment = ms_to_datetime(ms)
    return moment.isoformat(timespec="milliseconds") if moment is not None else "?"


def log_extra(job: ClaimedJob) -> dict[str, Any]:
    """The structured fields of every log line about one attempt of a job."""
    return {"job_id": job.id, "job_name": job.name, "queue": job.queue, "attempt": job.attempts}


def _announced(job: ClaimedJob, ctx: JobContext) -> dict[str, Any]:
    """What ``job_prerun`` and ``job_postrun`` say about the attempt."""
    return {"job_id": job.id, "name": job.name, "queue": job.queue, "attempt": job.attempts, "ctx": ctx}


def _exc_info(failure: Failure) -> tuple[type[BaseException], BaseException, Any] | None:
    error = failure.error
    if error is None or failure.kind == "retry":
        return None  # a Retry the handler asked for is no error to trace
    return (type(error), error, error.__traceback__)


def error_list(text: str) -> list[dict[str, Any]]:
    # Most jobs have no errors: skip the JSON parse on the hot path.
    return [] if not text or text == "[]" else list(json.loads(text))


def _safe_str(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the failure
        try:
            text = repr(error)
        except Exception:  # noqa: BLE001
            text = f"<unprintable {type(error).__name__}>"
    return text or type(error).__name__


def _type_path(error: BaseException) -> str:
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _traceback(error: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(error))
    except Exception:  # noqa: BLE001
        return f"{_type_path(error)}: <traceback unavailable>"
