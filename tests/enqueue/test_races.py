"""Dedupe races: enqueuers of one key while its holder finishes never see an error.

Real threads, each with its own connection, released by a barrier while the holder's delete is
not yet committed; each enqueues inside a transaction of its own that also writes application
data, so a race that broke the caller's transaction shows as an error or a lost row.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from django_durq.clock import now_ms
from django_durq.db.store import Store
from django_durq.models import ACTIVE_STATUSES, Job
from tests.conftest import db_vendor, wait_until
from tests.enqueue.helpers import in_thread
from tests.ledger import jobs
from tests.ledger.models import Order

ROUNDS = 20
ENQUEUERS = 8


def _race(round_number: int) -> tuple[list[int], list[str]]:
    """Complete the holder of a key while ``ENQUEUERS`` threads enqueue that key; (ids returned, errors)."""
    key, queue = f"holder-{round_number}", f"race{round_number}"
    store = Store("default")
    jobs.noop.using(unique=key, queue=queue).enqueue()
    (holder,) = store.claim(queue, 1, now_ms(), "racer")
    barrier = threading.Barrier(ENQUEUERS + 1)
    returned: list[int] = []
    errors: list[str] = []

    def complete() -> None:
        with transaction.atomic():
            store.dialect.complete([(holder.id, holder.claim_token)])
            barrier.wait()  # the enqueuers start while the delete is not yet committed
            store.dialect.claim(queue, ENQUEUERS, now_ms(), "racer")

    def enqueuer(index: int) -> Callable[[], None]:
        def enqueue() -> None:
            barrier.wait()
            try:
                with transaction.atomic():
                    Order.objects.create(label=f"{key}:{index}")
                    returned.append(jobs.noop.using(unique=key, queue=queue).enqueue(index=index).pk)
                    Order.objects.filter(label=f"{key}:{index}").count()  # the transaction still works
            except Exception as error:  # noqa: BLE001 - reported by the test
                errors.append(f"round {round_number}: {type(error).__name__}: {error}")

        return enqueue

    threads = [in_thread(complete)] + [in_thread(enqueuer(index)) for index in range(ENQUEUERS)]
    for thread in threads:
        thread.join()
    return returned, errors


@pytest.mark.django_db(transaction=True)
def test_enqueuers_of_a_key_whose_holder_is_completing_get_one_new_job_and_keep_their_transactions():
    for round_number in range(ROUNDS):
        returned, errors = _race(round_number)
        key = f"holder-{round_number}"
        assert errors == []
        active = list(Job.objects.filter(unique_key=key, status__in=ACTIVE_STATUSES).values_list("pk", flat=True))
        assert len(active) == 1, (round_number, active)
        assert returned == [active[0]] * ENQUEUERS
        assert Order.objects.filter(label__startswith=f"{key}:").count() == ENQUEUERS


# A lock wait cut short on this connection: one second instead of the server's default.
SHORT_LOCK_WAIT = {
    "mysql": "SET SESSION innodb_lock_wait_timeout = 1",
    "postgres": "SET LOCAL lock_timeout = '1s'",
}


@pytest.mark.skipif(db_vendor() not in SHORT_LOCK_WAIT, reason="SQLite waits for its write lock before the insert")
@pytest.mark.django_db(transaction=True)
def test_a_lock_wait_that_times_out_on_a_held_key_is_retried_inside_the_callers_transaction():
    """The key's holder commits only after the enqueuer's insert timed out and was tried again."""
    inserts: list[str] = []
    outcome: dict[str, object] = {}
    holding, finished = threading.Event(), threading.Event()

    def count_inserts(execute, sql, params, many, context):
        if sql.startswith("INSERT INTO durq_job"):
            inserts.append(sql)
        return execute(sql, params, many, context)

    def holder() -> None:
        with transaction.atomic():
            outcome["holder"] = jobs.noop.using(unique="held").enqueue().pk
            holding.set()
            wait_until(lambda: len(inserts) >= 2 or finished.is_set(), timeout=60, message="a second insert")

    def enqueuer() -> None:
        holding.wait()
        try:
            with connection.execute_wrapper(count_inserts), transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(SHORT_LOCK_WAIT[db_vendor()])
                Order.objects.create(label="waiter")
                job = jobs.noop.using(unique="held").enqueue()
                outcome["waiter"] = (job.pk, job.deduplicated)
        except Exception as error:  # noqa: BLE001 - reported by the test
            outcome["error"] = f"{type(error).__name__}: {error}"
        finally:
            finished.set()

    for thread in [in_thread(holder), in_thread(enqueuer)]:
        thread.join()

    assert "error" not in outcome, outcome["error"]
    assert outcome["waiter"] == (outcome["holder"], True)
    assert len(inserts) >= 2
    assert list(Order.objects.values_list("label", flat=True)) == ["waiter"]
