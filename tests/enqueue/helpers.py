"""What the enqueue tests share: the manual clock's start, claims and runs as a worker's slot makes
them, and threads of their own (each with its own database connections) to race in."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

from django_durq.clock import ManualClock
from django_durq.conf import get_settings
from django_durq.db.store import Store
from django_durq.execution.executor import Executor
from django_durq.handlers.context import JobContext
from django_durq.handlers.limits import QueueLimits

START = 1_800_000_000_000  # where the manual clock of tests/enqueue/conftest.py starts


def claim_all(clock: ManualClock, limits: QueueLimits | None = None) -> list[Any]:
    return Store("default").claim("default", 100, clock.now_ms(), "w1", limits, clock)


def run(job: Any, clock: ManualClock) -> str:
    """Run a claimed job as a worker's slot would, before any heartbeat: its outcome, then the count of its end."""
    store = Store("default")
    ctx = JobContext(job, worker_id="w1", store=store, clock=clock, shutdown=threading.Event())
    return Executor(store, get_settings(), clock, "w1").run(job, ctx)


def in_thread(target: Callable[[], None]) -> threading.Thread:
    """Start ``target`` in a thread of its own, which closes its database connections when done."""

    def work() -> None:
        try:
            target()
        finally:
            connections.close_all()

    thread = threading.Thread(target=work)
    thread.start()
    return thread
