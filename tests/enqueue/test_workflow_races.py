"""Workflows under races, on every database: members that wait, operator actions, counting under a lock.

Each test guards one promise of docs/workflows.md (issue #29 names the race it reproduces). The
races are made deterministic with a second connection: a thread holds a transaction open at the
point where the race happens, and another does the racing write. On PostgreSQL and MariaDB the
test waits until that write is seen waiting for a row lock (or has ended); SQLite lets one writer
at a time, so there the racing write simply waits for the held transaction to commit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction

from django_durq import Workflow, ops
from django_durq.clock import ManualClock
from django_durq.conf import get_settings
from django_durq.db import dialect_for, wakeup
from django_durq.handlers.limits import QueueLimits
from django_durq.models import Job
from django_durq.testing import drain
from django_durq.worker.duties import SettleDuty, WorkflowRetention
from tests.conftest import wait_until
from tests.enqueue.helpers import START, claim_all, run  # noqa: F401 - tests/ops/test_workflow_retry.py imports START from here
from tests.ledger import jobs

FIXED = '{"args": [], "kwargs": {"tag": "%s"}}'


def row(pk: int) -> Job:
    return Job.objects.get(pk=pk)


def fix(pk: int, tag: str) -> None:
    """The operator fixes what made the job fail (its arguments asked it to)."""
    Job.objects.filter(pk=pk).update(arguments=FIXED % tag)


# --- two connections racing ---------------------------------------------------------------------


def _backend() -> int | None:
    """This thread's database session, as the server names it (None on SQLite)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_backend_pid()")
        elif connection.vendor == "mysql":
            cursor.execute("SELECT CONNECTION_ID()")
        else:
            return None
        return int(cursor.fetchone()[0])


def _waits_for_a_lock(backend: int) -> bool:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [backend])
            found = cursor.fetchone()
            return found is not None and found[0] == "Lock"
        cursor.execute("SELECT trx_state FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = %s", [backend])
        found = cursor.fetchone()
        if found is not None and found[0] == "LOCK WAIT":
            return True
        # A lock wait on a row read by primary key happens while MariaDB plans the statement, where
        # INNODB_TRX may not list it yet: a statement of this test still running after 250 ms waits.
        cursor.execute(
            "SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = %s AND COMMAND = 'Query' AND TIME_MS >= 250", [backend]
        )
        return cursor.fetchone() is not None


class Session(threading.Thread):
    """``work`` on a connection of its own; with ``hold``, inside a transaction kept open until :meth:`commit`."""

    def __init__(self, work: Callable[[], Any], *, hold: bool = False) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.hold = hold
        self.backend: int | None = None
        self.value: Any = None
        self.error: BaseException | None = None
        self.begun = threading.Event()
        self.ready = threading.Event()
        self._go = threading.Event()

    def run(self) -> None:
        try:
            self.backend = _backend()
            self.begun.set()
            if self.hold:
                with transaction.atomic():
                    self.value = self.work()
                    self.ready.set()
                    self._go.wait(60)
            else:
                self.value = self.work()
        except BaseException as error:  # noqa: BLE001 - raised in the test's thread by result()
            self.error = error
        finally:
            self.begun.set()
            self.ready.set()
            connections.close_all()

    def commit(self) -> None:
        self._go.set()

    def result(self) -> Any:
        self.join(60)
        assert not self.is_alive(), "the session never ended"
        if self.error is not None:
            raise self.error
        return self.value


def held(work: Callable[[], Any]) -> Session:
    """Start ``work`` in a transaction that stays open (its row locks held) until ``commit()``."""
    session = Session(work, hold=True)
    session.start()
    session.ready.wait(60)
    if session.error is not None:
        raise session.error
    return session


def racing(work: Callable[[], Any]) -> Session:
    """Start ``work`` on another connection; return once it has ended or waits for a row lock."""
    session = Session(work)
    session.start()
    session.begun.wait(60)
    if connection.vendor == "sqlite":
        session.join(0.5)  # one writer at a time: it waits for the held transaction, whenever it tries
    else:
        backend = session.backend
        wait_until(lambda: not session.is_alive() or _waits_for_a_lock(backend), 30, "the racing write to wait or end")
    return session


# --- blocked is a state ----------------------------------------------------------------------


@pytest.mark.django_db
def test_no_claim_takes_a_member_that_waits_for_upstream_whatever_its_due_time(clock):
    flow = Workflow("held back")
    first = flow.add(jobs.step, tag="first")
    second = flow.add(jobs.step, tag="second", after=[first])
    flow.enqueue()
    # Anything may write a due time (an enqueue that reschedules, a script, an admin tool).
    Job.objects.filter(pk=second.job.pk).update(run_at_ms=0)
    assert [job.id for job in claim_all(clock)] == [first.job.pk]
    assert claim_all(clock, QueueLimits(max_running=100)) == []  # the limited claim
    with transaction.atomic():
        assert dialect_for(connection).claim_ids([(second.job.pk, None)], clock.now_ms(), "w1") == []
    assert row(second.job.pk).attempts == 0


@pytest.mark.django_db
@pytest.mark.parametrize("on_duplicate", ["replace", "reschedule"])
def test_a_replace_or_reschedule_enqueue_never_releases_a_member_that_waits(clock, on_duplicate):
    """Issue #29, item 2."""
    flow = Workflow("debounced member")
    first = flow.add(jobs.step, tag="first")
    member = flow.add(jobs.step.using(unique="member-key"), tag="member", after=[first])
    flow.enqueue()
    again = jobs.step.using(unique="member-key", on_duplicate=on_duplicate).enqueue(tag="replaced")
    assert again.pk == member.job.pk
    claimed = claim_all(clock)
    assert [job.id for job in claimed] == [first.job.pk], "the member was released before what it waits for ended"
    run(claimed[0], clock)
    (released,) = claim_all(clock)
    assert released.id == member.job.pk
    run(released, clock)
    assert row(member.job.pk).result == ('"replaced"' if on_duplicate == "replace" else '"member"')


# --- retry re-counts every edge ----------------------------------------------------------------


@pytest.mark.django_db
def test_retrying_one_of_two_dead_members_leaves_the_fan_in_callback_cancelled(clock):
    """Issue #29, item 3."""
    flow = Workflow("fan-in")
    a = flow.add(jobs.step.using(max_attempts=1), tag="a", fail=True)
    b = flow.add(jobs.step.using(max_attempts=1), tag="b", fail=True)
    callback = flow.add(jobs.summary, after=[a, b])
    flow.enqueue()
    drain(clock=clock)
    assert [row(s.job.pk).status for s in (a, b, callback)] == ["dead", "dead", "cancelled"]
    fix(a.job.pk, "a")
    assert ops.retry([a.job.pk], now_ms=clock.now_ms()).retried == [a.job.pk]
    drain(clock=clock)
    done = row(callback.job.pk)
    assert (done.status, done.result) == ("cancelled", None), "the callback ran while b was still dead"
    assert done.cancelled_by == b.job.pk
    fix(b.job.pk, "b")
    ops.retry([b.job.pk], now_ms=clock.now_ms())
    drain(clock=clock)
    assert row(callback.job.pk).result == '{"finished":2,"dead":0,"cancelled":0}'


# --- operator actions are atomic ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_workflow_of_any_size_releases_no_run_anyway_callback(clock):
    """Issue #29, item 4: the cancel went in batches of 500, each settling on its own."""
    flow = Workflow("large", on_failure="run")
    # The members wait in a queue no pool serves; the callback in one that a pool serves.
    members = [flow.add(jobs.step.using(queue="parked"), tag=f"m{n}") for n in range(600)]
    callback = flow.add(jobs.summary, after=members[:10])
    flow.enqueue()
    taken: list[Any] = []

    def idle_pool(named: bool) -> bool:
        # A pool of this process is woken when a job of its queue commits due, and claims at once.
        taken.extend(claim_all(clock))
        return False

    wakeup.subscribe("default", idle_pool)
    try:
        result = ops.cancel_workflow(flow.row.pk, now_ms=clock.now_ms())
    finally:
        wakeup.unsubscribe("default", idle_pool)
    outcomes = [run(job, clock) for job in taken]  # what a pool took runs, and returns before its heartbeat
    assert taken == [], f"claimed while the workflow was being cancelled: {[job.id for job in taken]} ({outcomes})"
    assert len(result.cancelled) == 601 and result.stopping == []
    assert (row(callback.job.pk).status, row(callback.job.pk).attempts) == ("cancelled", 0)


@pytest.mark.django_db
def test_a_member_asked_to_stop_that_returns_before_its_heartbeat_ends_cancelled(clock):
    """Issue #29, item 4: the stop request was seen only at a heartbeat."""
    flow = Workflow("stopped")
    first = flow.add(jobs.step, tag="first")
    second = flow.add(jobs.step, tag="second", after=[first])
    flow.enqueue()
    (running,) = claim_all(clock)
    assert ops.cancel([first.job.pk], now_ms=clock.now_ms()).stopping == [first.job.pk]
    run(running, clock)  # the handler returns before any heartbeat told it to stop
    assert row(first.job.pk).status == "cancelled"
    assert row(second.job.pk).status == "cancelled"
    assert claim_all(clock) == []


# --- counting under a lock ---------------------------------------------------------------------


def two_to_one(clock: ManualClock, *, on_failure: str = "cancel") -> tuple[int, int, int, dict[int, Any]]:
    """a and b, then a callback after both; a is claimed and dies, b is claimed and still runs."""
    flow = Workflow("fan-in", on_failure=on_failure)  # type: ignore[arg-type]
    a = flow.add(jobs.step.using(max_attempts=1), tag="a", fail=True)
    b = flow.add(jobs.step, tag="b")
    callback = flow.add(jobs.summary, after=[a, b])
    flow.enqueue()
    claimed = {job.id: job for job in claim_all(clock)}
    assert sorted(claimed) == [a.job.pk, b.job.pk]
    run(claimed[a.job.pk], clock)
    fix(a.job.pk, "a")
    return a.job.pk, b.job.pk, callback.job.pk, claimed


@pytest.mark.django_db(transaction=True)
def test_retrying_a_dead_member_while_a_sibling_ends_leaves_no_callback_waiting_forever(clock):
    """Issue #29, item 8 (PostgreSQL): the count read no lock, and the sibling's count skipped the callback."""
    a, b, callback, claimed = two_to_one(clock)
    assert row(callback).status == "cancelled"
    retry = held(lambda: ops.retry([a], now_ms=clock.now_ms()))
    sibling = racing(lambda: run(claimed[b], clock))  # b finishes; its end is counted for the callback
    retry.commit()
    retry.result()
    assert sibling.result() == "finished"
    drain(clock=clock)
    done = row(callback)
    assert (done.status, done.result) == ("finished", '{"finished":2,"dead":0,"cancelled":0}'), (
        f"the callback is {done.status} with deps_left={done.deps_left}"
    )


@pytest.mark.django_db(transaction=True)
def test_retrying_a_cancelled_member_while_what_it_waits_for_ends_leaves_it_due(clock):
    """Issue #29, item 8, through the edges of the retried job itself."""
    flow = Workflow("chain")
    first = flow.add(jobs.step, tag="first")
    second = flow.add(jobs.step, tag="second", after=[first])
    flow.enqueue()
    (running,) = claim_all(clock)
    ops.cancel([second.job.pk], now_ms=clock.now_ms())
    retry = held(lambda: ops.retry([second.job.pk], now_ms=clock.now_ms()))
    upstream = racing(lambda: run(running, clock))
    retry.commit()
    retry.result()
    assert upstream.result() == "finished"
    drain(clock=clock)
    done = row(second.job.pk)
    assert done.status == "finished", f"the retried member is {done.status} with deps_left={done.deps_left}"


@pytest.mark.django_db(transaction=True)
def test_retrying_a_member_while_a_sibling_releases_a_run_anyway_callback_holds_it_back(clock):
    """Suspected in issue #29: ``revive`` added 1 to ``deps_left`` without checking the callback's state."""
    a, b, callback, claimed = two_to_one(clock, on_failure="run")
    assert row(callback).deps_left == 1  # a's death counted as an end: run anyway
    sibling = held(lambda: run(claimed[b], clock))  # b finishes: the callback is released, not yet committed
    retry = racing(lambda: ops.retry([a], now_ms=clock.now_ms()))
    sibling.commit()
    assert sibling.result() == "finished"
    assert retry.result().retried == [a]
    due = claim_all(clock)
    assert [job.id for job in due] == [a], "the callback was due while a, retried, had not ended"
    run(due[0], clock)
    drain(clock=clock)
    done = row(callback)
    assert (done.status, done.attempts, done.result) == ("finished", 1, '{"finished":2,"dead":0,"cancelled":0}')


# --- suspects: a lost worker, retention ---------------------------------------------------------


@pytest.mark.django_db
def test_a_cancelled_last_attempt_that_loses_its_worker_ends_cancelled_and_counts_at_once(clock):
    """Suspected in issue #29: ``bury_lost`` made it a dead letter and left its end to the sweep."""
    from django_durq.worker.pool import Pool
    from django_durq.worker.runtime import Runtime

    flow = Workflow("lost")
    first = flow.add(jobs.step.using(max_attempts=1, lease=timedelta(seconds=10)), tag="first")
    second = flow.add(jobs.step, tag="second", after=[first])
    flow.enqueue()
    claim_all(clock)  # its worker dies while it runs
    ops.cancel([first.job.pk], now_ms=clock.now_ms())
    clock.advance(10_000)
    Pool("default", 1, Runtime(settings=get_settings(), clock=clock)).bury_expired(clock.now_ms())
    assert row(first.job.pk).status == "cancelled", "a cancel is final, even when the worker is lost"
    assert row(second.job.pk).status == "cancelled"


@pytest.mark.django_db
def test_pruning_a_workflow_never_loses_an_end_a_later_workflow_waits_for(clock, settings):
    """Suspected in issue #29: retention deleted edges into later workflows unless the sweep had counted them."""
    settings.DURQ = {**settings.DURQ, "KEEP_FINISHED": 60, "KEEP_DEAD": 60}
    earlier = Workflow("earlier")
    upstream = earlier.add(jobs.step, tag="upstream")
    earlier.enqueue()
    later = Workflow("later")
    waiting = later.add(jobs.step, tag="waiting", after=[upstream.job])
    later.enqueue()
    # The upstream ends and its worker dies before it counts the end for the later workflow.
    Job.objects.filter(pk=upstream.job.pk).update(status="finished", finished_ms=clock.now_ms())
    clock.advance(3_600_000)
    WorkflowRetention(get_settings()).run_once(clock.now_ms())
    SettleDuty(get_settings()).run_once(clock.now_ms())
    drain(clock=clock)
    assert row(waiting.job.pk).status == "finished"
    clock.advance(3_600_000)
    assert WorkflowRetention(get_settings()).run_once(clock.now_ms()) == {"workflows": 2}
