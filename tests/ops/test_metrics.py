"""The metrics view by Prometheus' conventions: ``_total`` counters and histograms that only grow, across a kill -9."""

from __future__ import annotations

import signal
import threading

import pytest
from django.db import connection, connections
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from django_durq import ops
from django_durq.clock import ManualClock, now_ms
from django_durq.db import counters, dialect_for
from django_durq.models import Counter, Job
from django_durq.testing import drain
from tests.conftest import wait_until
from tests.ledger import jobs

COUNTERS = ("enqueued", "started", "finished", "failed", "retried", "dead", "cancelled", "handed_back")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape() -> Samples:
    """Every sample of the view, parsed as Prometheus parses it."""
    response = Client(HTTP_AUTHORIZATION="Bearer scrape-token-0123456789").get("/durq/metrics/")
    assert response.status_code == 200, response.content
    samples: Samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def types_of() -> dict[str, str]:
    body = Client(HTTP_AUTHORIZATION="Bearer scrape-token-0123456789").get("/durq/metrics/").content.decode()
    return {family.name: family.type for family in text_string_to_metric_families(body)}


@pytest.fixture(autouse=True)
def _monitoring(settings):
    settings.DURQ = {**settings.DURQ, "MONITORING": {"TOKEN": "scrape-token-0123456789"}}


pytestmark = pytest.mark.urls("tests.admin.test_admin")


def test_counters_and_histograms_per_queue_and_job_type(transactional_db):
    clock = ManualClock(now_ms() + 1000)
    jobs.noop.enqueue_many([{} for _ in range(3)])
    jobs.fail.using(max_attempts=2).enqueue()
    drain(clock=clock)
    clock.advance(120_000)  # past the failed attempt's backoff
    drain(clock=clock)
    ops.cancel([jobs.noop.using(run_in=3600).enqueue().pk])

    samples = scrape()
    noop = {"queue": "default", "job_name": "tests.noop"}
    fail = {"queue": "default", "job_name": "tests.fail"}
    assert {name: value(samples, f"durq_jobs_{name}_total", **noop) for name in COUNTERS} == {
        "enqueued": 4, "started": 3, "finished": 3, "failed": 0, "retried": 0, "dead": 0, "cancelled": 1, "handed_back": 0,
    }  # fmt: skip
    assert {name: value(samples, f"durq_jobs_{name}_total", **fail) for name in COUNTERS} == {
        "enqueued": 1, "started": 2, "finished": 0, "failed": 2, "retried": 1, "dead": 1, "cancelled": 0, "handed_back": 0,
    }  # fmt: skip
    # Every attempt's wait and run time is observed once.
    assert value(samples, "durq_job_wait_seconds_count", **noop) == 3
    assert value(samples, "durq_job_wait_seconds_count", **fail) == 2
    assert value(samples, "durq_job_run_seconds_count", **noop) == 3
    assert value(samples, "durq_job_run_seconds_count", **fail) == 2, "a failed attempt's run time is observed too"
    buckets = [
        (float(dict(labels)["le"]), count)
        for (name, labels), count in samples.items()
        if name == "durq_job_wait_seconds_bucket" and dict(labels)["job_name"] == "tests.fail"
    ]
    counts = [count for _, count in sorted(buckets)]
    assert counts == sorted(counts) and counts[-1] == 2, "buckets are cumulative and end with +Inf"
    assert value(samples, "durq_job_wait_seconds_bucket", le="+Inf", **noop) == 3

    kinds = types_of()
    assert kinds["durq_jobs_finished"] == "counter" and kinds["durq_job_wait_seconds"] == "histogram"
    assert kinds["durq_jobs"] == "gauge" and kinds["durq_oldest_waiting_seconds"] == "gauge"
    assert kinds["durq_workers"] == "gauge"


def test_a_folded_writer_leaves_every_total_as_it_was(transactional_db):
    dialect = dialect_for(connection)

    def count_in_a_thread_of_its_own() -> None:
        try:
            counters.add(dialect_for(connection), [("q", "t", "finished", 2)])
        finally:
            connections.close_all()

    threads = [threading.Thread(target=count_in_a_thread_of_its_own) for _ in range(3)]
    for thread in threads:
        thread.start()
        thread.join()
    counters.add(dialect, [("q", "t", "finished", 1), ("q", "t", "wait_le:0.5", 1)])
    before = counters.totals("default")
    assert before == [("q", "t", "finished", 7), ("q", "t", "wait_le:0.5", 1)]
    assert Counter.objects.exclude(writer="").count() == 5

    late = Counter.objects.order_by("-updated_ms").values_list("updated_ms", flat=True).first()
    assert counters.fold(dialect, late + counters.FOLD_IDLE_MS + 1) == 5
    assert counters.totals("default") == before
    assert set(Counter.objects.values_list("writer", flat=True)) == {""}
    counters.add(dialect, [("q", "t", "finished", 1)])
    assert counters.fold(dialect, late + counters.FOLD_IDLE_MS + 1) == 0, "a row written since is not idle"
    assert counters.totals("default")[0] == ("q", "t", "finished", 8)


@pytest.mark.processes
def test_rate_holds_across_a_worker_killed_with_sigkill(spawn_worker):
    """Counters after a kill -9 are at least what they were, and finished_total counts every job that finished:
    each completion's count commits with the completion, so none made just before the kill is lost."""
    total = 1500
    jobs.nap.enqueue_many([{"seconds": 0.02} for _ in range(total)])  # 200 a second on 4 slots at most
    labels = {"queue": "default", "job_name": "tests.nap"}
    victim = spawn_worker("--queue", "default:4")
    wait_until(lambda: Job.objects.count() < total - 100, 60, "a hundred jobs to finish")
    before = scrape()
    wait_until(lambda: Job.objects.count() < total - 400, 60, "more jobs to finish")
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=10)
    after_kill = scrape()
    finished_before_kill = total - Job.objects.count()  # finished jobs are deleted (KEEP_FINISHED is 0 here)
    assert finished_before_kill < total, "killed while jobs were left"
    assert value(after_kill, "durq_jobs_finished_total", **labels) == finished_before_kill
    assert value(after_kill, "durq_job_run_seconds_count", **labels) == finished_before_kill
    assert value(after_kill, "durq_jobs_started_total", **labels) >= finished_before_kill

    rescuer = spawn_worker("--queue", "default:4")
    wait_until(lambda: not Job.objects.exists(), 120, "the rest, with the killed worker's jobs taken over")
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait(timeout=30) == 0, rescuer.output()
    after = scrape()

    monotonic = {name for name, _ in before if name.endswith(("_total", "_bucket", "_count", "_sum"))}
    assert {"durq_jobs_finished_total", "durq_job_wait_seconds_bucket", "durq_job_run_seconds_sum"} <= monotonic
    for key, earlier in before.items():
        if key[0] in monotonic:
            assert after_kill.get(key, 0) >= earlier and after.get(key, 0) >= after_kill.get(key, 0), key
    assert value(after, "durq_jobs_enqueued_total", **labels) == total
    assert value(after, "durq_jobs_finished_total", **labels) == total
    assert value(after, "durq_jobs_started_total", **labels) >= total
