"""Did my job run? Finished jobs are kept by default, and ``manage.py durq show|recent`` answer
when each job ran, how long it took, and how it ended."""

from __future__ import annotations

import json
import re

import pytest
from django.conf import settings

from django_durq.conf import DEFAULT_KEEP_FINISHED_MS, TASK_RESULTS_KEEP_MS, parse
from django_durq.db import dialect_for
from django_durq.db.store import Store
from django_durq.models import Job, Status
from tests.conftest import run_command
from tests.ledger import jobs

NOW = 1_800_000_000_000


def test_finished_jobs_are_kept_an_hour_by_default():
    assert DEFAULT_KEEP_FINISHED_MS == 3_600_000
    assert parse({}).keep_finished_ms == DEFAULT_KEEP_FINISHED_MS
    assert parse({}, results_read=True).keep_finished_ms == TASK_RESULTS_KEEP_MS  # results read back: a day
    assert parse({"KEEP_FINISHED": 0}).keep_finished_ms == 0  # turned off: deleted at once
    assert parse({"KEEP_FINISHED": 60}, results_read=True).keep_finished_ms == 60_000


@pytest.mark.django_db(transaction=True)
def test_one_statement_keeps_a_batch_and_skips_a_lease_no_longer_held():
    from django.db import connection

    jobs.noop.enqueue_many([{"n": n} for n in range(3)])
    store = Store(connection.alias)
    claimed = store.claim("default", 3, NOW, "w1")
    first, second, third = ((job.id, job.claim_token) for job in claimed)
    Job.objects.filter(pk=third[0]).update(claim_token=third[1] + 1)  # taken over: no longer this attempt's
    kept = [(first, NOW + 5, '{"ok": 1}'), (second, NOW + 7, None), (third, NOW + 9, '"late"')]
    assert dialect_for(connection).finish_many(kept) == {first, second}
    rows = {row.pk: row for row in Job.objects.all()}
    assert (rows[first[0]].status, rows[first[0]].finished_ms, rows[first[0]].result) == (Status.FINISHED, NOW + 5, '{"ok": 1}')
    assert (rows[second[0]].status, rows[second[0]].finished_ms, rows[second[0]].result) == (Status.FINISHED, NOW + 7, None)
    assert (rows[third[0]].status, rows[third[0]].result) == (Status.RUNNING, None)
    assert rows[first[0]].lease_expires_ms is None


@pytest.mark.processes
def test_a_worker_on_default_settings_leaves_a_trace_that_durq_show_and_recent_read(worker_env):
    env = {**worker_env, "DURQ_TEST_KEEP_FINISHED": "default"}
    ran = jobs.fail_until.enqueue(succeed_on=1)
    died = jobs.fail.using(max_attempts=1).enqueue(message="no such sku")
    burst = run_command("durq_worker", "--burst", "--queue", "default:2", env=env, timeout=60)
    assert burst.returncode == 0, burst.stderr

    assert {row.pk: row.status for row in Job.objects.all()} == {ran.pk: Status.FINISHED, died.pk: Status.DEAD}
    shown = run_command("durq", "show", str(ran.pk), str(died.pk), env=env)
    assert shown.returncode == 0, shown.stderr
    first, second = shown.stdout.split("\n\n")
    assert first.splitlines()[0] == f"Job {ran.pk} (tests.fail_until) in queue 'default': finished"
    assert "(attempt 1 of 5)" in first and re.search(r"\n  ended     .+, after [0-9]+\.[0-9]{3} s\n", first)
    assert 'result    {"attempt":1}' in first  # the JSON as stored
    assert second.splitlines()[0] == f"Job {died.pk} (tests.fail) in queue 'default': dead"
    assert "error     ValueError: no such sku" in second

    recent = json.loads(run_command("durq", "recent", "--json", env=env).stdout)
    newest_first = Job.objects.order_by("-finished_ms", "-id").values_list("id", "status")
    assert [(row["id"], row["status"]) for row in recent] == list(newest_first)
    by_id = {row["id"]: row for row in recent}
    assert by_id[ran.pk]["result"] == {"attempt": 1} and by_id[ran.pk]["took_s"] >= 0
    assert by_id[died.pk]["errors"][-1]["message"] == "no such sku"
    table = run_command("durq", "recent", env=env).stdout.splitlines()
    assert table[0].split()[:4] == ["ID", "NAME", "QUEUE", "STATUS"] and len(table) == 3

    gone = run_command("durq", "show", "999999", env=env)
    assert gone.returncode == 1
    assert "Job 999999: no such job: it never existed, or it ended and was removed" in gone.stderr
    window = "1 d" if getattr(settings, "TASKS", None) else "1 h"  # a day where a tasks backend reads results
    assert f"(finished jobs are kept for {window} (KEEP_FINISHED))" in gone.stderr
