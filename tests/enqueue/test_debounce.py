"""Debounce and replace: ``using(unique=..., on_duplicate="replace" | "reschedule")``.

An enqueue whose key is held by a waiting job of the same handler changes that job in place and
returns it; a running job is never changed. Races use real threads, each with its own
connection, and a worker test runs a real worker process.
"""

from __future__ import annotations

import json
import random
import re
import signal
import threading
import time
from collections.abc import Callable

import pytest
from django.db import IntegrityError, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_durq.clock import now_ms
from django_durq.db.store import Store
from django_durq.exceptions import InvalidPayload
from django_durq.models import ACTIVE_STATUSES, Job, Status, WorkerProcess
from tests.conftest import db_vendor, wait_until
from tests.enqueue.helpers import in_thread
from tests.ledger import jobs
from tests.ledger.models import Effect, Order

MINUTE_MS = 60_000


def _row(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def _active(key: str) -> list[Job]:
    return list(Job.objects.filter(unique_key=key, status__in=ACTIVE_STATUSES))


# --- the option, refused where it is given ------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"unique": "k", "on_duplicate": "merge"}, ValueError, "on_duplicate 'merge' is not one of 'keep', 'replace', 'resch"),
        ({"unique": "k", "on_duplicate": 1}, TypeError, "on_duplicate must be one of 'keep', 'replace', 'reschedule', not int"),
        ({"on_duplicate": "replace"}, ValueError, "on_duplicate='replace' acts on a dedupe key: pass unique=... too"),
        ({"on_duplicate": "keep"}, ValueError, "on_duplicate='keep' acts on a dedupe key"),
    ],
    ids=["unknown", "not-a-string", "no-key", "keep-without-key"],
)
@pytest.mark.django_db
def test_a_bad_on_duplicate_is_refused_by_using_before_any_sql(options, error, message):
    with CaptureQueriesContext(connections["default"]) as queries, pytest.raises(error, match=re.escape(message)):
        jobs.effect.using(**options)
    assert len(queries) == 0


@pytest.mark.django_db
def test_on_duplicate_may_follow_the_key_given_to_an_earlier_using():
    definition = jobs.effect.using(unique="later").using(on_duplicate="replace")
    assert definition.options.unique == "later" and definition.options.on_duplicate == "replace"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"tga": "x"}, TypeError), ({"tag": object()}, InvalidPayload), ({"tag": "x" * 2_000_000}, InvalidPayload)],
    ids=["misspelt", "not-json", "over-the-cap"],
)
@pytest.mark.django_db
def test_replacement_arguments_are_checked_before_any_sql_and_the_holder_is_untouched(kwargs, error):
    holder = jobs.effect.using(unique="checked", run_in=60).enqueue(tag="kept")
    replace = jobs.effect.using(unique="checked", on_duplicate="replace")
    with CaptureQueriesContext(connections["default"]) as queries, pytest.raises(error):
        replace.enqueue(**kwargs)
    assert len(queries) == 0
    assert _row(holder).kwargs == {"tag": "kept"}


# --- what each mode does to a waiting holder ----------------------------------------------------


@pytest.mark.django_db
def test_keep_is_the_default_and_leaves_the_holder_as_it_is():
    first = jobs.effect.using(unique="keep", run_in=60).enqueue(tag="a")
    again = jobs.effect.using(unique="keep", run_in=120, priority=9).enqueue(tag="b")
    explicit = jobs.effect.using(unique="keep", on_duplicate="keep").enqueue(tag="c")
    for job in (again, explicit):
        assert job.pk == first.pk and job.deduplicated and not job.replaced
    row = _row(first)
    assert (row.kwargs, row.run_at_ms, row.priority) == ({"tag": "a"}, first.run_at_ms, 0)
    assert not first.deduplicated and not first.replaced


@pytest.mark.django_db
def test_replace_gives_the_waiting_job_the_new_arguments_priority_and_due_time():
    first = jobs.effect.using(unique="replace:1", run_in=60).enqueue(tag="a")
    before = now_ms()
    again = jobs.effect.using(unique="replace:1", run_in=120, priority=5, on_duplicate="replace").enqueue(tag="b")
    assert again.pk == first.pk
    assert again.deduplicated and again.replaced
    # The returned job is the row as it now is, read back from the database.
    assert (again.kwargs, again.priority, again.status) == ({"tag": "b"}, 5, Status.WAITING)
    assert again.run_at_ms >= before + 2 * MINUTE_MS
    row = _row(first)
    assert (row.arguments, row.priority, row.run_at_ms) == (again.arguments, 5, again.run_at_ms)
    assert (row.created_ms, row.attempts) == (first.created_ms, 0)
    assert [job.pk for job in _active("replace:1")] == [first.pk]


@pytest.mark.django_db
def test_reschedule_moves_only_the_due_time_later_or_earlier():
    first = jobs.effect.using(unique="resched", run_in=60, priority=3).enqueue(tag="a")
    later = jobs.effect.using(unique="resched", run_in=300, on_duplicate="reschedule").enqueue(tag="b")
    assert later.pk == first.pk and later.deduplicated and later.replaced
    assert later.run_at_ms > first.run_at_ms + 3 * MINUTE_MS
    assert (later.kwargs, later.priority) == ({"tag": "a"}, 3)
    sooner = jobs.effect.using(unique="resched", on_duplicate="reschedule").enqueue(tag="c")
    assert sooner.run_at_ms <= now_ms() < first.run_at_ms
    assert (_row(first).kwargs, _row(first).run_at_ms) == ({"tag": "a"}, sooner.run_at_ms)


@pytest.mark.django_db
def test_a_key_held_by_another_handler_is_returned_unchanged():
    holder = jobs.noop.using(unique="shared", run_in=60).enqueue(n=1)
    other = jobs.effect.using(unique="shared", on_duplicate="replace").enqueue(tag="b")
    assert other.pk == holder.pk and other.deduplicated and not other.replaced
    assert (_row(holder).name, _row(holder).kwargs, _row(holder).run_at_ms) == ("tests.noop", {"n": 1}, holder.run_at_ms)


@pytest.mark.django_db
def test_a_free_key_is_inserted_as_usual():
    job = jobs.effect.using(unique="free", on_duplicate="replace").enqueue(tag="a")
    assert not job.deduplicated and not job.replaced and _row(job).kwargs == {"tag": "a"}


@pytest.mark.django_db
def test_a_job_waiting_for_its_retry_keeps_its_attempts_and_errors_when_replaced():
    first = jobs.effect.using(unique="retrying").enqueue(tag="a")
    (claimed,) = Store("default").claim("default", 1, now_ms(), "w")
    lease = (claimed.id, claimed.claim_token)
    assert Store("default").dialect.retry_later(lease, now_ms() + MINUTE_MS, now_ms(), '[{"message": "boom"}]')
    again = jobs.effect.using(unique="retrying", on_duplicate="replace").enqueue(tag="b")
    assert again.pk == first.pk and again.replaced
    assert (again.kwargs, again.attempts, again.last_error) == ({"tag": "b"}, 1, {"message": "boom"})


# --- a running holder is never changed ----------------------------------------------------------


@pytest.mark.parametrize("mode", ["replace", "reschedule"])
@pytest.mark.django_db
def test_a_running_holder_is_returned_unchanged(mode):
    first = jobs.effect.using(unique=f"running:{mode}").enqueue(tag="a")
    (claimed,) = Store("default").claim("default", 1, now_ms(), "w")
    assert claimed.id == first.pk
    before = _row(first)
    again = jobs.effect.using(unique=f"running:{mode}", run_in=60, priority=7, on_duplicate=mode).enqueue(tag="b")
    assert again.pk == first.pk and again.deduplicated and not again.replaced
    assert again.status == Status.RUNNING
    after = _row(first)
    assert (after.arguments, after.run_at_ms, after.priority, after.claim_token) == (
        before.arguments,
        before.run_at_ms,
        before.priority,
        claimed.claim_token,
    )


# --- inside the caller's transaction, and enqueue_many ------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_replace_is_part_of_the_callers_transaction_which_stays_usable():
    holder = jobs.effect.using(unique="txn", run_in=60).enqueue(tag="a")
    with transaction.atomic():
        Order.objects.create(label="before")
        again = jobs.effect.using(unique="txn", on_duplicate="replace").enqueue(tag="b")
        Order.objects.create(label="after")
    assert again.replaced and _row(holder).kwargs == {"tag": "b"}
    assert Order.objects.count() == 2

    with pytest.raises(RuntimeError), transaction.atomic():
        jobs.effect.using(unique="txn", on_duplicate="replace").enqueue(tag="rolled back")
        raise RuntimeError("the view failed")
    assert _row(holder).kwargs == {"tag": "b"}


@pytest.mark.django_db(transaction=True)
def test_enqueue_many_with_replace_leaves_one_job_with_the_last_items_arguments():
    created = jobs.effect.using(unique="many", run_in=60, on_duplicate="replace").enqueue_many(
        [{"tag": "a"}, {"tag": "b"}, {"tag": "c"}]
    )
    assert len({job.pk for job in created}) == 1
    assert [job.replaced for job in created] == [False, True, True]
    assert created[-1].kwargs == {"tag": "c"}
    assert [job.kwargs for job in _active("many")] == [{"tag": "c"}]


# --- races between enqueuers, and with claimers -------------------------------------------------

ROUNDS = 8
ENQUEUERS = 6


def _stall(execute, sql, params, many, context):
    """An injected stall before the enqueue's insert and its locking read: where a thread may lose the CPU."""
    if sql.startswith("INSERT INTO durq_job") or sql.endswith("FOR UPDATE"):
        time.sleep(random.uniform(0, 0.01))
    return execute(sql, params, many, context)


def _replacers(key: str, mode: str, *, before: Callable[[], None] | None = None) -> tuple[list[int], list[int], list[str]]:
    """``ENQUEUERS`` threads enqueue ``key`` at once, each in a transaction that stalls a little
    while it holds the row; returns (ids returned, indexes in the order they took the row, errors).

    ``before``, when given, runs in one more thread released by the same barrier.
    """
    barrier = threading.Barrier(ENQUEUERS + (before is not None))
    returned: list[int] = []
    order: list[int] = []
    errors: list[str] = []
    record = threading.Lock()

    def enqueuer(index: int) -> Callable[[], None]:
        def enqueue() -> None:
            barrier.wait()
            try:
                with connections["default"].execute_wrapper(_stall), transaction.atomic():
                    Order.objects.create(label=f"{key}:{index}")
                    job = jobs.effect.using(unique=key, run_in=60, on_duplicate=mode).enqueue(tag=str(index))
                    # Still holding the row (or the write lock): no other enqueuer can be in between.
                    with record:
                        returned.append(job.pk)
                        order.append(index)
                    if mode == "replace" and job.status == Status.WAITING:
                        assert job.kwargs == {"tag": str(index)}, (index, job.kwargs)
                    time.sleep(random.uniform(0, 0.02))  # a stall while holding the row
                    Order.objects.filter(label=f"{key}:{index}").count()  # the transaction still works
            except Exception as error:  # noqa: BLE001 - reported by the test
                errors.append(f"{key} #{index}: {type(error).__name__}: {error}")

        return enqueue

    def first_wait_then(run: Callable[[], None]) -> Callable[[], None]:
        def go() -> None:
            barrier.wait()
            run()

        return go

    threads = [in_thread(enqueuer(index)) for index in range(ENQUEUERS)]
    if before is not None:
        threads.append(in_thread(first_wait_then(before)))
    for thread in threads:
        thread.join()
    return returned, order, errors


@pytest.mark.parametrize("held", [False, True], ids=["free-key", "held-key"])
@pytest.mark.django_db(transaction=True)
def test_concurrent_replacers_of_one_key_end_with_one_job_holding_the_last_ones_arguments(held):
    for round_number in range(ROUNDS):
        key = f"race:{held}:{round_number}"
        if held:
            holder = jobs.effect.using(unique=key, run_in=60).enqueue(tag="holder")
        returned, order, errors = _replacers(key, "replace")
        assert errors == []
        (active,) = _active(key)
        assert returned == [active.pk] * ENQUEUERS
        if held:
            assert active.pk == holder.pk
        # No lost update: the job holds the arguments of the enqueuer that took the row last.
        assert active.kwargs == {"tag": str(order[-1])}, (round_number, order, active.kwargs)
        assert Order.objects.filter(label__startswith=f"{key}:").count() == ENQUEUERS


@pytest.mark.django_db(transaction=True)
def test_concurrent_reschedulers_of_one_key_end_with_one_job():
    for round_number in range(ROUNDS):
        key = f"resched-race:{round_number}"
        returned, order, errors = _replacers(key, "reschedule")
        assert errors == []
        (active,) = _active(key)
        assert returned == [active.pk] * ENQUEUERS
        # Only the first enqueuer's arguments are ever stored: the others move the due time.
        assert active.kwargs == {"tag": str(order[0])}


@pytest.mark.django_db(transaction=True)
def test_replacers_racing_a_finishing_holder_end_with_one_waiting_job_and_no_error():
    """The key's running holder completes while replacers enqueue: those that saw it running get
    it back unchanged, the others share at most one new job; nobody sees an error."""
    store = Store("default")
    for round_number in range(ROUNDS):
        key, queue = f"finishing:{round_number}", f"finishing{round_number}"
        jobs.effect.using(unique=key, queue=queue).enqueue(tag="holder")
        (holder,) = store.claim(queue, 1, now_ms(), "w")

        def complete(lease: tuple[int, int] = (holder.id, holder.claim_token)) -> None:
            with transaction.atomic():
                store.dialect.complete([lease])
                time.sleep(random.uniform(0, 0.02))  # the enqueuers start while the delete is not yet committed

        returned, _, errors = _replacers(key, "replace", before=complete)
        assert errors == []
        # Those that came after the delete made one new job; the others got the running holder.
        active = _active(key)
        assert set(returned) - {holder.id} == {job.pk for job in active}
        assert len(active) <= 1
        for job in active:
            assert job.status == Status.WAITING and job.kwargs in [{"tag": str(index)} for index in range(ENQUEUERS)]
        assert Order.objects.filter(label__startswith=f"{key}:").count() == ENQUEUERS


def _lock_waits_here() -> int:
    """Transactions of this test's database waiting for a row lock (MariaDB)."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM information_schema.innodb_trx t"
            " JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id"
            " WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE()"
        )
        return cursor.fetchone()[0]


@pytest.mark.skipif(db_vendor() != "mysql", reason="InnoDB's shared lock of a failed insert")
@pytest.mark.django_db(transaction=True)
def test_a_replacer_never_waits_for_the_worker_deleting_the_holder_it_failed_to_insert_over():
    """Order made certain: the enqueue's insert fails on the running holder's key (its shared lock
    on the key is kept to the caller's commit), then a worker's completion starts deleting the
    holder and waits for that lock. Locking the holder now would deadlock, and InnoDB would roll
    back the caller's transaction or the worker's."""
    store = Store("default")
    jobs.effect.using(unique="deleting", queue="deleting").enqueue(tag="holder")
    (holder,) = store.claim("deleting", 1, now_ms(), "w")
    completion_errors: list[str] = []
    worker: list[threading.Thread] = []

    def complete() -> None:
        try:
            with transaction.atomic():
                store.dialect.complete([(holder.id, holder.claim_token)])
        except Exception as error:  # noqa: BLE001 - reported by the test
            completion_errors.append(f"{type(error).__name__}: {error}")
        finally:
            connections.close_all()

    def then_the_worker_deletes(execute, sql, params, many, context):
        try:
            return execute(sql, params, many, context)
        except IntegrityError:
            if sql.startswith("INSERT INTO durq_job") and not worker:
                worker.append(in_thread(complete))
                # InnoDB refreshes what information_schema shows of locks only after 0.1 s unread.
                wait_until(lambda: _lock_waits_here() == 1, 10, "the worker's DELETE to wait for the enqueue's lock", 0.2)
            raise

    with connections["default"].execute_wrapper(then_the_worker_deletes), transaction.atomic():
        Order.objects.create(label="deleting")
        job = jobs.effect.using(unique="deleting", queue="deleting", on_duplicate="replace").enqueue(tag="new")
    worker[0].join()
    assert (job.pk, job.status, job.deduplicated, job.replaced) == (holder.id, Status.RUNNING, True, False)
    assert completion_errors == []
    assert not Job.objects.filter(pk=holder.id).exists() and Order.objects.filter(label="deleting").exists()


def _claim_race(round_number: int) -> tuple[list[str], list[str], str]:
    """A claimer and ``ENQUEUERS`` replacers start at once on one key; (arguments claimed, errors, key)."""
    key, queue = f"claimed:{round_number}", f"claimrace{round_number}"
    store = Store("default")
    barrier = threading.Barrier(ENQUEUERS + 1)
    claimed: list[str] = []
    errors: list[str] = []

    def claimer() -> None:
        barrier.wait()
        deadline = time.monotonic() + 5
        while not claimed and time.monotonic() < deadline:
            claimed.extend(job.arguments for job in store.claim(queue, 1, now_ms() + MINUTE_MS, "claimer"))

    def replacer(index: int) -> Callable[[], None]:
        def enqueue() -> None:
            barrier.wait()
            time.sleep(random.uniform(0, 0.01))
            try:
                jobs.effect.using(unique=key, queue=queue, run_in=1, on_duplicate="replace").enqueue(tag=f"{index}-{index}")
            except Exception as error:  # noqa: BLE001 - reported by the test
                errors.append(f"{type(error).__name__}: {error}")

        return enqueue

    for thread in [in_thread(claimer)] + [in_thread(replacer(index)) for index in range(ENQUEUERS)]:
        thread.join()
    return claimed, errors, key


@pytest.mark.django_db(transaction=True)
def test_a_job_replaced_while_workers_claim_it_is_claimed_with_whole_arguments_and_never_changed_after():
    """Each claim gets one enqueue's arguments whole, and a running job keeps the arguments it was claimed with."""
    sent = [{"args": [], "kwargs": {"tag": f"{index}-{index}"}} for index in range(ENQUEUERS)]
    for round_number in range(ROUNDS):
        claimed, errors, key = _claim_race(round_number)
        assert errors == []
        assert len(claimed) == 1 and json.loads(claimed[0]) in sent, claimed
        (active,) = _active(key)
        assert active.status == Status.RUNNING and active.arguments == claimed[0]


# --- the debounce, end to end with a real worker ------------------------------------------------


def test_debounce_runs_once_after_the_last_edit_with_its_arguments(spawn_worker):
    worker = spawn_worker("--queue", "default:2")
    wait_until(lambda: WorkerProcess.objects.exists(), 30, "the worker to register")
    reindex = jobs.stamp.using(unique="reindex:42", run_in=1.5, on_duplicate="replace")
    ids = set()
    for edit in range(5):
        last_edit_ms = now_ms()
        ids.add(reindex.enqueue(tag=f"edit-{edit}").pk)
        time.sleep(0.3)  # each edit lands well before the previous one's job is due
    (job_id,) = ids
    wait_until(lambda: Effect.objects.filter(job_id=job_id).exists(), 20, "the debounced job")
    time.sleep(2)  # nothing else runs afterwards
    (effect,) = Effect.objects.all()
    assert effect.tag == "edit-4"
    assert effect.started_ms >= last_edit_ms + 1500  # due 1.5 s after the last edit
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


def test_an_idle_worker_wakes_when_a_replace_moves_the_due_time_earlier(spawn_worker):
    # The poll interval is 60 s: a run well inside it proves the wake-up on commit.
    worker = spawn_worker("--queue", "default:1", env={"DURQ_TEST_POLL": "60"})
    wait_until(lambda: WorkerProcess.objects.exists(), 30, "the worker to register")
    jobs.stamp.using(unique="soon", run_in=300).enqueue(tag="later")
    time.sleep(1)  # the worker sees a job due in five minutes and goes idle
    jobs.stamp.using(unique="soon", on_duplicate="replace").enqueue(tag="now")
    wait_until(lambda: Effect.objects.filter(tag="now").exists(), 10, "the woken worker")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
