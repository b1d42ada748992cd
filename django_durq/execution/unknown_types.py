"""Jobs of a type this process has no handler for: handed back for a worker that has one, never run here.

During a rolling deploy a worker of the former release meets jobs of a type added since. It hands
each back, its attempt not counted, due again a moment later so that a worker of the new release
takes it, and says so once per type in its log. Types are only ever looked up in the registry:
a name stored in a row is never imported.

The first hand-back is noted in the job's history (kind ``unknown_job``, ``counted: false``). The
job then waits longer after each hand-back: a tenth of the time since that note, from 1 s to
5 min, so a type that is gone for good costs a claim per job every few minutes, not a busy loop.
Once no worker that claimed it had its handler for ``UNKNOWN_TYPE_LIMIT_MS`` (an hour), the job
is a dead letter that says so: it never ran, and a retry runs it once a worker has the handler.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..clock import Clock
from ..db.takeover import hand_back_unknown
from ..handlers.registry import WHERE_HANDLERS_LIVE, unknown_job_message

if TYPE_CHECKING:
    from ..db import ClaimedJob, Dialect
    from ..db.store import Store
    from ..handlers.context import JobContext

logger = logging.getLogger("django_durq")

UNKNOWN_TYPE_LIMIT_MS = 3_600_000
MIN_DELAY_MS = 1_000
MAX_DELAY_MS = 300_000
KIND = "unknown_job"

# The types this process has said it does not know: each is logged once.
_logged: set[str] = set()
_logged_lock = threading.Lock()


@dataclass
class Verdict:
    """What to do with one claim of a job of an unknown type."""

    run_at_ms: int  # when it is due again
    errors: str | None  # its history with the first hand-back noted; None: left as it is
    failure_message: str | None  # set once the limit has passed: it is a dead letter saying this


def first_hand_back_ms(errors: list[dict[str, Any]]) -> int | None:
    """When this run of hand-backs began: the note at the end of the history, if that is where it is."""
    if not errors:
        return None
    last = errors[-1]
    if last.get("kind") == KIND and last.get("counted") is False:
        return int(last.get("at_ms") or 0)
    return None


def delay_ms(unknown_for_ms: int) -> int:
    """How long a job waits after a hand-back, once its type has been unknown for that long."""
    return min(max(unknown_for_ms // 10, MIN_DELAY_MS), MAX_DELAY_MS)


class UnknownTypes:
    def __init__(self, store: Store, clock: Clock, worker_id: str) -> None:
        self.store = store
        self.clock = clock
        self.worker_id = worker_id

    def judge(self, job: ClaimedJob, errors: list[dict[str, Any]]) -> Verdict:
        now = self.clock.now_ms()
        first = first_hand_back_ms(errors)
        noted: str | None = None
        if first is None:
            first = now
            note = {
                "attempt": job.attempts,
                "at_ms": now,
                "worker": self.worker_id,
                "kind": KIND,
                "type": "",
                "message": f"unknown job type {job.name!r} in worker {self.worker_id}: handed back for a worker that "
                "has its handler, attempt not counted",
                "traceback": "",
                "counted": False,
            }
            noted = json.dumps([*errors, note])
        if now - first >= UNKNOWN_TYPE_LIMIT_MS:
            message = (
                f"unknown job type {job.name!r}: no worker that claimed it in {UNKNOWN_TYPE_LIMIT_MS // 60_000} minutes "
                f"had a handler for it, so it never ran; {WHERE_HANDLERS_LIVE}. Retry it once a worker has the handler."
            )
            return Verdict(now, None, message)
        self._say_once(job.name)
        return Verdict(now + delay_ms(now - first), noted, None)

    def hand_back(self, dialect: Dialect, job: ClaimedJob, ctx: JobContext, verdict: Verdict) -> bool:
        return hand_back_unknown(dialect, ctx.lease, verdict.run_at_ms, self.clock.now_ms(), verdict.errors)

    @staticmethod
    def _say_once(name: str) -> None:
        with _logged_lock:
            if name in _logged:
                return
            _logged.add(name)
        logger.warning(
            "durq: %s. Its jobs are handed back, attempts not counted, for a worker that has the handler (one of "
            "another release, during a deploy)",
            unknown_job_message(name),
        )
