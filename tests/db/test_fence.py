"""The fence over a batch of attempts matches each row by its own (id, claim token) pair, exactly.

Every dialect writes it two ways where it can: one for a batch whose ids are distinct (a row's
token read at its id's position) and one for a batch holding two attempts of one job (a stale one
still in the worker's book and the one the database holds). Both must match a row only under its
own token, whichever the batch holds.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import connection, connections, transaction

from django_durq.db import dialect_for, places
from django_durq.models import Job, LimitPlace, Status
from tests.conftest import db_vendor
from tests.ledger import jobs

pytestmark = pytest.mark.django_db(transaction=True)

NOW = 1_800_000_000_000
# A wait for a row lock fails after this long (whole seconds on MariaDB) instead of the default 50 s.
LOCK_WAIT_BOUND = {"postgres": "SET lock_timeout = '3s'", "mysql": "SET SESSION innodb_lock_wait_timeout = 3"}


def claimed(count: int) -> list[tuple[int, int]]:
    jobs.noop.enqueue_many([{"n": n} for n in range(count)])
    rows = dialect_for(connection).claim("default", count, NOW, f"test:{uuid.uuid4().hex[:8]}")
    assert len(rows) == count
    return sorted((job.id, job.claim_token) for job in rows)


def statuses() -> dict[int, str]:
    return dict(Job.objects.values_list("pk", "status"))


def test_distinct_ids_match_only_their_own_token():
    dialect = dialect_for(connection)
    (a, a_token), (b, b_token), (c, c_token) = claimed(3)
    # c under a token it does not hold: the batch's ids are distinct, the pair is wrong.
    assert dialect.complete([(a, a_token), (b, b_token), (c, c_token + 1)]) == {(a, a_token), (b, b_token)}
    assert statuses() == {c: Status.RUNNING}
    lease = Job.objects.get(pk=c).lease_expires_ms
    assert dialect.renew([(c, c_token - 1)], NOW + 60_000).renewed == {}
    assert Job.objects.get(pk=c).lease_expires_ms == lease


def test_two_attempts_of_one_job_in_a_batch_match_only_the_held_one():
    dialect = dialect_for(connection)
    (a, a_token), (b, b_token) = claimed(2)
    stale = (a, a_token - 1)
    # The stale attempt first: a fence by position would read its token for the row, and miss.
    renewal = dialect.renew([stale, (a, a_token), (b, b_token)], NOW + 1)
    assert set(renewal.renewed) == {(a, a_token), (b, b_token)}
    assert dialect.complete([stale, (b, b_token)]) == {(b, b_token)}
    assert statuses() == {a: Status.RUNNING}
    assert dialect.complete([stale, (a, a_token)]) == {(a, a_token)}
    assert statuses() == {}


@pytest.mark.parametrize("batch", ["distinct", "two attempts of one job"])
def test_places_are_freed_by_their_own_attempt_only(batch):
    dialect = dialect_for(connection)
    (a, a_token), (b, b_token) = claimed(2)
    held = [(a, a_token - 1), (a, a_token), (b, b_token)]  # a's stale attempt still runs, holding its place
    for job_id, token in held:
        LimitPlace.objects.create(job_id=job_id, claim_token=token, queue="default", worker_id="w", taken_ms=NOW)
    freeing = [(a, a_token), (b, b_token + 1)] if batch == "distinct" else [(a, a_token + 1), (a, a_token)]
    assert places.free(dialect, freeing) == 1
    assert set(LimitPlace.objects.values_list("job_id", "claim_token")) == {(a, a_token - 1), (b, b_token)}


@pytest.mark.parametrize("batch", ["distinct", "two attempts of one job"])
def test_a_kept_batch_frees_the_places_of_the_handlers_that_ended_with_it(batch):
    dialect = dialect_for(connection)
    (a, a_token), (b, b_token), (c, c_token) = claimed(3)
    for job_id, token in [(a, a_token), (b, b_token), (c, c_token), (c, c_token - 1)]:
        LimitPlace.objects.create(job_id=job_id, claim_token=token, queue="default", worker_id="w", taken_ms=NOW)
    kept = [((a, a_token), NOW + 1, None), ((b, b_token), NOW + 2, '"done"')]
    if batch == "two attempts of one job":
        kept.append(((a, a_token - 1), NOW + 3, None))  # a stale attempt's completion: fenced off
    # b's and c's stale handler ended; a's place is kept (its handler still runs, say).
    done, claimed_now = dialect.complete_and_claim(
        [], "default", 0, NOW, "w", kept=kept, free_places=[(b, b_token), (c, c_token - 1)]
    )
    assert done == {(a, a_token), (b, b_token)} and claimed_now == []
    assert set(LimitPlace.objects.values_list("job_id", "claim_token")) == {(a, a_token), (c, c_token)}
    rows = {row.pk: row for row in Job.objects.all()}
    assert [(rows[j].status, rows[j].finished_ms) for j in (a, b, c)] == [
        (Status.FINISHED, NOW + 1),
        (Status.FINISHED, NOW + 2),
        (Status.RUNNING, None),
    ]
    assert rows[b].result == '"done"'


@pytest.mark.skipif(db_vendor() == "sqlite", reason="SQLite has no row locks: a writer holds the whole file")
@pytest.mark.parametrize("batch", ["one job", "more pairs than running rows"])
@pytest.mark.parametrize("write", ["delete", "keep", "renew", "hand back"])
def test_a_batch_waits_on_no_lock_of_a_row_outside_it(write, batch):
    """The fence finds its rows by primary key, whatever the batch and whatever the planner thinks.

    Another worker's running row is locked by a transaction still open (its completion or claim
    in flight, an operator's action). A statement that reads more rows than its own locks each
    of them, and waited for that transaction's end. Two batches led MariaDB's planner there: a
    single pair, whose row-value condition it cannot turn into a key lookup in a ``DELETE`` or
    an ``UPDATE`` (it read the whole table), and more pairs than running rows (attempts whose
    jobs another worker already ended are fenced off with the rest), where reading the running
    rows by their status looked cheaper than the pairs' lookups.
    """
    dialect = dialect_for(connection)
    ours = claimed(30 if batch != "one job" else 1)
    jobs.noop.enqueue(n=30)
    (theirs,) = dialect.claim("default", 1, NOW, "test:other")
    # Jobs waiting, as in a queue with a backlog: MariaDB's planner reads a table of a few
    # hundred rows whole, whatever the condition, and then locks every row of it.
    jobs.noop.enqueue_many([{"n": n} for n in range(2000)])
    gone = [(job_id + 100_000, 1) for job_id in range(60 if batch != "one job" else 0)]  # jobs others already ended
    locked, release = threading.Event(), threading.Event()

    def hold_their_row() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT id FROM durq_job WHERE id = %s FOR UPDATE", [theirs.id])
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_their_row)
    holder.start()
    try:
        assert locked.wait(10)
        with connection.cursor() as cursor:
            cursor.execute(LOCK_WAIT_BOUND[db_vendor()])
        started = time.monotonic()
        if write == "delete":
            assert dialect.complete([*gone, *ours]) == set(ours)
        elif write == "keep":
            assert dialect.finish_many([(lease, NOW, None) for lease in [*gone, *ours]]) == set(ours)
        elif write == "renew":
            assert set(dialect.renew([*gone, *ours], NOW + 1).renewed) == set(ours)
        else:
            assert dialect.release([*gone, *ours], started=True, now_ms=NOW) == len(ours)
        assert time.monotonic() - started < 2
    finally:
        release.set()
        holder.join()
        connection.close()  # the session's lock wait bound goes with it
