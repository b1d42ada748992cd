"""What a user moving from Django's ImmediateBackend or a database backend expects of DurqBackend.

One attempt unless asked for more, results that read back exactly as ``enqueue()`` returned
them, one ``task_enqueued`` per enqueue, ids that never name another task, the one-line
``TASKS`` setting, and argument errors that name the bad value.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from asgiref.sync import async_to_sync
from django.core import checks
from django.db import transaction

from django_durq import InvalidPayload
from django_durq.conf import get_settings
from django_durq.models import Job
from django_durq.testing import drain
from tests.conftest import ROOT, run_command
from tests.ledger import tasks
from tests.tasks.helpers import FRAMEWORK, TaskResultDoesNotExist, TaskResultStatus, default_task_backend, row, task_enqueued

pytestmark = pytest.mark.django_db

READY, FAILED = TaskResultStatus.READY, TaskResultStatus.FAILED
FIELDS = ("task", "args", "kwargs", "backend")
TASK_FIELDS = ("queue_name", "priority", "run_after", "backend", "func", "takes_context")
ONE_LINE = {"default": {"BACKEND": "django_durq.tasks.backend.DurqBackend"}}


def same_result(read, enqueued):
    """Field by field, what get_result() read equals what enqueue() returned."""
    for name in ("id", "status", "args", "kwargs", "backend", "enqueued_at", "errors", "worker_ids"):
        assert getattr(read, name) == getattr(enqueued, name), name
    for name in TASK_FIELDS:
        assert getattr(read.task, name) == getattr(enqueued.task, name), f"task.{name}"
    assert read.task == enqueued.task and read == enqueued


# --- one attempt unless asked ---------------------------------------------------------------------


def test_a_task_that_raises_fails_after_one_attempt(clock, keep_results):
    result = tasks.flaky.enqueue(succeed_on=2)
    assert drain(clock=clock) == {"dead": 1}
    result.refresh()
    assert (result.status, result.attempts, len(result.errors)) == (FAILED, 1, 1)
    assert result.errors[0].exception_class is RuntimeError


def test_retries_are_asked_for_per_task(clock, keep_results):
    result = tasks.flaky.using(max_attempts=3).enqueue(succeed_on=2)
    assert drain(clock=clock) == {"retrying": 1}
    result.refresh()
    assert (result.status, result.attempts) == (READY, 1)
    assert row(tasks.fail.enqueue()).max_attempts == 2  # durq_options(max_attempts=2)


def test_retries_are_asked_for_per_backend(clock, keep_results, settings):
    settings.TASKS = {"default": {**settings.TASKS["default"], "OPTIONS": {"MAX_ATTEMPTS": 3}}}
    result = tasks.flaky.enqueue(succeed_on=2)
    assert row(result).max_attempts == 3
    assert row(tasks.flaky.using(max_attempts=1).enqueue()).max_attempts == 1  # the task's own wins
    assert drain(clock=clock)["retrying"] == 1


def test_a_job_keeps_durq_retries(clock):
    from tests.ledger import jobs

    assert jobs.noop.enqueue().max_attempts == get_settings().max_attempts > 1


def test_a_max_attempts_option_passes_the_check(keep_results, settings):
    settings.TASKS = {"default": {**settings.TASKS["default"], "OPTIONS": {"MAX_ATTEMPTS": 3}}}
    assert [message.id for message in default_task_backend.check()] == []


@pytest.mark.parametrize("value", [0, -1, True, "3", 2.5])
def test_a_bad_max_attempts_option_is_a_check_error(keep_results, settings, value):
    settings.TASKS = {"default": {**settings.TASKS["default"], "OPTIONS": {"MAX_ATTEMPTS": value}}}
    errors = [message for message in default_task_backend.check() if message.level >= checks.ERROR]
    assert [error.id for error in errors] == ["durq.E103"] and "MAX_ATTEMPTS" in errors[0].msg


# --- a result reads back as it was enqueued --------------------------------------------------------


@pytest.mark.parametrize("zone", [UTC, ZoneInfo("Europe/Paris")])
def test_run_after_round_trips_to_the_microsecond(clock, zone):
    when = datetime(2027, 3, 4, 5, 6, 24, 123456, tzinfo=zone)
    result = tasks.add.using(run_after=when).enqueue(1, 2)
    read = default_task_backend.get_result(result.id)
    assert read.task.run_after == when == result.task.run_after
    same_result(read, result)
    same_result(async_to_sync(default_task_backend.aget_result)(result.id), result)
    result.refresh()
    assert result.task.run_after == when


def test_a_naive_run_after_round_trips_without_time_zones(clock, settings):
    settings.USE_TZ = False
    when = datetime(2027, 3, 4, 5, 6, 24, 123456)
    result = tasks.add.using(run_after=when).enqueue(1, 2)
    read = default_task_backend.get_result(result.id)
    assert read.task.run_after == when and read.enqueued_at.tzinfo is None
    same_result(read, result)


def test_a_run_after_in_the_past_reads_back_as_given(clock):
    when = datetime(2020, 1, 2, 3, 4, 5, 999999, tzinfo=UTC)
    result = tasks.add.using(run_after=when).enqueue(1, 2)
    assert default_task_backend.get_result(result.id).task.run_after == when


def test_durq_options_given_at_enqueue_read_back(clock):
    result = tasks.add.using(max_attempts=3, unique="sum:1:2").enqueue(1, 2)
    same_result(default_task_backend.get_result(result.id), result)
    result = tasks.fail.using(max_attempts=1).enqueue()  # below its durq_options(max_attempts=2)
    same_result(default_task_backend.get_result(result.id), result)


def test_a_task_enqueued_without_run_after_reads_back_without_one(clock):
    result = tasks.add.using(priority=5, queue_name="fast").enqueue(1, b=2)
    read = default_task_backend.get_result(result.id)
    assert read.task.run_after is None
    same_result(read, result)


# --- signals, ids, transactions ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_one_committed_enqueue_sends_task_enqueued_once():
    sent = []

    def receive(sender, task_result, **kwargs):
        sent.append(task_result.id)

    task_enqueued.connect(receive)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            lost = tasks.add.enqueue(1, 1)
            raise RuntimeError("roll back")
        with transaction.atomic():
            result = tasks.add.enqueue(2, 2)
        plain = tasks.add.enqueue(3, 3)
    finally:
        task_enqueued.disconnect(receive)
    # Sent as enqueue() returns, as Django's backends send it: the rolled-back one too, under its own id.
    assert sent == [lost.id, result.id, plain.id] and len(set(sent)) == 3


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_result_id_never_names_another_task():
    with pytest.raises(RuntimeError), transaction.atomic():
        lost = tasks.add.enqueue(1, 1)
        raise RuntimeError("roll back")
    other = tasks.echo.enqueue("someone else")
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(lost.id)
    assert default_task_backend.get_result(other.id).args == ["someone else"]


def test_a_result_id_must_match_its_row(clock):
    result = tasks.add.enqueue(1, 1)
    job_id = str(row(result).pk)
    for forged in (job_id, f"{job_id}-0", f"{job_id}-1-2", f"{job_id}-x", f"{job_id}.{job_id}"):
        if forged != result.id:
            with pytest.raises(TaskResultDoesNotExist):
                default_task_backend.get_result(forged)


# --- the one-line setting ---------------------------------------------------------------------------


def unset_keep_finished(settings):
    settings.DURQ = {key: value for key, value in settings.DURQ.items() if key != "KEEP_FINISHED"}


def test_the_one_line_setting_passes_the_checks(settings):
    unset_keep_finished(settings)
    settings.TASKS = ONE_LINE
    assert [message.id for message in default_task_backend.check() if message.level >= checks.ERROR] == []
    assert get_settings().keep_finished_ms == 24 * 3600 * 1000


def test_manage_py_check_passes_with_the_one_line_setting(tmp_path):
    # A new site: durq installed, the one line, nothing else.
    (tmp_path / "one_line_settings.py").write_text(
        'SECRET_KEY = "one-line"\n'
        'INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_durq"]\n'
        f'DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": "{tmp_path / "site.sqlite3"}"}}}}\n'
        'TASKS = {"default": {"BACKEND": "django_durq.tasks.backend.DurqBackend"}}\n'
        + ('INSTALLED_APPS.append("django_tasks")\n' if FRAMEWORK == "django_tasks" else "")
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "one_line_settings", "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = run_command("check", env=env)
    assert done.returncode == 0 and "durq.E101" not in done.stdout + done.stderr, done.stderr


def test_the_one_line_setting_keeps_results(clock, settings):
    unset_keep_finished(settings)
    settings.TASKS = ONE_LINE
    result = tasks.add.enqueue(2, 3)
    assert drain(clock=clock) == {"finished": 1}
    result.refresh()
    assert result.return_value == 5


def test_an_explicit_keep_finished_of_zero_is_still_an_error(settings):
    settings.TASKS = ONE_LINE
    settings.DURQ = {**settings.DURQ, "KEEP_FINISHED": 0}
    assert "durq.E101" in [message.id for message in default_task_backend.check()]


def test_without_a_tasks_backend_finished_jobs_are_kept_an_hour(settings):
    unset_keep_finished(settings)
    settings.TASKS = {"default": {"BACKEND": f"{FRAMEWORK}.backends.dummy.DummyBackend"}}
    assert get_settings().keep_finished_ms == 3_600_000  # the history default, not the day results are read for


# --- arguments ---------------------------------------------------------------------------------------


def test_arguments_that_are_not_json_name_the_bad_value(clock):
    with pytest.raises(InvalidPayload, match=r"args\[1\]\['when'\] is of type datetime.datetime") as raised:
        tasks.echo.enqueue(1, {"when": datetime.now(UTC)})
    assert isinstance(raised.value, TypeError) and raised.value.path == "args[1]['when']"
    with pytest.raises(InvalidPayload, match=r"kwargs\['key'\]\[0\] is of type object"):
        tasks.echo.enqueue(key=[object()])
    assert not Job.objects.exists()


def test_arguments_that_are_not_json_keep_djangos_words_beside_the_path(clock):
    """Code and tests written against Django's own backends match on Django's message."""
    with pytest.raises(TypeError, match=re.escape("Unsupported type: <class 'datetime.datetime'>")) as raised:
        tasks.echo.enqueue(1, {"when": datetime.now(UTC)})
    assert "args[1]['when'] is of type datetime.datetime, which is not JSON" in str(raised.value)
    with pytest.raises(ValueError, match=re.escape("Unsupported value: <class 'bytes'>")) as undecodable:
        tasks.echo.enqueue(key=b"\xff")
    assert isinstance(undecodable.value, InvalidPayload) and undecodable.value.path == "kwargs['key']"
    assert "kwargs['key'] is bytes that are not UTF-8 text" in str(undecodable.value)
    assert not Job.objects.exists()


def test_durations_are_not_arguments_of_tasks(clock):
    with pytest.raises(InvalidPayload, match="timedelta"):
        tasks.echo.enqueue(timedelta(seconds=1))
