"""The PostgreSQL watcher hears every notification, even one that arrives while it checks its connection.

An idle watcher runs ``SELECT 1`` every ``LISTEN_CHECK_S`` to notice a dead connection. A NOTIFY that
reaches the socket while that statement runs is read by the driver as part of the statement's
reply, not by the watcher's wait for notifications: it must still wake the pools.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest
from django.db import connections

from django_durq.db import wakeup
from django_durq.db.base import own_connection
from django_durq.db.postgresql import NOTIFY_CHANNEL
from django_durq.models import WorkerProcess
from django_durq.worker import watcher as watcher_module
from django_durq.worker.watcher import Watcher
from tests.conftest import db_vendor, wait_until
from tests.ledger import jobs
from tests.ledger.models import Effect

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(db_vendor() != "postgres", reason="LISTEN/NOTIFY is PostgreSQL's"),
]

QUEUE = "listen-check"


class NotifiedDuringIdleCheck:
    """The watcher's own connection; before its first idle check, another session sends a NOTIFY.

    The pause lets the notification reach the socket, so the driver reads it while executing
    the check, exactly as when the two cross on the wire.
    """

    def __init__(self, raw: Any, notifier: Any) -> None:
        object.__setattr__(self, "_raw", raw)
        object.__setattr__(self, "_notifier", notifier)
        object.__setattr__(self, "checks", 0)

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        if sql == "SELECT 1":
            object.__setattr__(self, "checks", self.checks + 1)
            if self.checks == 1:
                self._notifier.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, QUEUE))
                time.sleep(0.2)
        return self._raw.execute(sql, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._raw, name, value)


def test_a_notification_that_arrives_during_the_idle_check_wakes_the_pools(monkeypatch):
    notifier = own_connection(connections["default"])
    notifier.autocommit = True
    listening: list[NotifiedDuringIdleCheck] = []

    def connect(wrapper: Any) -> NotifiedDuringIdleCheck:
        listening.append(NotifiedDuringIdleCheck(own_connection(wrapper), notifier))
        return listening[-1]

    monkeypatch.setattr(watcher_module, "own_connection", connect)
    monkeypatch.setattr(watcher_module, "LISTEN_CHECK_S", 1.0)
    named = threading.Event()

    def wake(was_named: bool) -> None:
        if was_named:
            named.set()

    wakeup.subscribe(QUEUE, wake)
    watcher = Watcher("default", "default")
    watcher.start()
    try:
        # The first idle check comes a second after the LISTEN; the notification rides on it.
        assert named.wait(5), f"the notification was lost ({listening[0].checks if listening else 0} idle check(s) ran)"
        assert listening[0].checks >= 1  # it was heard through the idle check, not before it
    finally:
        watcher.stop()
        wakeup.unsubscribe(QUEUE, wake)
        notifier.close()


@pytest.mark.processes
def test_a_worker_hears_notifications_without_a_driver_warning(spawn_worker):
    """psycopg warns when ``notifies()`` and notify handlers share a connection: the watcher uses one way only."""
    worker = spawn_worker("--queue", "default:1", env={"DURQ_TEST_POLL": "30", "PYTHONWARNINGS": "default"})
    wait_until(lambda: WorkerProcess.objects.filter(pid=worker.pid).exists(), 60, "registration")
    time.sleep(0.5)  # the watcher's LISTEN
    for turn in range(3):  # with a 30 s poll interval, only a notification starts these in time
        job = jobs.effect.enqueue(tag=f"heard{turn}")
        wait_until(lambda job=job: Effect.objects.filter(job_id=job.pk).exists(), 10, "the notification to wake the worker")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()
    assert "Warning" not in worker.output(), worker.output()
