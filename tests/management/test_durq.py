"""``manage.py durq``: the subcommands against the real database, and bad input as a user meets it."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_durq.clock import ManualClock, use_clock
from django_durq.models import Job, QueueStat, WorkerProcess
from tests.conftest import run_command
from tests.ops.test_ops import DAY, NOW, ended_worker, make_job

pytestmark = pytest.mark.django_db


def durq(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    with use_clock(ManualClock(NOW)):
        call_command("durq", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def refused(*args: str) -> CommandError:
    with pytest.raises(CommandError) as info:
        durq(*args)
    return info.value


def test_stats_table_and_json():
    make_job("waiting", run_at_ms=NOW - 90_000)
    make_job("dead", queue="fast")
    QueueStat.objects.create(queue="default", minute_ms=NOW - 600_000, finished=12, failed=2)
    out, _ = durq("stats")
    lines = out.splitlines()
    assert lines[0].split()[:7] == ["QUEUE", "STATE", "WAITING", "DELAYED", "BLOCKED", "RUNNING", "DEAD"]
    assert lines[1].split()[:10] == ["default", "active", "1", "0", "0", "0", "0", "1", "min", "30"]
    assert "0/12" in lines[1] and "0/2" in lines[1]
    data = {row["queue"]: row for row in json.loads(durq("stats", "--json")[0])}
    assert data["default"]["oldest_wait_ms"] == 90_000 and data["fast"]["dead"] == 1


def test_stats_warns_of_due_jobs_no_live_worker_serves():
    make_job("waiting", queue="video")
    out, err = durq("stats")
    assert "video" in out
    assert err.splitlines() == [
        "Warning: 1 due job in queue 'video', which no live worker serves: it waits until a worker runs that queue."
    ]
    make_job("waiting", queue="video")
    assert "2 due jobs in queue 'video'" in durq("stats", "--json")[1] and "they wait" in durq("stats")[1]


def test_failed_lists_dead_letters():
    old = make_job("dead", finished_ms=NOW - DAY, errors=json.dumps([{"type": "KeyError", "message": "'sku'\nmore"}]))
    new = make_job("dead", queue="fast", finished_ms=NOW)
    make_job("waiting")
    out, _ = durq("failed")
    assert [line.split()[0] for line in out.splitlines()] == ["ID", str(new.pk), str(old.pk)]
    assert "KeyError: 'sku' more" in out, "one line per job, whatever the message holds"
    assert [line.split()[0] for line in durq("failed", "--queue", "default")[0].splitlines()[1:]] == [str(old.pk)]
    data = json.loads(durq("failed", "--limit", "1", "--json")[0])
    assert [job["id"] for job in data] == [new.pk] and data[0]["errors"][0]["message"] == "boom"
    Job.objects.all().delete()
    assert durq("failed")[0] == "No dead letters.\n"


def test_retry_by_id_and_all_failed():
    first, second = make_job("dead"), make_job("dead", queue="fast")
    running = make_job("running")
    out, _ = durq("retry", str(first.pk))
    assert out == f"Retried 1 job ({first.pk}): due now.\n"
    assert Job.objects.get(pk=first.pk).status == "waiting"
    error = refused("retry", str(second.pk), str(running.pk))
    assert error.returncode == 1 and str(error) == "1 job not retried"
    assert Job.objects.get(pk=second.pk).status == "waiting"
    third = make_job("dead", queue="slow")
    fourth = make_job("dead", queue="fast")
    assert durq("retry", "--all-failed", "--queue", "slow")[0] == f"Retried 1 job ({third.pk}): due now.\n"
    assert durq("retry", "--all-failed")[0] == f"Retried 1 job ({fourth.pk}): due now.\n"
    assert durq("retry", "--all-failed")[0] == "No dead letters to retry.\n"


def test_retry_reports_what_it_left_alone():
    running = make_job("running")
    out = StringIO()
    err = StringIO()
    with pytest.raises(CommandError) as info:
        call_command("durq", "retry", str(running.pk), "424242", stdout=out, stderr=err)
    assert info.value.returncode == 1 and str(info.value) == "2 jobs not retried"
    assert err.getvalue().splitlines() == [
        f"Job {running.pk} not retried: is running, so it is not retried.",
        "Job 424242 not retried: no such job.",
    ]


def test_messages_count_in_words():
    dead = [make_job("dead") for _ in range(2)]
    ids = [str(job.pk) for job in dead]
    assert durq("retry", *ids)[0] == f"Retried 2 jobs ({', '.join(ids)}): due now.\n"
    waiting = [make_job("waiting") for _ in range(2)]
    assert durq("cancel", str(waiting[0].pk))[0] == f"Cancelled 1 waiting job ({waiting[0].pk}).\n"
    with pytest.raises(CommandError) as info:
        durq("cancel", str(waiting[0].pk), str(waiting[1].pk), "424242")
    assert str(info.value) == "2 jobs not cancelled", "one already cancelled, one unknown"


def test_purge_older_than_is_inclusive_and_has_a_dry_run():
    week = 7 * DAY
    gone = [make_job("dead", finished_ms=NOW - week), make_job("dead", finished_ms=NOW - week - 1)]
    kept = make_job("dead", finished_ms=NOW - week + 1)
    other = make_job("dead", queue="fast", finished_ms=NOW - 2 * week)
    out, _ = durq("purge", "--older-than", "7d", "--queue", "default", "--dry-run")
    assert out.startswith("Would purge 2 dead letters in queue 'default' that died at or before 2027-01-08 08:00:00 UTC")
    assert Job.objects.count() == 4
    assert durq("purge", "--older-than", "7d", "--queue", "default")[0].startswith("Purged 2 dead letters")
    assert not Job.objects.filter(pk__in=[job.pk for job in gone]).exists()
    assert durq("purge", "--older-than", "168h")[0].startswith("Purged 1 dead letter that")
    assert list(Job.objects.values_list("pk", flat=True)) == [kept.pk]
    assert other.pk not in Job.objects.values_list("pk", flat=True)


def test_cancel():
    waiting, running, done = make_job("waiting"), make_job("running"), make_job("finished")
    out, _ = durq("cancel", str(waiting.pk), str(running.pk))
    assert out.splitlines()[0] == f"Cancelled 1 waiting job ({waiting.pk})."
    assert out.splitlines()[1].startswith(f"Asked 1 running job ({running.pk}) to stop")
    assert Job.objects.get(pk=running.pk).stop_requested
    assert refused("cancel", str(done.pk)).returncode == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["retry", "abc"], "'abc' is not a job id"),
        (["retry"], "give job ids, or --all-failed"),
        (["retry", "1", "--all-failed"], "not both"),
        (["retry", "1", "--queue", "fast"], "--queue goes with --all-failed"),
        (["purge", "--older-than", "7x"], "'7x' is not a duration"),
        (["purge", "--older-than", "7"], "'7' is not a duration"),
        (["purge"], "required: --older-than"),
        (["failed", "--limit", "0"], "at least 1"),
        (["failed", "--queue", "a:b"], "not a queue name"),
        (["cancel"], "required: ID"),
        (["nope"], "invalid choice: 'nope'"),
        ([], "required"),
    ],
)
def test_bad_input_is_refused_with_status_2(args, message):
    error = refused(*args)
    assert error.returncode == 2 and message in str(error)


MALFORMED = ["²", "١٢٣", "-1", "0", "1e5", "1.5", "9" * 30, "", " ", "\x00", "1\x00", "' OR 1=1 --", "日本"]


def test_malformed_values_are_refused_with_status_2_never_a_traceback():
    for value in MALFORMED:
        for args in (
            ["retry", value],
            ["cancel", value],
            ["failed", "--limit", value],
            ["failed", "--queue", value],
            ["retry", "--all-failed", "--queue", value],
            ["purge", "--older-than", value],
            ["purge", "--older-than", "1d", "--queue", value],
        ):
            if args[-1] == value and args[-2] == "--queue" and value.strip("\x00") and "\x00" not in value:
                continue  # any other text is a queue name
            with pytest.raises(CommandError) as info:
                durq(*args)
            assert info.value.returncode == 2, (args, str(info.value))
    for duration in ("²d", "١٢d", "1\x00d", "-1d", "1e5s", "d", "99999999999999999999999999999999w"):
        with pytest.raises(CommandError) as info:
            durq("purge", "--older-than", duration)
        assert info.value.returncode == 2, duration


@pytest.mark.django_db(transaction=True)
def test_bad_input_from_the_shell_is_one_line_and_exit_2(worker_env):
    for args, message in ((["purge", "--older-than", "soon"], "'soon' is not a duration"), (["retry"], "give job ids")):
        result = run_command("durq", *args, env=worker_env)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], result.stderr
        assert result.stdout == ""


def test_show_gives_a_running_jobs_worker_and_lease_and_calls_an_orphan_so():
    WorkerProcess.objects.create(  # alive by its heartbeats
        worker_id="alive:1:1", host="h", pid=1, queues='{"default": 1}', started_ms=NOW, last_seen_ms=NOW
    )
    alive = make_job("running", claimed_by="alive:1:1", lease_expires_ms=NOW + 45_000)
    orphan = make_job("running", claimed_by=ended_worker("gone:3:cccccc"), lease_expires_ms=NOW + 30_000)
    out, _ = durq("show", str(alive.pk), str(orphan.pk))
    first, second = out.split("\n\n")
    assert first.splitlines()[0].endswith(": running") and "  worker    alive:1:1\n" in first
    assert "  lease     expires 2027-01-15 08:00:45 UTC (in 45 s)" in first
    assert second.splitlines()[0].endswith(": running (orphaned)")
    assert "  worker    gone:3:cccccc (ended: the job is orphaned" in second
    [shown] = json.loads(durq("show", str(orphan.pk), "--json")[0])
    assert (shown["worker"], shown["orphaned"], shown["lease_expires_at"][:19]) == ("gone:3:cccccc", True, "2027-01-15T08:00:30")


def test_stats_warns_of_jobs_handed_back_for_an_unknown_type():
    QueueStat.objects.create(queue="default", minute_ms=NOW - 600_000, finished=1, unknown_type=7)
    out, err = durq("stats", "--json")
    [row] = [row for row in json.loads(out) if row["queue"] == "default"]
    assert row["unknown_type_last_hour"] == 7
    assert "Warning: 7 job(s) of queue 'default' handed back in the last hour by a worker with no handler" in err
