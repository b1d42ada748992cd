"""Dedupe races: enqueuers of one key while its holder finishes never see an error.

Real threads, each with its own connection, released by a barrier while the holder's delete is
not yet committed; each enqueues inside a transaction of its own that also writes application
data, so a race that broke the caller's transaction shows as an error or a lost row.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connections, transaction

from django_durq.clock import now_ms
from django_durq.models import ACTIVE_STATUSES, Job
from django_durq.store import Store
from tests.ledger import jobs
from tests.ledger.models import Order

ROUNDS = 20
ENQUEUERS = 8


def _in_thread(target: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        try:
            target()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


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

    threads = [_in_thread(complete)] + [_in_thread(enqueuer(index)) for index in range(ENQUEUERS)]
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
