"""A claimer frozen while it holds a limited claim's turn does not hold up other workers' completions.

A limited claim takes turns on rows of ``durq_queue_control`` (``db/gates.py``) for the few
statements of one claim. A process frozen in that moment (``SIGSTOP``, a paused container, a
host stall) keeps the row locked in a transaction it never ends. Here the test process plays the
frozen holder: it locks the queue's turn in a transaction and stays silent, exactly the database
state a frozen claimer leaves. Another worker's handlers that return meanwhile must have their
completions committed within a bound, not when the holder wakes.

Process tests use the fault suite's short settings (lease 2 s, heartbeat 0.5 s, poll 0.25 s).
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
from django.db import connection, connections, transaction

from django_durq.db.gates import TURN_HOLD_S
from django_durq.models import Job
from tests.conftest import wait_until
from tests.faults.conftest import only_on
from tests.ledger import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

# How long a completion may wait behind a frozen turn holder (docs/flow-control.md).
COMPLETION_BOUND_S = 3.0


@only_on("postgres", "mysql")  # SQLite: a frozen writer holds the whole file (docs/sqlite.md)
def test_a_frozen_turn_holder_does_not_hold_up_other_workers_completions(faults, tmp_path):
    log = tmp_path / "runs.log"
    first = [jobs.capped.enqueue(log=str(log), hold=1.5) for _ in range(2)]
    worker = faults.spawn_ready("--queue", "video:2")
    wait_until(lambda: Job.objects.filter(pk__in=[j.pk for j in first], status="running").count() == 2, 30, "two to start")
    more = [jobs.capped.enqueue(log=str(log), hold=0.1) for _ in range(4)]  # the worker claims again as each returns
    taken, release = threading.Event(), threading.Event()

    def freeze_the_turn() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT paused FROM durq_queue_control WHERE queue = 'video' FOR UPDATE")
                taken.set()
                release.wait(60)
        finally:
            connections.close_all()

    holder = threading.Thread(target=freeze_the_turn)
    holder.start()
    try:
        assert taken.wait(10)
        frozen_at = time.monotonic()
        # The handlers return 1.5 s after they started; their completions must commit soon after.
        wait_until(
            lambda: not Job.objects.filter(pk__in=[j.pk for j in first], status="running").exists(),
            1.5 + COMPLETION_BOUND_S,
            "the completions of the handlers that returned while the turn was frozen",
        )
        waited = time.monotonic() - frozen_at
    finally:
        release.set()
        holder.join()
    assert waited < 1.5 + COMPLETION_BOUND_S, worker.output()
    wait_until(lambda: not Job.objects.filter(pk__in=[j.pk for j in more]).exclude(status="finished").exists(), 30, "the rest")


@only_on("postgres", "mysql")
def test_a_claimer_frozen_in_its_turn_loses_it_and_the_others_claim_again(faults, tmp_path):
    """A worker stopped with SIGSTOP while it holds its turns: the server ends its silent session
    after ``TURN_HOLD_S``, which frees the turns; the other worker claims and runs the queue's
    jobs, and the frozen one, once continued, claims on a new connection and runs nothing twice.
    """
    log = tmp_path / "runs.log"
    faults.gates.close("in_turn")
    frozen = faults.spawn("--queue", "video:1", hooks=True)
    queued = [jobs.capped.enqueue(log=str(log), hold=0.05) for _ in range(5)]
    faults.gates.wait("in_turn", 0, timeout=60)
    frozen.signal(signal.SIGSTOP)
    faults.gates.open("in_turn")
    try:
        other = faults.spawn_ready("--queue", "video:2")
        ids = [j.pk for j in queued]
        wait_until(
            lambda: not Job.objects.filter(pk__in=ids).exclude(status="finished").exists(),
            TURN_HOLD_S + 15,
            "the other worker to run the queue once the frozen claimer lost its turns",
        )
    finally:
        frozen.signal(signal.SIGCONT)
    # Only the continued worker can run this one: the other is stopped before it is queued. Stopped
    # after, the other could start it first, be stopped in its handler past its lease and run it
    # again when continued: a stall's rerun, not what this test is about.
    other.signal(signal.SIGSTOP)
    later = jobs.capped.enqueue(log=str(log), hold=0.05)
    try:
        wait_until(lambda: Job.objects.get(pk=later.pk).status == "finished", 30, "the continued worker to claim again")
    finally:
        other.signal(signal.SIGCONT)
    runs = [line.split()[1] for line in log.read_text().splitlines()]
    assert sorted(runs) == sorted({*runs}), f"a job ran twice: {runs}"
    assert frozen.popen.poll() is None, frozen.output()
