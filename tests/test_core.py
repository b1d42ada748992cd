"""The queue's contract in one process, on every database, with a manual clock (no sleeping)."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_durq import InvalidPayload, UnknownJobType, enqueue, exclusivity, job
from django_durq.clock import ManualClock, use_clock
from django_durq.conf import get_settings
from django_durq.db.store import Store
from django_durq.execution.executor import Executor
from django_durq.handlers.context import JobContext
from django_durq.handlers.registry import registry
from django_durq.models import Job, Status
from django_durq.testing import drain
from tests.conftest import db_vendor
from tests.ledger import jobs
from tests.ledger.models import Effect, Order

pytestmark = pytest.mark.django_db
transactional = pytest.mark.django_db(transaction=True)


@pytest.fixture
def clock():
    manual = ManualClock(start_ms=1_800_000_000_000)
    with use_clock(manual):
        yield manual


def claim(worker: str, clock: ManualClock, queue: str = "default", limit: int = 1):
    return Store("default").claim(queue, limit, clock.now_ms(), worker)


def run_claimed(job_row, worker: str, clock: ManualClock) -> str:
    store = Store("default")
    executor = Executor(store, get_settings(), clock, worker)
    ctx = JobContext(job_row, worker_id=worker, store=store, clock=clock, shutdown=threading.Event())
    return executor.run(job_row, ctx)


# --- enqueue: names and arguments -------------------------------------------------------------


def test_enqueue_returns_a_waiting_job_with_its_arguments(clock):
    queued = jobs.effect.enqueue(tag="x", sleep=0)
    row = Job.objects.get(pk=queued.pk)
    assert (row.name, row.queue, row.status, row.attempts) == ("tests.effect", "default", "waiting", 0)
    assert row.kwargs == {"tag": "x", "sleep": 0} and row.args == []
    assert row.run_at_ms == row.created_ms == clock.now_ms()
    assert row.max_attempts == get_settings().max_attempts


def test_name_defaults_to_dotted_path_and_can_be_set():
    @job
    def local_handler(ctx):
        return None

    try:
        assert local_handler.name.endswith("test_name_defaults_to_dotted_path_and_can_be_set.<locals>.local_handler")
        assert jobs.effect.name == "tests.effect"
    finally:
        registry.remove(local_handler.name)


def test_enqueue_by_unknown_name_raises_with_close_matches_and_writes_nothing():
    with pytest.raises(UnknownJobType, match=r"tests\.efect.*did you mean 'tests\.effect'"):
        enqueue("tests.efect", tag="x")
    assert Job.objects.count() == 0


class Thing:
    pass


BAD_PAYLOADS = [
    ({"when": datetime(2026, 1, 1, tzinfo=UTC)}, "kwargs['when']", "datetime"),
    ({"amount": Decimal("1.5")}, "kwargs['amount']", "Decimal"),
    ({"tags": {"a", "b"}}, "kwargs['tags']", "set"),
    ({"blob": b"\x00\x01"}, "kwargs['blob']", "bytes"),
    ({"obj": Thing()}, "kwargs['obj']", "Thing"),
    ({"x": float("nan")}, "kwargs['x']", "nan"),
    ({"x": float("inf")}, "kwargs['x']", "inf"),
    ({"text": "a\x00b"}, "kwargs['text']", "NUL"),
    ({"text": "\ud800"}, "kwargs['text']", "surrogate"),
    ({"nested": {1: "int key"}}, "kwargs['nested']", "key of type int"),
    ({"deep": [[[[1, {"k": [set()]}]]]]}, "kwargs['deep'][0][0][0][1]['k'][0]", "set"),
]


@pytest.mark.parametrize(("kwargs", "path", "fragment"), BAD_PAYLOADS)
def test_non_json_arguments_are_refused_naming_path_and_type(kwargs, path, fragment):
    with pytest.raises(InvalidPayload) as raised:
        jobs.noop.enqueue(**kwargs)
    assert raised.value.path == path
    assert fragment in str(raised.value)
    assert Job.objects.count() == 0


def test_model_instance_and_lazy_string_are_refused():
    from django.utils.translation import gettext_lazy

    order = Order.objects.create(label="o")
    with pytest.raises(InvalidPayload, match=r"kwargs\['order'\] is of type tests\.ledger\.models\.Order"):
        jobs.noop.enqueue(order=order)
    with pytest.raises(InvalidPayload, match=r"kwargs\['label'\] is of type django\.utils\.functional"):
        jobs.noop.enqueue(label=gettext_lazy("hello"))
    assert Job.objects.count() == 0


def test_deep_nesting_is_refused_without_recursion_error():
    value: list = []
    for _ in range(100_000):
        value = [value]
    with pytest.raises(InvalidPayload, match="nested more than"):
        jobs.noop.enqueue(deep=value)
    assert Job.objects.count() == 0


def test_payload_over_the_cap_is_refused_with_the_limit_named(settings):
    settings.DURQ = {**settings.DURQ, "MAX_PAYLOAD_BYTES": 1000}
    with pytest.raises(InvalidPayload, match=r"over the limit of 1000 bytes"):
        jobs.noop.enqueue(text="字" * 400)  # 1,200 bytes of UTF-8
    jobs.noop.enqueue(text="a" * 900)
    assert Job.objects.count() == 1


@transactional
def test_refused_enqueue_leaves_the_callers_transaction_usable():
    with transaction.atomic():
        Order.objects.create(label="before")
        with pytest.raises(InvalidPayload):
            jobs.noop.enqueue(x=float("nan"))
        with pytest.raises(UnknownJobType):
            enqueue("no.such.job")
        Order.objects.create(label="after")
    assert sorted(Order.objects.values_list("label", flat=True)) == ["after", "before"]
    assert Job.objects.count() == 0


def test_unicode_payload_round_trips_exactly(clock):
    text = "日本語 ✓ emoji 🎉 and \u2028 separators"
    queued = jobs.noop.enqueue(text=text, nested={"a": [1, 2.5, None, True]})
    assert Job.objects.get(pk=queued.pk).kwargs == {"text": text, "nested": {"a": [1, 2.5, None, True]}}


def test_enqueue_many_is_one_insert(clock):
    # 40 rows fit one INSERT everywhere (SQLite splits bigger batches at its variable limit).
    with CaptureQueriesContext(connection) as queries:
        created = jobs.noop.enqueue_many([{"n": i} for i in range(40)])
    inserts = [query["sql"] for query in queries.captured_queries if query["sql"].startswith("INSERT")]
    # The jobs, and their count for the metrics (db/counters.py), in the same transaction.
    assert len(inserts) == 2 and "durq_counter" not in inserts[0] and "durq_counter" in inserts[1]
    assert len(created) == 40 and all(row.pk for row in created)
    assert Job.objects.count() == 40


def test_enqueue_many_returns_each_job_as_stored(clock):
    created = jobs.noop.using(priority=3, queue="bulk").enqueue_many([{"n": i, "pad": "x" * (i % 7)} for i in range(1500)])
    stored = {row.pk: row for row in Job.objects.all()}
    assert len(stored) == 1500 and [queued.pk for queued in created] == sorted(stored)
    for queued in created:
        row = stored[queued.pk]
        assert (queued.arguments, queued.queue, queued.priority, queued.status) == (row.arguments, "bulk", 3, Status.WAITING)
        assert queued.kwargs["pad"] == "x" * (queued.kwargs["n"] % 7) and not queued._state.adding
    assert [queued.kwargs["n"] for queued in created] == list(range(1500))


def test_enqueue_many_keeps_large_and_unicode_payloads_in_order(clock):
    # 9 payloads of ~0.9 MB: more bytes than one bulk statement carries on MariaDB (4 MB).
    texts = [f"{i} 日本語 🎉 \\ \" ' \n" + chr(0x4E00 + i) * 300_000 for i in range(9)]
    created = jobs.noop.enqueue_many([{"text": text} for text in texts])
    stored = Job.objects.in_bulk([queued.pk for queued in created])
    assert [stored[queued.pk].kwargs["text"] for queued in created] == texts
    assert [queued.pk for queued in created] == sorted(stored)


# --- claiming order, delays -------------------------------------------------------------------


def test_claim_order_is_priority_then_due_time_then_id(clock):
    low = jobs.noop.using(priority=0).enqueue()
    clock.advance(1)
    high = jobs.noop.using(priority=5).enqueue()
    early_low = jobs.noop.using(priority=0, run_at=datetime.fromtimestamp((clock.now_ms() - 5000) / 1000, UTC)).enqueue()
    clock.advance(1)
    order = [claim("w", clock)[0].id for _ in range(3)]
    assert order == [high.pk, early_low.pk, low.pk]


def test_delayed_job_is_not_claimed_before_it_is_due(clock):
    delayed = jobs.noop.using(run_in=timedelta(minutes=1)).enqueue()
    assert claim("w", clock) == []
    clock.advance(59_999)
    assert claim("w", clock) == []
    clock.advance(1)
    assert [row.id for row in claim("w", clock)] == [delayed.pk]


def test_batch_claim_returns_at_most_the_limit(clock):
    jobs.noop.enqueue_many([{} for _ in range(10)])
    batch = claim("w", clock, limit=4)
    assert len(batch) == 4 and len({row.id for row in batch}) == 4
    assert Job.objects.running().count() == 4
    assert all(row.attempts == 1 and row.claim_token == 1 for row in batch)


def test_named_queues_are_claimed_separately(clock):
    jobs.effect_fast.enqueue()
    jobs.effect.enqueue()
    assert [row.name for row in claim("w", clock, queue="fast", limit=5)] == ["tests.effect_fast"]
    assert [row.name for row in claim("w", clock, queue="default", limit=5)] == ["tests.effect"]


# --- outcomes ---------------------------------------------------------------------------------


def test_finished_jobs_are_deleted_by_default(clock):
    jobs.effect.enqueue(tag="done")
    assert drain(clock=clock) == {"finished": 1}
    assert Job.objects.count() == 0 and Effect.objects.get().tag == "done"


def test_finished_jobs_keep_their_result_when_retention_is_on(clock, settings):
    settings.DURQ = {**settings.DURQ, "KEEP_FINISHED": 3600}
    queued = jobs.fail_until.using(max_attempts=5).enqueue(succeed_on=1)
    drain(clock=clock)
    row = Job.objects.get(pk=queued.pk)
    assert row.status == Status.FINISHED and json.loads(row.result) == {"attempt": 1}
    assert row.finished_ms == clock.now_ms()


def test_failures_retry_with_backoff_then_become_a_dead_letter(clock):
    queued = jobs.fail.enqueue(message="nope")  # max_attempts=3
    backoff = get_settings().backoff
    for attempt in (1, 2):
        failed_at = clock.now_ms()
        assert drain(clock=clock) == {"retrying": 1}
        row = Job.objects.get(pk=queued.pk)
        low, high = backoff.bounds_ms(attempt)
        assert row.status == Status.WAITING and row.attempts == attempt
        assert failed_at + low <= row.run_at_ms <= failed_at + high
        assert drain(clock=clock) == {}  # not before it is due
        clock.set(row.run_at_ms)
    assert drain(clock=clock) == {"dead": 1}
    row = Job.objects.get(pk=queued.pk)
    assert row.status == Status.DEAD and row.attempts == 3
    errors = row.error_list
    assert [e["attempt"] for e in errors] == [1, 2, 3]
    assert all(e["type"] == "ValueError" and e["message"] == "nope" and "Traceback" in e["traceback"] for e in errors)
    assert Effect.objects.filter(tag="fail").count() == 3


def test_is_last_attempt_only_on_the_last(clock):
    jobs.fail_until.using(max_attempts=3).enqueue(succeed_on=3)
    for _ in range(3):
        drain(clock=clock)
        clock.advance(timedelta(hours=1))
    assert list(Effect.objects.order_by("id").values_list("tag", flat=True)) == [
        "attempt1:False",
        "attempt2:False",
        "attempt3:True",
    ]
    assert Job.objects.count() == 0  # succeeded on attempt 3, then deleted


def test_dead_letter_fires_the_job_dead_signal(clock):
    from django_durq.signals import job_dead

    seen = []

    def receiver(sender, **kwargs):
        seen.append(kwargs)

    job_dead.connect(receiver)
    try:
        queued = jobs.abort.enqueue()
        assert drain(clock=clock) == {"dead": 1}
    finally:
        job_dead.disconnect(receiver)
    assert seen[0]["job_id"] == queued.pk and seen[0]["name"] == "tests.abort"
    assert Job.objects.get(pk=queued.pk).attempts == 1  # Abort: no retries


def test_retry_exception_reschedules_explicitly(clock):
    queued = jobs.retry_explicit.enqueue(seconds=30)
    assert drain(clock=clock) == {"retrying": 1}
    row = Job.objects.get(pk=queued.pk)
    assert row.run_at_ms == clock.now_ms() + 30_000
    assert row.error_list[0]["kind"] == "retry" and row.error_list[0]["message"] == "not yet"
    clock.advance(30_000)
    assert drain(clock=clock) == {"finished": 1}


@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt", "GeneratorExit", "MemoryError", "RecursionError", "BadStr"])
def test_any_exception_from_a_handler_is_a_failed_attempt(clock, kind):
    queued = jobs.raise_base.using(max_attempts=2).enqueue(kind=kind)
    assert drain(clock=clock) == {"retrying": 1}
    error = Job.objects.get(pk=queued.pk).error_list[0]
    assert error["kind"] == "exception" and error["message"]
    assert kind in error["type"] or kind in error["traceback"]
    jobs.effect.enqueue(tag="still alive")
    assert drain(clock=clock) == {"finished": 1}


def test_async_handlers_run(clock):
    jobs.async_effect.enqueue(tag="from async")
    assert drain(clock=clock) == {"finished": 1}
    assert Effect.objects.get().tag == "from async"


def test_progress_is_recorded_while_running(clock):
    queued = jobs.progress.enqueue(steps=4)
    (claimed,) = claim("w", clock)
    store = Store("default")
    ctx = JobContext(claimed, worker_id="w", store=store, clock=clock, shutdown=threading.Event())
    assert ctx.progress(2, 4)
    row = Job.objects.get(pk=queued.pk)
    assert (row.progress_done, row.progress_total) == (2, 4)


# --- rows nobody can run ------------------------------------------------------------------------


def insert_raw(name: str, arguments: str = '{"args":[],"kwargs":{}}', max_attempts: int = 3, now: int = 0) -> int:
    row = Job.objects.create(
        name=name,
        queue="default",
        arguments=arguments,
        max_attempts=max_attempts,
        run_at_ms=now,
        created_ms=now,
        lease_ms=30_000,
    )
    return row.pk


def test_unknown_job_type_is_handed_back_uncounted_then_runs_once_its_handler_appears(clock):
    pk = insert_raw("tests.later", now=clock.now_ms())
    assert drain(clock=clock) == {"unknown type": 1}
    row = Job.objects.get(pk=pk)
    # Handed back for a worker that has the handler: attempt not counted, due again a second later.
    assert (row.status, row.attempts, row.run_at_ms) == ("waiting", 0, clock.now_ms() + 1_000)
    [note] = row.error_list
    assert (note["kind"], note["counted"]) == ("unknown_job", False)
    assert note["message"].startswith("unknown job type 'tests.later' in worker drain:")
    jobs.effect.enqueue(tag="unaffected")
    clock.advance(timedelta(minutes=5))

    @job(name="tests.later")
    def later(ctx):
        jobs.record(ctx, "later")

    try:
        assert drain(clock=clock) == {"finished": 2}
    finally:
        registry.remove("tests.later")
    assert sorted(Effect.objects.values_list("tag", flat=True)) == ["later", "unaffected"]


def test_a_type_that_stays_unknown_waits_longer_each_time_and_is_a_dead_letter_after_an_hour(clock):
    from django_durq.execution.unknown_types import UNKNOWN_TYPE_LIMIT_MS

    pk = insert_raw("tests.gone", max_attempts=3, now=clock.now_ms())
    first = clock.now_ms()
    hand_backs = 0
    while Job.objects.get(pk=pk).status == "waiting":
        row = Job.objects.get(pk=pk)
        clock.advance(max(row.run_at_ms - clock.now_ms(), 0))
        assert drain(clock=clock) in ({"unknown type": 1}, {"dead": 1})
        hand_backs += 1
        row = Job.objects.get(pk=pk)
        if row.status == "waiting":
            waited = clock.now_ms() - first
            assert row.attempts == 0 and len(row.error_list) == 1  # noted once, never counted
            assert row.run_at_ms - clock.now_ms() == min(max(waited // 10, 1_000), 300_000)
    # An hour of hand-backs at a growing pace costs tens of claims, not thousands.
    assert clock.now_ms() - first >= UNKNOWN_TYPE_LIMIT_MS and hand_backs < 100
    row = Job.objects.get(pk=pk)
    assert (row.status, row.attempts) == ("dead", 1)
    _, dead = row.error_list
    assert (dead["kind"], dead.get("counted", True)) == ("unknown_job", True)
    assert dead["message"].startswith("unknown job type 'tests.gone': no worker that claimed it in 60 minutes had a handler")


def test_a_dotted_path_in_the_database_is_never_imported(clock, tmp_path):
    from django_durq.execution.unknown_types import UNKNOWN_TYPE_LIMIT_MS

    target = tmp_path / "pwned"
    arguments = json.dumps({"args": [f"touch {target}"], "kwargs": {}})
    pk = insert_raw("os.system", arguments=arguments, max_attempts=1, now=clock.now_ms())
    assert drain(clock=clock) == {"unknown type": 1}
    clock.advance(UNKNOWN_TYPE_LIMIT_MS)
    assert drain(clock=clock) == {"dead": 1}
    assert not target.exists()
    assert [e["kind"] for e in Job.objects.get(pk=pk).error_list] == ["unknown_job", "unknown_job"]


def test_arguments_that_do_not_fit_are_bound_before_the_call_and_the_job_is_a_dead_letter(clock):
    pk = insert_raw("tests.read_order", arguments='{"args":[],"kwargs":{"order":1}}', max_attempts=5, now=clock.now_ms())
    assert drain(clock=clock) == {"dead": 1}
    row = Job.objects.get(pk=pk)
    [entry] = row.error_list
    assert (row.attempts, entry["kind"], entry["type"]) == (1, "arguments", "TypeError")
    assert entry["message"] == (
        "its stored arguments do not fit the handler tests.ledger.jobs.read_order(order_id) (after the JobContext): "
        "unexpected keyword argument 'order'; the job was queued for another version of the handler, and a job whose "
        "arguments change needs a new name (see the rolling deploys guide)"
    )
    assert not Effect.objects.exists()


def test_a_type_error_raised_inside_the_handler_is_an_ordinary_failure(clock):
    queued = jobs.type_error_inside.enqueue(tag="bug")
    assert drain(clock=clock) == {"retrying": 1}
    [entry] = Job.objects.get(pk=queued.pk).error_list
    assert (entry["kind"], entry["type"]) == ("exception", "TypeError")


def test_corrupt_arguments_are_a_failed_attempt(clock):
    pk = insert_raw("tests.noop", arguments="[" * 50_000, max_attempts=1, now=clock.now_ms())
    assert drain(clock=clock) == {"dead": 1}
    assert Job.objects.get(pk=pk).error_list[0]["message"].startswith("payload decode error")


# --- leases and fencing -----------------------------------------------------------------------


def test_expired_lease_is_claimed_again_and_recorded(clock):
    queued = jobs.effect.using(lease=timedelta(seconds=10)).enqueue(tag="x")
    (first,) = claim("worker-a", clock)
    clock.advance(9_999)
    assert claim("worker-b", clock) == []
    clock.advance(1)
    (second,) = claim("worker-b", clock)
    assert second.id == queued.pk and second.attempts == 2 and second.claim_token == first.claim_token + 1
    assert second.reclaimed_from == "worker-a"
    assert run_claimed(second, "worker-b", clock) == "finished"
    # The first worker finishing late changes nothing: its token is stale.
    assert run_claimed(first, "worker-a", clock) == "lost"
    assert Effect.objects.count() == 2 and Job.objects.count() == 0


def test_lease_expiry_is_written_to_the_error_history(clock, settings):
    settings.DURQ = {**settings.DURQ, "KEEP_FINISHED": 3600}
    queued = jobs.effect.using(lease=timedelta(seconds=10)).enqueue()
    claim("worker-a", clock)
    clock.advance(10_000)
    (second,) = claim("worker-b", clock)
    run_claimed(second, "worker-b", clock)
    (entry,) = Job.objects.get(pk=queued.pk).error_list
    assert entry == {
        "attempt": 1,
        "at_ms": clock.now_ms(),
        "worker": "worker-a",
        "kind": "lease_expired",
        "type": "",
        "message": "lease expired: worker lost",
        "traceback": "",
    }


def test_heartbeat_defeats_a_steal(clock):
    jobs.effect.using(lease=timedelta(seconds=10)).enqueue()
    (held,) = claim("worker-a", clock)
    store = Store("default")
    ctx = JobContext(held, worker_id="worker-a", store=store, clock=clock, shutdown=threading.Event())
    for _ in range(5):
        clock.advance(8_000)
        assert ctx.heartbeat() is True
        assert claim("worker-b", clock) == []
    assert not ctx.should_stop()


def test_a_worker_that_lost_its_lease_learns_it_from_heartbeat(clock):
    jobs.effect.using(lease=timedelta(seconds=10)).enqueue()
    (held,) = claim("worker-a", clock)
    ctx = JobContext(held, worker_id="worker-a", store=Store("default"), clock=clock, shutdown=threading.Event())
    clock.advance(10_000)
    assert claim("worker-b", clock)
    assert ctx.heartbeat() is False
    assert ctx.should_stop() and ctx.stop_reason() == "lease lost"
    assert ctx.progress(1, 2) is False


def test_a_worker_killed_on_the_last_attempt_makes_a_dead_letter(clock):
    from django_durq.worker.pool import Pool
    from django_durq.worker.runtime import Runtime

    queued = jobs.effect.using(max_attempts=2, lease=timedelta(seconds=10)).enqueue()
    claim("worker-a", clock)
    clock.advance(10_000)
    claim("worker-b", clock)
    clock.advance(10_000)
    assert claim("worker-c", clock) == []  # attempts are used up: never a third run
    runtime = Runtime(settings=get_settings(), clock=clock)
    Pool("default", 1, runtime).bury_expired(clock.now_ms())
    row = Job.objects.get(pk=queued.pk)
    assert row.status == Status.DEAD and row.attempts == 2
    assert [e["kind"] for e in row.error_list] == ["lease_expired"]
    assert row.error_list[0]["worker"] == "worker-b"


@pytest.mark.skipif(db_vendor() != "sqlite", reason="SQLite's page cache is per connection and grows to 2 MB")
def test_the_dispatcher_claims_on_a_connection_with_a_small_page_cache(clock):
    from django_durq.db.sqlite import DISPATCHER_PAGE_CACHE_KIB
    from django_durq.worker.pool import Pool
    from django_durq.worker.runtime import Runtime

    queued = jobs.effect.enqueue()
    pool = Pool("default", 1, Runtime(settings=get_settings(), clock=clock))
    assert [job.id for job in pool._record_completions([], [1, clock.now_ms()])] == [queued.pk]
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA cache_size")
        assert cursor.fetchone()[0] == -DISPATCHER_PAGE_CACHE_KIB


def test_shutdown_release_hands_the_job_back_without_counting_the_attempt(clock):
    queued = jobs.effect.enqueue()
    (held,) = claim("worker-a", clock)
    clock.advance(5_000)
    assert Store("default").dialect.release([(held.id, held.claim_token)], started=True) == 1
    row = Job.objects.get(pk=queued.pk)
    assert row.status == Status.WAITING and row.attempts == 0 and row.lease_expires_ms is None
    assert row.run_at_ms == queued.run_at_ms  # still due, and a scheduled job keeps its due time
    assert claim("worker-b", clock)[0].id == queued.pk


# --- dedupe -------------------------------------------------------------------------------------


def test_dedupe_returns_the_active_job_and_says_so(clock):
    first = jobs.noop.using(unique="k1").enqueue(n=1)
    second = jobs.noop.using(unique="k1").enqueue(n=2)
    assert not first.deduplicated and second.deduplicated and second.pk == first.pk
    assert Job.objects.count() == 1
    claim("w", clock)  # running still owns the key
    assert jobs.noop.using(unique="k1").enqueue().pk == first.pk


def test_a_dead_letter_never_owns_its_key(clock):
    dead = jobs.abort.using(unique="k2").enqueue()
    drain(clock=clock)
    assert Job.objects.get(pk=dead.pk).status == Status.DEAD
    fresh = jobs.abort.using(unique="k2").enqueue()
    assert fresh.pk != dead.pk and not fresh.deduplicated
    assert Job.objects.filter(unique_key="k2").count() == 2


@pytest.mark.skipif(db_vendor() == "mysql", reason="MariaDB has no partial indexes; it keeps migration 0001's")
def test_queue_indexes_hold_only_the_rows_their_queries_look_for():
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT name, sql FROM sqlite_master WHERE tbl_name = 'durq_job' AND sql LIKE 'CREATE%INDEX%'")
        else:
            cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'durq_job'")
        definitions = dict(cursor.fetchall())
    assert "unique_active IS NOT NULL" in definitions["durq_job_unique_active"]
    for name, status in (("durq_job_claim", "waiting"), ("durq_job_due", "waiting"), ("durq_job_lease", "running")):
        assert f"'{status}'" in definitions[name].split("WHERE", 1)[1], name
    for name in ("durq_job_done", "durq_job_status_finished"):  # a job deleted at its finish never enters them
        assert "finished_ms IS NOT NULL" in definitions[name], name


@transactional
def test_dedupe_inside_a_transaction_keeps_it_usable(clock):
    jobs.noop.using(unique="k3").enqueue()
    with transaction.atomic():
        Order.objects.create(label="a")
        again = jobs.noop.using(unique="k3").enqueue()
        Order.objects.create(label="b")
    assert again.deduplicated and Order.objects.count() == 2


@transactional
def test_two_connections_racing_one_key_make_one_job():
    rounds, racers = 10, 4
    for round_number in range(rounds):
        barrier = threading.Barrier(racers)
        ids: list[int] = []
        failures: list[BaseException] = []

        def race(key: str, barrier: threading.Barrier, ids: list[int], failures: list[BaseException]) -> None:
            try:
                barrier.wait()
                ids.append(jobs.noop.using(unique=key).enqueue().pk)
            except BaseException as error:  # noqa: BLE001 - reported below
                failures.append(error)
            finally:
                connections.close_all()

        args = (f"race-{round_number}", barrier, ids, failures)
        threads = [threading.Thread(target=race, args=args) for _ in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert len(set(ids)) == 1 and len(ids) == racers
    assert Job.objects.count() == rounds


@pytest.mark.skipif(db_vendor() == "sqlite", reason="SQLite serializes claimers; there is no lock to hold open")
@transactional
def test_an_open_claim_locks_only_the_jobs_it_takes(clock):
    # Few due jobs among many delayed ones: the shape in which MariaDB's optimizer, left to
    # itself, reads the due rows through the due index and sorts them, locking every one.
    jobs.noop.using(run_in=3600).enqueue_many([{"n": n} for n in range(3000)])
    jobs.noop.enqueue_many([{"n": n} for n in range(8)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE TABLE durq_job" if db_vendor() == "mysql" else "ANALYZE durq_job")
        if db_vendor() == "mysql":
            cursor.fetchall()
    held = threading.Event()
    done = threading.Event()
    first: list[int] = []

    def hold_a_claim_open() -> None:
        try:
            with transaction.atomic():
                first.extend(job.id for job in claim("a", clock, limit=4))
                held.set()
                done.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold_a_claim_open)
    thread.start()
    try:
        assert held.wait(30)
        second = [job.id for job in claim("b", clock, limit=4)]
    finally:
        done.set()
        thread.join()
    assert len(first) == 4 and len(second) == 4 and not set(first) & set(second)


# --- transactions -------------------------------------------------------------------------------


@transactional
def test_rollback_leaves_no_job():
    with pytest.raises(RuntimeError), transaction.atomic():
        order = Order.objects.create(label="x")
        jobs.read_order.enqueue(order_id=order.pk)
        raise RuntimeError("rollback")
    assert Job.objects.count() == 0 and Order.objects.count() == 0


@transactional
def test_wake_up_happens_on_commit_not_before():
    from django_durq.db import wakeup

    calls: list[bool] = []
    wakeup.subscribe("default", calls.append)
    try:
        with transaction.atomic():
            jobs.noop.enqueue()
            assert calls == []
        assert calls == [True]  # the notification names the queue
    finally:
        wakeup.unsubscribe("default", calls.append)


def test_exclusivity_is_reported_in_plain_words():
    expected = {
        "sqlite": "processes on one host sharing the database file",
        "postgres": "any number of hosts",
        "mysql": "any number of hosts",
    }[db_vendor()]
    assert exclusivity() == expected


def test_importing_the_package_loads_no_model():
    import subprocess
    import sys

    code = "import sys, django_durq; assert 'django_durq.models' not in sys.modules; print(django_durq.enqueue.__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "enqueue"


@pytest.mark.skipif(db_vendor() == "sqlite", reason="a server database's site")
def test_a_server_database_site_never_loads_sqlite(db):
    import os
    import subprocess
    import sys

    # The sqlite3 module maps SQLite's library: about 1 MB of a worker's memory for nothing.
    code = (
        "import sys, django; django.setup()\n"
        "from django.db import connection\n"
        "from django_durq.db import dialect_for\n"
        "dialect_for(connection).due_times('default')\n"
        "print('sqlite3' in sys.modules)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DURQ_TEST_DB_IN_USE": connection.settings_dict["NAME"]}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_one_name_cannot_serve_two_different_functions():
    def first(ctx):
        return 1

    def second(ctx):
        return 2

    second.__module__ = "elsewhere"
    second.__qualname__ = first.__qualname__
    job(name="tests.clash")(first)
    try:
        with pytest.raises(ValueError, match="already used"):
            job(name="tests.clash")(second)
        job(name="tests.clash")(first)  # the same function again (a module re-import) is fine
    finally:
        registry.remove("tests.clash")
