"""SQLite: no claim waits for a checkpoint; the worker's monitor checkpoints what the worker wrote.

A commit that takes the write-ahead log past its threshold copies the log into the database file
and syncs it before it returns: a few milliseconds, the whole tail of the time from an enqueue
to its start when a claim drew it. The dispatcher's connection leaves that to the monitor. What
is observed is the database file itself: it changes only when a checkpoint copies pages into it.
"""

from __future__ import annotations

import hashlib

import pytest
from django.db import connection

from django_durq.clock import ManualClock
from django_durq.conf import get_settings
from django_durq.db import dialect_for
from django_durq.worker.monitor import Monitor
from django_durq.worker.runtime import Runtime
from tests.conftest import db_vendor
from tests.ledger import jobs

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(db_vendor() != "sqlite", reason="the write-ahead log's checkpoints are SQLite's"),
]


def database_file() -> bytes:
    """A digest of the database file (not its log): it changes only when a checkpoint writes to it."""
    with open(connection.settings_dict["NAME"], "rb") as file:
        return hashlib.sha256(file.read()).digest()


def write_many_pages() -> None:
    """Past SQLite's default threshold of 1,000 pages in the log: any other connection would checkpoint."""
    for _ in range(10):
        jobs.effect.enqueue_many([{"tag": "x" * 2_000} for _ in range(250)])


def test_the_dispatchers_commits_never_checkpoint_and_the_monitor_does():
    dialect_for(connection).prepare_dispatcher_connection()
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # start from an empty log
    before = database_file()
    write_many_pages()
    assert database_file() == before  # every page written is still in the log only
    runtime = Runtime(settings=get_settings(), clock=ManualClock(start_ms=0))
    monitor = Monitor(runtime, [], None)
    monitor.checkpoint()
    assert database_file() == before  # an idle worker that has finished nothing has nothing to checkpoint
    runtime.jobs_done = 1
    monitor.checkpoint()
    assert database_file() != before  # the jobs' pages are in the database file now
    connection.close()  # the next test's connection checkpoints as SQLite does by default


def test_other_connections_keep_checkpointing_by_themselves():
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = database_file()
    write_many_pages()
    assert database_file() != before
