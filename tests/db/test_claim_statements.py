"""What the dispatcher's transaction sends: the statements a drain pays for per batch.

A kept completion is one statement text whatever the batch's size (SQLite, PostgreSQL), so the
driver and the server do not parse and plan it anew per batch. On MariaDB a claim inside a
completion's transaction takes no savepoint, and a worker whose claims come back full looks for
expired leases at most every ``EXPIRED_LOOK_MS`` of its claims' time, not in every claim: that look walks every running
row of every worker, and it reads without locking first. An expired lease is still taken by the next claim that looks.
MariaDB's claimers of one queue take turns, and one whose turn does not come goes ahead without it.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import connection, transaction

from django_durq.db import dialect_for, wakeup
from django_durq.db.base import own_connection
from django_durq.db.flow import claim_limited
from django_durq.handlers.limits import QueueLimits
from django_durq.models import Job, QueueControl, Status
from tests.conftest import db_vendor
from tests.ledger import jobs

pytestmark = pytest.mark.django_db(transaction=True)

NOW = 1_800_000_000_000
mariadb_only = pytest.mark.skipif(db_vendor() != "mysql", reason="MariaDB's claim")


class Sent:
    """The statement texts the test's connection sends (parameters apart), as the driver gets them."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, execute, sql, params, many, context):
        self.texts.append(" ".join(sql.split()))
        return execute(sql, params, many, context)

    def starting(self, *words: str) -> list[str]:
        return [text for text in self.texts if text.upper().startswith(words)]


def worker() -> str:
    return f"test:{uuid.uuid4().hex[:8]}"


def test_a_kept_batch_is_one_statement_text_whatever_its_size():
    """Its values travel as a few parameters (arrays, a JSON text), not one or more per job: on
    MariaDB the driver escapes each parameter in Python, on the thread that claims for every slot.
    """
    jobs.noop.enqueue_many([{"n": n} for n in range(6)])
    dialect = dialect_for(connection)
    claimed = dialect.claim("default", 6, NOW, worker())
    leases = [(job.id, job.claim_token) for job in claimed]
    sent = Sent()
    with connection.execute_wrapper(sent):
        assert dialect.finish_many([(leases[0], NOW + 1, None)]) == {leases[0]}
        assert dialect.finish_many([(lease, NOW + 2, None) for lease in leases[1:4]]) == set(leases[1:4])
    updates = sent.starting("UPDATE")
    assert len(updates) == 2 and updates[0] == updates[1]
    # Results ride the same way, the right result on each row.
    assert dialect.finish_many([(leases[4], NOW + 3, '"done"')]) == {leases[4]}
    # A job an operator asked to stop is left running, for the caller to end cancelled and say so.
    Job.objects.filter(pk=leases[5][0]).update(stop_requested=True)
    assert dialect.finish_many([(leases[5], NOW + 4, '"stopped"')]) == set()
    rows = {row.pk: row for row in Job.objects.all()}
    assert [(rows[job_id].status, rows[job_id].finished_ms) for job_id, _ in leases] == [
        (Status.FINISHED, NOW + 1),
        *[(Status.FINISHED, NOW + 2)] * 3,
        (Status.FINISHED, NOW + 3),
        (Status.RUNNING, None),
    ]
    assert rows[leases[4][0]].result == '"done"' and rows[leases[0][0]].result is None
    assert rows[leases[5][0]].result is None


def test_a_batch_with_nothing_kept_sends_no_kept_batch_statement():
    jobs.noop.enqueue_many([{"n": n} for n in range(3)])
    dialect = dialect_for(connection)
    leases = [(job.id, job.claim_token) for job in dialect.claim("default", 3, NOW, worker())]
    sent = Sent()
    with connection.execute_wrapper(sent):  # finished jobs deleted (KEEP_FINISHED = 0): nothing kept
        done, claimed = dialect.complete_and_claim(leases, "default", 0, NOW + 1, worker())
    assert done == set(leases) and claimed == [] and not Job.objects.exists()
    assert sent.starting("UPDATE") == [] and len(sent.starting("DELETE")) == 1


@mariadb_only
def test_a_claim_inside_a_completions_transaction_takes_no_savepoint():
    jobs.noop.enqueue_many([{"n": n} for n in range(3)])
    dialect = dialect_for(connection)
    done = dialect.claim("default", 1, NOW, worker())
    sent = Sent()
    with connection.execute_wrapper(sent):  # its own transaction, as the dispatcher's
        finished, claimed = dialect.complete_and_claim([(done[0].id, done[0].claim_token)], "default", 2, NOW, worker())
    assert len(finished) == 1 and len(claimed) == 2
    assert sent.starting("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT") == []


def expired_picks(sent: Sent) -> int:
    """The claim's locking reads of expired leases."""
    return sum("status = 'running' AND lease_expires_ms <=" in text and "FOR UPDATE" in text for text in sent.starting("SELECT"))


def expired_reads(sent: Sent) -> int:
    """A busy worker's reads, without locking, of whether any lease ran out."""
    return sum(
        "status = 'running' AND lease_expires_ms <=" in text and "FOR UPDATE" not in text for text in sent.starting("SELECT")
    )


@mariadb_only
def test_full_claims_look_for_expired_leases_every_half_second_and_short_claims_every_time():
    from django_durq.db.mysql import EXPIRED_LOOK_MS

    jobs.noop.enqueue_many([{"n": n} for n in range(8)])
    dialect = dialect_for(connection)
    lost = dialect.claim("default", 1, NOW, worker())[0]  # its worker is gone: its lease runs out
    Job.objects.filter(pk=lost.id).update(lease_expires_ms=NOW - 1)
    busy = worker()
    sent = Sent()
    with connection.execute_wrapper(sent):
        first = dialect.claim("default", 2, NOW, busy)  # the first claim looks, and takes the expired job first
        second = dialect.claim("default", 2, NOW, busy)  # full before, looked just now: no look
    assert first[0].id == lost.id and first[0].reclaimed_from is not None
    assert len(second) == 2 and expired_picks(sent) == 1

    Job.objects.filter(pk=first[0].id).update(lease_expires_ms=NOW - 1)  # lost again
    sent.texts.clear()
    with connection.execute_wrapper(sent):
        skipped = dialect.claim("default", 1, NOW + EXPIRED_LOOK_MS - 1, busy)
        looked = dialect.claim("default", 1, NOW + EXPIRED_LOOK_MS, busy)  # half a second on: it looks again
    assert skipped[0].id != first[0].id and looked[0].id == first[0].id
    assert expired_picks(sent) == 1 and expired_reads(sent) == 1  # a busy worker reads first, then picks

    Job.objects.filter(pk=looked[0].id).update(lease_expires_ms=NOW - 1)
    sent.texts.clear()
    with connection.execute_wrapper(sent):
        short = dialect.claim("default", 10, NOW + EXPIRED_LOOK_MS, busy)  # full, looked just now: the due jobs left, too few
        again = dialect.claim("default", 10, NOW + EXPIRED_LOOK_MS, busy)  # after a short claim it looks every time
        nothing = dialect.claim("default", 10, NOW + EXPIRED_LOOK_MS, busy)
    assert len(short) == 3 and looked[0].id not in {job.id for job in short}
    assert [job.id for job in again] == [looked[0].id] and nothing == []
    assert expired_picks(sent) == 2 and expired_reads(sent) == 0


@mariadb_only
def test_a_busy_workers_look_locks_no_running_row_while_no_lease_ran_out():
    """The look walks every worker's running rows: only a lease that ran out makes it lock them."""
    from django_durq.db.mysql import EXPIRED_LOOK_MS

    jobs.noop.enqueue_many([{"n": n} for n in range(8)])
    dialect = dialect_for(connection)
    dialect.claim("default", 3, NOW, worker())  # another worker's jobs, leased
    busy = worker()
    sent = Sent()
    with connection.execute_wrapper(sent):
        dialect.claim("default", 2, NOW, busy)  # its first claim picks at once, and comes back full
        taken = dialect.claim("default", 2, NOW + EXPIRED_LOOK_MS, busy)  # its look half a second on
    assert len(taken) == 2
    assert expired_picks(sent) == 1 and expired_reads(sent) == 1
    assert "FOR UPDATE" not in [text for text in sent.texts if "lease_expires_ms <=" in text][-1]


@mariadb_only
def test_the_watcher_reads_due_jobs_only_for_queues_not_claimed_in_full():
    from django_durq.worker.watcher import due_reads

    def wake(named: bool) -> bool:
        return False

    jobs.noop.enqueue_many([{"n": n} for n in range(3)])
    dialect = dialect_for(connection)
    wakeup.subscribe("default", wake)
    try:
        assert "default" in due_reads(connection.alias)
        dialect.claim("default", 2, NOW, worker())  # full: the pool claims again on its own
        assert "default" not in due_reads(connection.alias)
        dialect.claim("default", 2, NOW, worker())  # short: the pool waits for a wake-up or its poll
        assert "default" in due_reads(connection.alias)
    finally:
        wakeup.unsubscribe("default", wake)


@mariadb_only
def test_claimers_of_a_queue_take_turns_and_a_stalled_turn_stops_nobody(monkeypatch):
    from django_durq.db import mysql, mysql_claims

    jobs.noop.enqueue_many([{"n": n} for n in range(9)])
    dialect = dialect_for(connection)
    busy = worker()
    sent = Sent()
    with connection.execute_wrapper(sent):
        dialect.claim("default", 1, NOW, busy)  # no backlog seen yet: no turn to ask for; full
    assert not any("GET_LOCK" in text for text in sent.texts)
    other = connection.get_new_connection(connection.get_connection_params())  # another worker's session
    turn = "CONCAT('durq-claim:', SHA1(CONCAT(DATABASE(), ':', 'default')))"
    cursor = other.cursor()
    try:
        cursor.execute(f"SELECT GET_LOCK({turn}, 0)")
        assert cursor.fetchone()[0] == 1  # the other session is claiming

        monkeypatch.setattr(mysql, "CLAIM_TURN_WAIT_S", 30.0)
        claimed: list[int] = []
        waiter = threading.Thread(target=lambda: claimed.extend(job.id for job in dialect.claim("default", 2, NOW, busy)))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and claimed == []  # waits for its turn
        cursor.execute(f"DO RELEASE_LOCK({turn})")
        waiter.join(10)
        assert not waiter.is_alive() and len(claimed) == 2  # its turn came

        cursor.execute(f"SELECT GET_LOCK({turn}, 0)")
        assert cursor.fetchone()[0] == 1  # held by a session stalled in its claim
        monkeypatch.setattr(mysql, "CLAIM_TURN_WAIT_S", 0.5)
        monkeypatch.setattr(mysql_claims, "CLAIM_TURN_STALL_S", 60.0)
        for _ in range(2):  # the same holder through two waits: stalled
            started = time.monotonic()
            late = dialect.claim("default", 1, NOW, busy)
            assert len(late) == 1 and time.monotonic() - started >= 0.5  # it waited, then claimed without its turn
        sent.texts.clear()
        with connection.execute_wrapper(sent):
            next_one = dialect.claim("default", 1, NOW, busy)
        assert len(next_one) == 1 and not any("GET_LOCK" in text for text in sent.texts)  # claims side by side a while
        cursor.execute(f"SELECT IS_USED_LOCK({turn}) = CONNECTION_ID()")
        assert cursor.fetchone()[0] == 1  # and took nothing from the holder

        monkeypatch.setattr(mysql_claims, "CLAIM_TURN_STALL_S", 0.0)  # the while is over: it asks again
        cursor.execute(f"DO RELEASE_LOCK({turn})")
        with connection.execute_wrapper(sent):
            dialect.claim("default", 1, NOW, busy)
        assert any("GET_LOCK" in text for text in sent.texts)
    finally:
        other.close()


@mariadb_only
def test_a_session_lost_inside_a_claim_raises_djangos_error_for_the_retry():
    """Giving the turn back on a session that is gone must not replace the error the caller retries on."""
    from django.db import OperationalError

    jobs.noop.enqueue_many([{"n": n} for n in range(3)])
    dialect = dialect_for(connection)
    busy = worker()
    dialect.claim("default", 1, NOW, busy)  # full: its next claim takes its turn
    other = connection.get_new_connection(connection.get_connection_params())
    session = connection.cursor().connection.thread_id()
    sent: list[str] = []

    def cut_before_the_update(execute, sql, params, many, context):
        sent.append(sql)
        if sql.startswith("UPDATE"):
            other.cursor().execute(f"KILL CONNECTION {session}")
        return execute(sql, params, many, context)

    try:
        with connection.execute_wrapper(cut_before_the_update), pytest.raises(OperationalError), transaction.atomic():
            dialect.claim("default", 2, NOW, busy)  # inside a transaction, as the dispatcher's claim with its counts
    finally:
        other.close()
        connection.close()
    assert "GET_LOCK" in sent[0]  # the claim held its turn when its session was cut
    assert Job.objects.filter(status=Status.RUNNING).count() == 1  # the first claim's: the second died with its session


@mariadb_only
def test_one_busy_worker_of_all_looks_for_expired_leases_in_each_half_second():
    """Each look walks every process's running rows: the busy workers share one look per span of the clock."""
    from django.db import connections

    from django_durq.db.mysql import EXPIRED_LOOK_MS

    jobs.noop.enqueue_many([{"n": n} for n in range(12)])
    start = NOW + 100 * EXPIRED_LOOK_MS  # a span no other test asked for on these sessions
    first, second = dialect_for(connection), dialect_for(other := connections.create_connection("default"))
    try:
        one, two = worker(), worker()
        first.claim("default", 2, start, one)  # each worker's first claim picks at once, and comes back full
        second.claim("default", 2, start, two)
        sent = Sent()
        with connection.execute_wrapper(sent), other.execute_wrapper(sent):
            first.claim("default", 2, start + EXPIRED_LOOK_MS, one)  # the first busy worker of this span looks
            second.claim("default", 2, start + EXPIRED_LOOK_MS, two)  # the other one of the same span does not
        assert expired_reads(sent) == 1
        sent.texts.clear()
        with connection.execute_wrapper(sent), other.execute_wrapper(sent):
            second.claim("default", 2, start + 2 * EXPIRED_LOOK_MS, two)  # the next span: the other one is first
            first.claim("default", 2, start + 2 * EXPIRED_LOOK_MS, one)
        assert expired_reads(sent) == 1
        assert expired_picks(sent) == 0  # no lease ran out: nothing locked
    finally:
        other.close()


@pytest.mark.skipif(db_vendor() != "postgres", reason="PostgreSQL takes a limited claim's two turns in one statement")
def test_a_limited_claim_takes_its_two_turns_in_one_statement_the_queues_first():
    QueueControl.objects.all().delete()  # the first limited claim: neither control row exists yet
    jobs.one_per_key.enqueue(key="a", log="/dev/null")
    sent = Sent()
    with connection.execute_wrapper(sent):
        assert len(claim_limited(dialect_for(connection), "default", 5, NOW, worker(), QueueLimits())) == 1
    assert len(sent.starting("SELECT QUEUE, PAUSED FROM DURQ_QUEUE_CONTROL")) == 2  # rows made in between
    jobs.one_per_key.enqueue(key="b", log="/dev/null")
    sent = Sent()
    with connection.execute_wrapper(sent):
        assert len(claim_limited(dialect_for(connection), "default", 5, NOW, worker(), QueueLimits())) == 1
    assert len(sent.starting("SELECT QUEUE, PAUSED FROM DURQ_QUEUE_CONTROL")) == 1
    assert not [text for text in sent.texts if "durq_queue_control" in text and text not in sent.starting("SELECT QUEUE")]

    # Every claimer locks the queue's row before the keys' turn: one that waits for the keys' turn
    # already holds its queue's row.
    third = jobs.one_per_key.enqueue(key="c", log="/dev/null")
    holder = own_connection(connection)
    holder.autocommit = False
    holder.cursor().execute("SELECT 1 FROM durq_queue_control WHERE queue = ':keys' FOR UPDATE")
    claimed: list[object] = []

    def claimer() -> None:
        try:
            claimed.append(claim_limited(dialect_for(connection), "default", 5, NOW, worker(), QueueLimits()))
        finally:
            connection.close()

    thread = threading.Thread(target=claimer)
    thread.start()
    probe = own_connection(connection)
    try:
        deadline = time.monotonic() + 0.8  # within the claim's wait for its turn (TURN_WAIT_S)
        queue_row_taken = False
        while time.monotonic() < deadline and not queue_row_taken:
            try:
                with probe.cursor() as cursor:
                    cursor.execute("SELECT 1 FROM durq_queue_control WHERE queue = 'default' FOR UPDATE NOWAIT")
                probe.rollback()
                time.sleep(0.02)
            except Exception:  # noqa: BLE001 - lock not available: the claimer holds the queue's row
                probe.rollback()
                queue_row_taken = True
        assert queue_row_taken, "the claimer waiting for the keys' turn did not hold its queue's row"
        thread.join(5)
    finally:
        holder.rollback()
        holder.close()
        probe.close()
        thread.join(5)
    assert claimed == [[]]  # its turn did not come within TURN_WAIT_S: it gave up, claiming nothing
    assert [job.id for job in claim_limited(dialect_for(connection), "default", 5, NOW, worker(), QueueLimits())] == [third.pk]
