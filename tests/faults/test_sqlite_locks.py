"""SQLite under contention: drains in every journal and transaction mode, lock discipline, a web
app writing to the same file, and an outside process holding the write lock (T01, T04, T05, T26).

SQLite serializes writers. The queue holds no transaction across a handler, probes with a read
before it claims, and waits out "database is locked" inside its own statements (Django's busy
``timeout``, then the store's retries), so none of it reaches a handler or an ERROR line.
"""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection, connections

from django_durq.clock import now_ms
from django_durq.models import Job, WorkerProcess
from tests.conftest import wait_until
from tests.ledger import checker, jobs
from tests.ledger.models import Effect, Order

from .conftest import HEAVY, POLL_S, one_leg, only_on, problems_in, size, sqlite_path, sqlite_probe

pytestmark = [pytest.mark.processes, only_on("sqlite")]

LONG_LEASE = {"DURQ_TEST_LEASE": "30", "DURQ_TEST_HEARTBEAT": "5"}  # rollback-journal tests need L >= 20 s
DELETE_FINISHED = {"DURQ_TEST_KEEP_FINISHED": ""}  # the default: finished jobs are deleted, in batches


@contextmanager
def journal_mode(mode: str) -> Iterator[dict[str, str]]:
    """Put the test database file in ``mode`` (wal or delete); yields the workers' environment for it."""
    options = connection.settings_dict["OPTIONS"]
    saved = options.get("init_command", "")
    init = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;" if mode == "wal" else "PRAGMA journal_mode=DELETE;"
    connections.close_all()
    options["init_command"] = init
    _set_journal(mode)
    try:
        yield {"DURQ_SQLITE_INIT": init}
    finally:
        connections.close_all()
        options["init_command"] = saved
        _set_journal("wal")


def _set_journal(mode: str) -> None:
    raw = sqlite3.connect(sqlite_path(), isolation_level=None, timeout=30)
    try:
        assert raw.execute(f"PRAGMA journal_mode={mode}").fetchone()[0] == mode
    finally:
        raw.close()


MODES = [
    pytest.param(
        journal,
        transactions,
        id=f"{journal}-{transactions.lower()}",
        marks=[] if (journal, transactions) == ("wal", "IMMEDIATE") else [one_leg],
    )
    for journal, transactions in [("wal", "IMMEDIATE"), ("wal", "DEFERRED"), ("delete", "IMMEDIATE"), ("delete", "DEFERRED")]
]


@pytest.mark.parametrize(("journal", "transactions"), MODES)
def test_t01_drain_with_processes_in_every_journal_and_transaction_mode(faults, journal, transactions):
    # A rollback-journal commit waits for the disk (~66 commits/s on the CI machine).
    total, processes = size(600 if journal == "wal" else 300, 10_000), size(4, 8)
    with journal_mode(journal) as env:
        env = {**env, **LONG_LEASE, **DELETE_FINISHED, "DURQ_SQLITE_TRANSACTION_MODE": transactions}
        web = None
        if (journal, transactions) == ("wal", "IMMEDIATE") or HEAVY:
            # T05: the web app writes 50 rows/s to the same file during the drain.
            web = faults.helper("-m", "tests.faults.webapp", "--seconds", "600", "--rate", "50", env=env)
        workers = [faults.spawn("--queue", "default:1", env=env) for _ in range(processes)]
        if web is not None:  # writing before the drain begins, not still starting when it ends
            wait_until(lambda: Order.objects.exists(), 60, "the web app's first insert")
        # Queued once every process is up and idle, so that they all compete for the jobs: a
        # worker that started alone could drain them all before the others had started.
        wait_until(lambda: WorkerProcess.objects.count() == processes, 60, "every worker to register")
        time.sleep(0.5)
        queued = jobs.effect.using(lease=30).enqueue_many([{"tag": "drain"} for _ in range(total)])
        wait_until(lambda: Effect.objects.count() >= total, 240, "the drain")
        wait_until(lambda: not Job.objects.active().exists(), 30, "the last completions")
        for worker in workers:
            assert worker.popen.poll() is None, worker.output()
            worker.signal(signal.SIGTERM)
        for worker in workers:
            assert worker.wait(timeout=30) == 0, worker.output()
        report = None
        if web is not None:
            web.send_signal(signal.SIGTERM)
            out, _ = web.communicate(timeout=30)
            report = json.loads(out.decode().strip().splitlines()[-1])

    verdict = checker.check({row.pk for row in queued})
    assert verdict.exact, verdict
    # No lock error reached a handler and no lease expired: every job ran once, under the token of
    # its first claim (or of a claim after an uncounted hand-back from a buffer, which the workers
    # log), and every completion was recorded (finished jobs are deleted).
    handed_back = sum(
        int(count) for worker in workers for count in re.findall(r"handed back (\d+) buffered job", worker.output())
    )
    assert Effect.objects.exclude(token=1).count() <= handed_back
    assert not Job.objects.exists()
    for worker in workers:
        assert problems_in(worker.output()) == [], worker.output()
    assert len(set(Effect.objects.values_list("pid", flat=True))) >= 2
    if report is not None:
        sys.stderr.write(f"\nT05 web app during the {journal}/{transactions} drain: {report}\n")
        if (journal, transactions) == ("wal", "IMMEDIATE"):
            assert report["inserts"] > 0 and report["locked"] == 0 and report["errors"] == 0, report


@one_leg
def test_t04_no_write_lock_is_held_across_a_handler_or_while_idle(faults):
    # A transaction held across a 3 s handler would keep the write lock for seconds; the probe
    # waits at most 250 ms, longer than any of the queue's own short writes (heartbeats, duties).
    jobs.effect.enqueue_many([{"tag": "held", "sleep": 3.0} for _ in range(4)])
    workers = [faults.spawn("--queue", "default:2") for _ in range(2)]
    wait_until(lambda: Job.objects.running().count() == 4, 60, "four sleeping handlers")
    busy = []
    while Job.objects.active().exists():
        busy.append(sqlite_probe(timeout=0.25))
        time.sleep(0.1)
    idle = []
    for _ in range(20):  # two seconds of idle polling at P = 0.25 s
        idle.append(sqlite_probe(timeout=0.25))
        time.sleep(0.1)
    assert len(busy) > 10 and all(busy), busy
    assert all(idle), idle
    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0


LOCKER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("ROLLBACK")
print("released", flush=True)
"""


@pytest.mark.parametrize("lease", ["long", pytest.param("short", marks=one_leg)])
def test_t26_outside_process_holds_the_write_lock_mid_drain(faults, lease):
    hold_s = size(4, 10)
    total = size(600, 1000)
    env = LONG_LEASE if lease == "long" else {}
    queued = jobs.effect.using(lease=30 if lease == "long" else 2).enqueue_many(
        [{"tag": "drain", "sleep": 0.02} for _ in range(total)]
    )
    workers = [faults.spawn("--queue", "default:4", env=env) for _ in range(2)]
    wait_until(lambda: Effect.objects.count() >= total // 5, 120, "20% progress")
    locker = faults.helper("-c", LOCKER, sqlite_path(), str(hold_s))
    assert locker.stdout is not None
    assert locker.stdout.readline().strip() == b"locked"
    assert locker.stdout.readline().strip() == b"released"
    released_ms = now_ms()
    # Claims resume within P + 1 s of the release.
    wait_until(
        lambda: Effect.objects.filter(started_ms__gt=released_ms).exists(), POLL_S + 1, "a claim after the release", interval=0.02
    )
    wait_until(lambda: not Job.objects.active().exists(), 120, "the drain")

    verdict = checker.check({row.pk for row in queued})
    assert verdict.ok, verdict
    if lease == "long":
        assert verdict.exact and verdict.lease_expiries == 0, verdict
    for worker in workers:
        assert worker.popen.poll() is None, worker.output()
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        assert problems_in(worker.output()) == [], worker.output()
    # No lock error reached a handler.
    assert not [e for row in Job.objects.all() for e in row.error_list if e["kind"] == "exception"]
