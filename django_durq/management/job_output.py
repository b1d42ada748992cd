"""How ``manage.py durq`` words jobs: id lists, durations, last errors, a running job's worker and lease, and a job as JSON."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..clock import ms_to_datetime
from ..ops import format_age, local_time

if TYPE_CHECKING:
    from ..models import Job


def id_list(ids: list[int]) -> str:
    if not ids:
        return ""
    shown = ", ".join(str(job_id_) for job_id_ in ids[:20])
    return f" ({shown}{', …' if len(ids) > 20 else ''})"


def due(job: Job) -> str:
    """When it is due; a blocked job is due once its upstream jobs end, at its own due time at the earliest."""
    when = local_time(job.run_at_ms)
    return f"once its upstream jobs end, not before {when}" if job.status == "blocked" else when


def took_s(job: Job) -> float | None:
    """How long the last attempt ran, when it started and ended."""
    if job.started_ms is None or job.finished_ms is None:
        return None
    return max(0, job.finished_ms - job.started_ms) / 1000


def last_error(job: Job) -> str:
    error = job.last_error or {}
    message = f"{error['type']}: " if error.get("type") else ""
    return message + str(error.get("message", ""))


def clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def holder_lines(job: Job, ended: bool, now_ms: int) -> list[str]:
    """Who holds a running job and until when; for an orphan, that its worker has ended."""
    if job.status != "running":
        return []
    expires = job.lease_expires_ms
    if expires is None:
        left = ""
    elif expires > now_ms:
        left = f" (in {format_age(expires - now_ms)})"
    else:
        left = f" ({format_age(now_ms - expires)} ago)"
    worker = f"  worker    {job.claimed_by or '-'}"
    if ended:
        worker += " (ended: the job is orphaned; a running worker takes it over within a second)"
    return [worker, f"  lease     expires {local_time(expires)}{left}"]


def job_dict(job: Job, ended: bool = False) -> dict[str, Any]:
    return {
        "id": job.pk,
        "name": job.name,
        "queue": job.queue,
        "status": job.status,
        "waiting_for": job.deps_left if job.status == "blocked" else None,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "created_at": iso(job.created_ms),
        "due_at": iso(job.run_at_ms),
        "started_at": iso(job.started_ms),
        "ended_at": iso(job.finished_ms),
        "took_s": took_s(job),
        "worker": job.claimed_by or None,
        "lease_expires_at": iso(job.lease_expires_ms) if job.status == "running" else None,
        "orphaned": ended,
        "arguments": json.loads(job.arguments),
        "result": json.loads(job.result) if job.result is not None else None,
        "errors": job.error_list,
    }


def iso(ms: int | None) -> str | None:
    moment = ms_to_datetime(ms)
    return moment.isoformat() if moment is not None else None
