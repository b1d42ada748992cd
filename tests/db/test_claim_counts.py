"""A claim counts what it claims as the metrics view reads it, whichever way its dialect writes the count.

PostgreSQL's claim of its own counts in the claim's statement (SQL puts each wait in its bucket);
elsewhere the claim's transaction adds the counts from Python. Both must give the rows that
``counters.started`` describes, bucket edges included.
"""

from __future__ import annotations

from collections import Counter as Tally

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_durq.db import counters
from django_durq.db.store import Store
from django_durq.models import Counter, Job
from tests.conftest import db_vendor
from tests.ledger import jobs

pytestmark = pytest.mark.django_db(transaction=True)

NOW = 1_800_000_000_000
# Waits on both sides of bucket bounds (5 ms, 10 ms, 1 h), none, and past the last bound.
WAITS_MS = (0, 4, 5, 6, 10, 11, 250, 3_600_000, 3_600_001, 7_200_000)


def claim_all(store: Store, waits_ms: tuple[int, ...]) -> list[int]:
    queued = jobs.noop.enqueue_many([{} for _ in waits_ms])
    for row, wait_ms in zip(queued, waits_ms, strict=True):
        Job.objects.filter(pk=row.pk).update(run_at_ms=NOW - wait_ms)
    claimed = store.claim("default", len(waits_ms) + 5, NOW, "test:1:claimer")
    return [job.id for job in claimed]


def counted() -> dict[str, int]:
    """What this thread's claims counted (its enqueues count in the same rows' table too)."""
    rows = Counter.objects.filter(writer=counters.writer(), queue="default", job_name="tests.noop").exclude(metric="enqueued")
    return {row.metric: row.value for row in rows}


def test_each_wait_is_counted_in_the_bucket_its_bound_gives_it():
    store = Store("default")
    assert len(claim_all(store, WAITS_MS)) == len(WAITS_MS)
    buckets = Tally(f"wait_le:{counters.bucket(wait_ms / 1000)}" for wait_ms in WAITS_MS)
    assert buckets["wait_le:0.005"] == 3 and buckets["wait_le:3600"] == 1 and buckets["wait_le:+Inf"] == 2
    assert counted() == {"started": len(WAITS_MS), "wait_sum_ms": sum(WAITS_MS), **buckets}


def test_the_counts_of_later_claims_add_to_the_same_rows():
    store = Store("default")
    claim_all(store, (3, 7))
    claim_all(store, (7,))
    assert counted() == {"started": 3, "wait_sum_ms": 17, "wait_le:0.005": 1, "wait_le:0.01": 2}
    assert Counter.objects.exclude(metric="enqueued").count() == 4


def test_a_claim_that_finds_nothing_counts_nothing():
    assert Store("default").claim("default", 5, NOW, "test:1:claimer") == []
    assert not Counter.objects.exists()  # nothing enqueued either


def test_a_claim_inside_a_transaction_is_counted_by_its_transaction_on_every_database():
    """A claim inside a caller's transaction takes the dialect's plain claim and counts from Python."""
    store = Store("default")
    with transaction.atomic():
        assert connection.in_atomic_block
        claimed = claim_all(store, (4, 6))
    assert len(claimed) == 2
    assert counted() == {"started": 2, "wait_sum_ms": 10, "wait_le:0.005": 1, "wait_le:0.01": 1}


@pytest.mark.skipif(db_vendor() != "postgres", reason="PostgreSQL counts in the claim's own statement")
def test_on_postgresql_a_claim_of_its_own_and_its_count_are_one_statement():
    """One round trip from an idle worker's wake-up to its job: no transaction of several statements."""
    queued = jobs.noop.enqueue_many([{}, {}])
    with CaptureQueriesContext(connection) as statements:
        claimed = Store("default").claim("default", 5, NOW, "test:1:claimer")
    assert sorted(job.id for job in claimed) == sorted(row.pk for row in queued)
    assert len(statements) == 1, [query["sql"] for query in statements]
    assert counted()["started"] == 2
