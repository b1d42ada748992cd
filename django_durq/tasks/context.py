"""``DurqTaskContext``: Django's ``TaskContext`` with durq's view of the running attempt."""

from __future__ import annotations

import dataclasses
from typing import Any

from asgiref.sync import sync_to_async

from ..handlers.context import JobContext
from .framework import TaskContext

__all__ = ["DurqTaskContext", "task_context"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DurqTaskContext(TaskContext):  # type: ignore[misc]
    """Django's ``TaskContext`` with durq's view of the running attempt.

    ``heartbeat()`` extends the lease now (False once another worker took the task over);
    ``should_stop()`` is True on shutdown, timeout, cancellation or a lost lease;
    ``is_last_attempt()`` is True when a failure now fails the task for good; ``progress()``
    shows progress in the admin. In an ``async def`` task, await ``aheartbeat()`` and
    ``aprogress()``: they write to the database.
    """

    job_context: JobContext = dataclasses.field(repr=False, compare=False)

    def heartbeat(self) -> bool:
        return self.job_context.heartbeat()

    async def aheartbeat(self) -> bool:
        return bool(await sync_to_async(self.job_context.heartbeat)())

    def should_stop(self) -> bool:
        return self.job_context.should_stop()

    def is_last_attempt(self) -> bool:
        return self.job_context.is_last_attempt()

    def progress(self, done: int, total: int | None = None) -> bool:
        return self.job_context.progress(done, total)

    async def aprogress(self, done: int, total: int | None = None) -> bool:
        return bool(await sync_to_async(self.job_context.progress)(done, total))


def task_context(result: Any, ctx: JobContext) -> DurqTaskContext:
    return DurqTaskContext(task_result=result, job_context=ctx)
