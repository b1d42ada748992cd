"""DurqBackend against Django's documented contract for task backends, on every database.

In-process tests run due tasks with ``drain()`` and a manual clock; the last test runs them on a
real ``durq_worker`` process. Skipped when no tasks framework is installed (Django 5.2 without
the django-tasks backport).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction

from django_durq import InvalidPayload, job
from django_durq.clock import ms_to_datetime
from django_durq.handlers.registry import registry
from django_durq.models import Job
from django_durq.tasks.backend import DurqBackend, DurqTask, TaskCancelled, durq_options
from django_durq.testing import drain
from tests.conftest import ROOT, wait_until
from tests.ledger import jobs, tasks
from tests.ledger.models import Effect, Order
from tests.tasks.helpers import (
    FRAMEWORK,
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    default_task_backend,
    job_id,
    row,
    task,
    task_enqueued,
    task_finished,
    task_started,
)

pytestmark = pytest.mark.django_db

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


@pytest.fixture
def signal_log():
    """(signal, sender, status, status stored at that moment, task_result) per signal sent."""
    log = []

    def recorder(name):
        def receive(sender, task_result, **kwargs):
            try:
                stored = default_task_backend.get_result(task_result.id).status
            except TaskResultDoesNotExist:
                stored = None
            log.append((name, sender, task_result.status, stored, task_result))

        return receive

    connected = [
        (sig, recorder(name))
        for name, sig in (("enqueued", task_enqueued), ("started", task_started), ("finished", task_finished))
    ]
    for sig, receive in connected:
        sig.connect(receive)
    yield log
    for sig, receive in connected:
        sig.disconnect(receive)


def at(ms):
    return ms_to_datetime(ms)


# Module-level functions (a task must be one) for the validation tests.
def plain():
    return 1


def clash():
    return 2


def test_building_the_backend_loads_no_model():
    # Django builds the backend when a module defines a task, possibly before apps are ready (here
    # django.setup() never runs, so importing any model would raise AppRegistryNotReady).
    code = (
        "import sys; from django.conf import settings; settings.TASKS; "
        f"from {FRAMEWORK} import task_backends; backend = task_backends['default']; "
        "assert type(backend).__name__ == 'DurqBackend', backend; "
        "assert 'django_durq.models' not in sys.modules"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=60)


# --- enqueue and the READY result -------------------------------------------------------------


def test_enqueue_returns_a_ready_result_backed_by_a_durq_job(clock):
    result = tasks.add.enqueue(2, 3)
    assert result.id == f"{row(result).pk}-{row(result).result_key}" and result.task is tasks.add and result.backend == "default"
    assert (result.status, result.args, result.kwargs, result.errors, result.worker_ids) == (READY, [2, 3], {}, [], [])
    assert result.enqueued_at == at(clock.now_ms())
    assert result.started_at is result.last_attempted_at is result.finished_at is None
    assert not result.is_finished and result.attempts == 0
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value

    job_row = row(result)
    assert (job_row.name, job_row.queue, job_row.priority, job_row.status) == ("tests.ledger.tasks.add", "default", 0, "waiting")
    assert (job_row.args, job_row.kwargs) == ([2, 3], {})

    fetched = default_task_backend.get_result(result.id)
    assert (fetched.id, fetched.status, fetched.args, fetched.enqueued_at) == (result.id, READY, [2, 3], result.enqueued_at)
    assert fetched.task.func is tasks.add.func
    assert tasks.add.get_result(result.id).id == result.id


def test_arguments_are_normalised_as_django_does(clock, keep_results):
    result = tasks.echo.enqueue((1, 2), b"x", key=(3,))
    assert (result.args, result.kwargs) == ([[1, 2], "x"], {"key": [3]})
    drain(clock=clock)
    result.refresh()
    assert result.return_value == {"args": [[1, 2], "x"], "kwargs": {"key": [3]}}


def test_aenqueue_and_aget_result(clock):
    result = async_to_sync(tasks.add.aenqueue)(1, 2)
    assert result.status == READY and row(result).args == [1, 2]
    fetched = async_to_sync(tasks.add.aget_result)(result.id)
    assert fetched.id == result.id and fetched.status == READY


def test_arguments_that_are_not_json_are_refused_before_anything_is_stored(clock):
    with pytest.raises(TypeError):
        tasks.add.enqueue(object(), 1)
    with pytest.raises(InvalidPayload):
        tasks.add.enqueue(float("nan"), 1)
    assert not Job.objects.exists()


# --- every status -------------------------------------------------------------------------------


def test_successful_task_reports_its_return_value(clock, keep_results):
    result = tasks.add.enqueue(2, 3)
    clock.advance(1500)
    assert drain(clock=clock) == {"finished": 1}
    result.refresh()
    assert (result.status, result.return_value, result.errors) == (SUCCESSFUL, 5, [])
    assert result.started_at == result.last_attempted_at == result.finished_at == at(clock.now_ms())
    assert result.enqueued_at == at(clock.now_ms() - 1500)
    assert len(result.worker_ids) == 1 and result.worker_ids[0].startswith("drain:")
    assert result.is_finished and result.attempts == 1


def test_failed_task_is_ready_between_attempts_then_failed_with_every_error(clock, keep_results):
    result = tasks.fail.enqueue("nope")
    assert row(result).max_attempts == 2  # durq_options(max_attempts=2)
    assert drain(clock=clock) == {"retrying": 1}
    result.refresh()
    assert (result.status, len(result.errors), result.attempts, result.finished_at) == (READY, 1, 1, None)
    assert result.last_attempted_at == at(clock.now_ms())

    clock.advance(timedelta(minutes=2))
    assert drain(clock=clock) == {"dead": 1}
    result.refresh()
    assert result.status == FAILED and result.finished_at == at(clock.now_ms())
    assert len(result.errors) == 2 and len(result.worker_ids) == 2
    for error in result.errors:
        assert error.exception_class_path == "builtins.ValueError" and error.exception_class is ValueError
        assert "ValueError: nope" in error.traceback and "tests/ledger/tasks.py" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


def test_a_retried_task_that_succeeds_keeps_the_error_of_its_failed_attempt(clock, keep_results):
    result = tasks.flaky.using(max_attempts=2).enqueue(succeed_on=2)
    drain(clock=clock)
    clock.advance(timedelta(minutes=2))
    drain(clock=clock)
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (SUCCESSFUL, 2, 2)
    assert [error.exception_class for error in result.errors] == [RuntimeError]


def test_a_return_value_that_is_not_json_fails_the_task(clock, keep_results):
    result = tasks.returns_a_set.enqueue()
    assert drain(clock=clock) == {"dead": 1}
    result.refresh()
    assert result.status == FAILED and result.errors[0].exception_class is TypeError


def test_dead_and_cancelled_jobs_are_failed_tasks(clock):
    dead, cancelled = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
    Job.objects.filter(pk=job_id(dead)).update(status="dead", finished_ms=clock.now_ms())
    Job.objects.filter(pk=job_id(cancelled)).update(status="cancelled", finished_ms=clock.now_ms())
    assert default_task_backend.get_result(dead.id).status == FAILED
    cancelled_result = default_task_backend.get_result(cancelled.id)
    assert cancelled_result.status == FAILED and cancelled_result.finished_at == at(clock.now_ms())
    assert [error.exception_class for error in cancelled_result.errors] == [TaskCancelled]


def test_a_successful_result_is_gone_when_finished_jobs_are_not_kept(clock, signal_log):
    result = tasks.add.enqueue(2, 3)
    assert drain(clock=clock) == {"finished": 1}
    finished = [entry for entry in signal_log if entry[0] == "finished"]
    assert finished[0][2] == SUCCESSFUL and finished[0][4].return_value == 5  # the signal still says so
    with pytest.raises(TaskResultDoesNotExist):
        result.refresh()


# --- run_after, priority, queues, durq options --------------------------------------------------


def test_run_after_defers_the_task(clock, keep_results):
    when = at(clock.now_ms() + 60_000)
    result = tasks.add.using(run_after=when).enqueue(1, 1)
    assert result.task.run_after == when and row(result).run_at_ms == clock.now_ms() + 60_000
    assert drain(clock=clock) == {}
    fetched = default_task_backend.get_result(result.id)
    assert fetched.status == READY and fetched.task.run_after == when
    clock.advance(60_000)
    assert drain(clock=clock) == {"finished": 1}


def test_higher_priority_runs_first(clock):
    low = tasks.record.using(priority=-5).enqueue("low")
    tasks.record.using(priority=50).enqueue("high")
    tasks.record.enqueue("mid")
    assert row(low).priority == -5 and default_task_backend.get_result(low.id).task.priority == -5
    drain(clock=clock)
    assert list(Effect.objects.order_by("id").values_list("tag", flat=True)) == ["high", "mid", "low"]


def test_queue_name_is_the_durq_queue(clock):
    result = tasks.record.using(queue_name="fast").enqueue("f")
    assert row(result).queue == "fast"
    assert default_task_backend.get_result(result.id).task.queue_name == "fast"


def test_durq_options_reach_the_job(clock):
    result = tasks.add.using(max_attempts=7, lease=60, timeout=30).enqueue(1, 2)
    assert isinstance(result.task, DurqTask)
    job_row = row(result)
    assert (job_row.max_attempts, job_row.lease_ms, job_row.timeout_ms) == (7, 60_000, 30_000)


@pytest.mark.skipif(tasks.one_shot is None, reason="@task passes no extra keyword arguments before Django 6.1")
def test_task_keyword_arguments_set_durq_options(clock):
    assert row(tasks.one_shot.enqueue()).max_attempts == 1


def test_a_dedupe_key_returns_the_task_already_queued(clock, signal_log):
    first = tasks.add.using(unique="sum").enqueue(1, 2)
    second = tasks.add.using(unique="sum").enqueue(3, 4)
    assert second.id == first.id and second.args == [1, 2]
    assert Job.objects.count() == 1 and [entry[0] for entry in signal_log] == ["enqueued"]


# --- context, async, signals ------------------------------------------------------------------


def test_context_is_djangos_with_durq_controls(clock, keep_results):
    result = tasks.inspect_context.using(max_attempts=2).enqueue()
    drain(clock=clock)
    result.refresh()
    seen = result.return_value
    assert seen["context"] == "DurqTaskContext" and seen["id"] == result.id and seen["attempt"] == 1
    assert seen["status"] == seen["stored_status"] == RUNNING and seen["worker_ids"] == result.worker_ids
    assert (seen["heartbeat"], seen["should_stop"], seen["is_last_attempt"], seen["progress"]) == (True, False, False, True)
    assert (row(result).progress_done, row(result).progress_total) == (1, 2)

    last = tasks.inspect_context.enqueue()  # one attempt, as every task without max_attempts
    drain(clock=clock)
    last.refresh()
    assert last.return_value["is_last_attempt"] is True


def test_async_tasks_run(clock, keep_results):
    plain_async = tasks.async_add.enqueue(4, 5)
    with_context = tasks.async_context.enqueue("v")
    assert drain(clock=clock) == {"finished": 2}
    plain_async.refresh()
    with_context.refresh()
    assert plain_async.return_value == 9
    assert with_context.return_value == {"heartbeat": True, "attempt": 1, "value": "v"}


def test_signals_follow_the_stored_state(clock, keep_results, signal_log):
    result = tasks.add.enqueue(2, 3)
    drain(clock=clock)
    assert [(name, status, stored) for name, _, status, stored, _ in signal_log] == [
        ("enqueued", READY, READY),
        ("started", RUNNING, RUNNING),
        ("finished", SUCCESSFUL, SUCCESSFUL),
    ]
    assert all(sender is DurqBackend for _, sender, _, _, _ in signal_log)
    assert signal_log[-1][4].id == result.id and signal_log[-1][4].return_value == 5

    signal_log.clear()
    failing = tasks.fail.enqueue()
    drain(clock=clock)  # attempt 1 fails and will be retried: not finished
    clock.advance(timedelta(minutes=2))
    drain(clock=clock)
    assert [(name, status, stored) for name, _, status, stored, _ in signal_log] == [
        ("enqueued", READY, READY),
        ("started", RUNNING, RUNNING),
        ("started", RUNNING, RUNNING),
        ("finished", FAILED, FAILED),
    ]
    assert signal_log[2][4].attempts == 2 and len(signal_log[2][4].errors) == 1
    assert signal_log[-1][4].id == failing.id and len(signal_log[-1][4].errors) == 2


def test_a_failing_task_finished_receiver_is_logged_and_changes_nothing(clock, keep_results, caplog):
    def broken(sender, task_result, **kwargs):
        raise RuntimeError("receiver bug")

    task_finished.connect(broken)
    try:
        result = tasks.add.enqueue(2, 3)
        assert drain(clock=clock) == {"finished": 1}
    finally:
        task_finished.disconnect(broken)
    result.refresh()
    assert (result.status, result.return_value) == (SUCCESSFUL, 5)
    assert "task_finished receiver" in caplog.text and "receiver bug" in caplog.text


def test_a_failing_task_started_receiver_fails_the_attempt(clock, keep_results):
    def broken(sender, task_result, **kwargs):
        raise RuntimeError("receiver bug")

    task_started.connect(broken)
    try:
        result = tasks.add.using(max_attempts=1).enqueue(2, 3)
        assert drain(clock=clock) == {"dead": 1}
    finally:
        task_started.disconnect(broken)
    result.refresh()
    assert result.status == FAILED and "receiver bug" in result.errors[0].traceback


# --- what is refused --------------------------------------------------------------------------


def test_invalid_tasks_are_rejected(clock, settings):
    def nested():
        return None

    with pytest.raises(InvalidTask, match="module level"):
        task(nested)
    with pytest.raises(InvalidTask, match="context"):
        task(takes_context=True)(plain)
    with pytest.raises(InvalidTask, match="priority"):
        tasks.add.using(priority=101)
    with pytest.raises(InvalidTask, match="Queue"):
        tasks.add.using(queue_name="nowhere")
    with pytest.raises(InvalidTask, match="aware"):
        tasks.add.using(run_after=datetime(2030, 1, 1))
    for options, message in [
        ({"max_attempts": 0}, "max_attempts"),
        ({"unique": ""}, "unique"),
        ({"timeout": -1}, "timeout"),
        ({"lease": 1}, "heartbeat"),
    ]:
        with pytest.raises(InvalidTask, match=message):
            durq_options(**options)(tasks.add)

    settings.TASKS = {**settings.TASKS, "other": {"BACKEND": f"{FRAMEWORK}.backends.immediate.ImmediateBackend"}}
    with pytest.raises(InvalidTask, match="DurqBackend"):
        durq_options(max_attempts=1)(task(backend="other")(plain))


def test_an_empty_queues_list_accepts_any_durq_queue_name(clock, settings):
    settings.TASKS = {"default": {"BACKEND": "django_durq.tasks.backend.DurqBackend", "QUEUES": []}}
    assert row(tasks.add.using(queue_name="anything").enqueue(1, 1)).queue == "anything"
    with pytest.raises(InvalidTask, match="durq queue name"):
        tasks.add.using(queue_name="a:b")


def test_a_task_cannot_take_a_name_a_job_owns(clock):
    job(name="tests.tasks.test_backend.clash")(lambda ctx: 1)
    try:
        with pytest.raises(InvalidTask, match="already used"):
            task(clash)
    finally:
        registry.remove("tests.tasks.test_backend.clash")


@pytest.mark.parametrize("result_id", ["abc", "", "-1", "1.0", "99999999", "9" * 30, "\u0661"])
def test_unknown_result_ids(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(default_task_backend.aget_result)(result_id)


def test_a_plain_durq_job_is_not_a_task_result(clock):
    plain_job = jobs.noop.enqueue()
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(f"{plain_job.pk}-{plain_job.created_ms}")


def test_a_result_of_another_task_is_a_mismatch(clock):
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        tasks.echo.get_result(result.id)


# --- transactions -------------------------------------------------------------------------------


def test_enqueue_is_part_of_the_callers_transaction(clock):
    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(label="rolled back")
        lost = tasks.add.enqueue(1, 1)
        raise RuntimeError("roll back")
    assert not Order.objects.exists() and not Job.objects.exists()
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(lost.id)

    with transaction.atomic():
        Order.objects.create(label="kept")
        kept = tasks.add.enqueue(1, 1)
    assert Order.objects.count() == 1 and default_task_backend.get_result(kept.id).status == READY


# --- system checks ------------------------------------------------------------------------------


def ids(messages):
    return sorted(message.id for message in messages)


def test_check_requires_finished_jobs_to_be_kept(settings):
    assert "durq.E101" in ids(default_task_backend.check())
    settings.DURQ = {**settings.DURQ, "KEEP_FINISHED": 3600}
    assert ids(default_task_backend.check()) == []
    settings.DURQ = {
        **settings.DURQ,
        "KEEP_FINISHED": 0,
        "QUEUES": {"default": {"keep_finished": 60}, "fast": {}, "slow": {}},
    }
    (error,) = default_task_backend.check()
    assert error.id == "durq.E101" and "fast, slow" in error.msg


def test_check_reports_queues_no_worker_works_and_bad_options(settings):
    settings.DURQ = {**settings.DURQ, "KEEP_FINISHED": 3600}
    settings.TASKS = {
        "default": {
            "BACKEND": "django_durq.tasks.backend.DurqBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"MODULES": "tests.ledger.tasks", "BOGUS": 1},
        }
    }
    assert ids(default_task_backend.check()) == ["durq.E103", "durq.E103", "durq.W101"]


# --- a real worker process ------------------------------------------------------------------------


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_tasks_run_on_a_real_worker(spawn_worker, tmp_path):
    gate = tmp_path / "go"
    add = tasks.add.enqueue(2, 3)
    later = tasks.async_add.enqueue(20, 22)
    context = tasks.inspect_context.enqueue()
    fail = tasks.fail.using(max_attempts=1).enqueue("worker")
    once = tasks.flaky.enqueue(succeed_on=2)  # one attempt: no max_attempts, no backend MAX_ATTEMPTS
    waiting = tasks.wait_for_file.enqueue(str(gate))
    worker = spawn_worker(
        "--burst", "--queue", "default:4", env={"DURQ_TEST_KEEP_FINISHED": "3600", "DURQ_TEST_RECORD_TASK_SIGNALS": "1"}
    )

    def status_of(result):
        result.refresh()
        return result.status

    wait_until(lambda: worker.popen.poll() is not None or status_of(waiting) == RUNNING, 60, "the gated task to run")
    assert waiting.status == RUNNING, worker.output()
    assert waiting.started_at is not None and waiting.worker_ids[0].split(":")[1] == str(worker.pid)
    gate.touch()
    assert worker.wait(timeout=60) == 0, worker.output()

    for result in (add, later, context, fail, once, waiting):
        result.refresh()
    assert (add.status, add.return_value) == (SUCCESSFUL, 5)
    assert (later.status, later.return_value) == (SUCCESSFUL, 42)
    assert (waiting.status, waiting.return_value) == (SUCCESSFUL, "released")
    assert context.return_value["stored_status"] == RUNNING and context.return_value["worker_ids"] == context.worker_ids
    assert fail.status == FAILED and fail.errors[0].exception_class is ValueError
    assert "worker" in fail.errors[0].traceback
    assert (once.status, once.attempts, [error.exception_class for error in once.errors]) == (FAILED, 1, [RuntimeError])
    assert (add.attempts, add.errors) == (1, []) and add.worker_ids[0].split(":")[1] == str(worker.pid)
    assert default_task_backend.get_result(add.id).task.run_after is None
    assert Job.objects.get(pk=job_id(add)).name == "tests.ledger.tasks.add"  # an ordinary durq job in the admin

    signals_seen = {(effect.job_id, effect.tag) for effect in Effect.objects.all()}
    assert {effect.pid for effect in Effect.objects.all()} == {worker.pid}
    for result in (add, later, context, waiting):
        assert {(job_id(result), "started:RUNNING"), (job_id(result), "finished:SUCCESSFUL")} <= signals_seen
    assert {(job_id(fail), "started:RUNNING"), (job_id(fail), "finished:FAILED")} <= signals_seen


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_task_given_retries_is_retried_by_a_real_worker(spawn_worker):
    flaky = tasks.flaky.using(max_attempts=2).enqueue(succeed_on=2)
    failing = tasks.fail.enqueue("twice")  # durq_options(max_attempts=2)
    worker = spawn_worker("--queue", "default:2", env={"DURQ_TEST_KEEP_FINISHED": "3600"})

    def finished(result):
        result.refresh()
        return result.is_finished

    wait_until(lambda: worker.popen.poll() is not None or (finished(flaky) and finished(failing)), 60, "both tasks to finish")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, worker.output()

    assert (flaky.status, flaky.return_value, flaky.attempts) == (SUCCESSFUL, 2, 2)
    assert [error.exception_class for error in flaky.errors] == [RuntimeError]
    assert (failing.status, failing.attempts) == (FAILED, 2)
    assert [error.exception_class for error in failing.errors] == [ValueError, ValueError]
    assert all("ValueError: twice" in error.traceback for error in failing.errors)


def test_a_worker_refuses_a_task_name_it_never_registered(clock, keep_results):
    forged = tasks.add.enqueue(1, 1)
    Job.objects.filter(pk=job_id(forged)).update(name="os.system", max_attempts=1)
    assert drain(clock=clock) == {"unknown type": 1}  # handed back for a worker that has the handler
    clock.advance(3_600_000)
    assert drain(clock=clock) == {"dead": 1}  # none had, for an hour
    note, entry = Job.objects.get(pk=job_id(forged)).error_list
    assert (note["kind"], note["counted"], entry["kind"]) == ("unknown_job", False, "unknown_job")


def test_dates_are_aware_datetimes(clock):
    assert tasks.add.enqueue(1, 1).enqueued_at.tzinfo is UTC


def test_a_cron_schedule_can_name_a_task(clock, settings):
    from django_durq import schedules

    settings.DURQ = {
        **settings.DURQ,
        "KEEP_FINISHED": 3600,
        "SCHEDULES": {"sum": {"cron": "* * * * *", "job": "tests.ledger.tasks.add", "kwargs": {"a": 1, "b": 2}}},
    }
    schedules.tick(clock.now_ms())
    clock.advance(60_000)
    assert schedules.tick(clock.now_ms())["ran"] == 1
    (job_row,) = Job.objects.all()
    drain(clock=clock)
    assert tasks.add.get_result(f"{job_row.pk}-{job_row.created_ms}").return_value == 3


def test_a_task_queued_by_name_takes_its_declared_queue_priority_and_options(clock, settings):
    from django_durq import enqueue

    job_row = enqueue("tests.ledger.tasks.fast_add", 1, 2)
    assert (job_row.queue, job_row.priority, job_row.max_attempts) == ("fast", 7, 4)
    assert tasks.fast_add.get_result(f"{job_row.pk}-{job_row.created_ms}").status == READY
