"""Pausing and resuming a queue: ops, claims and the idle probe, stats and monitoring, the CLI, the admin, real workers."""

from __future__ import annotations

import io
import json
import os
import time

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client

from django_durq import ops
from django_durq.clock import now_ms
from django_durq.conf import get_settings
from django_durq.db.store import Store
from django_durq.models import Job, QueueControl, WorkerProcess
from django_durq.testing import drain
from tests.conftest import db_vendor, run_command, wait_until
from tests.ledger import jobs
from tests.ledger.models import Effect

pytestmark = pytest.mark.django_db

NOW = 1_800_000_000_000
POLL_S = 120  # a spawned worker's poll interval where a test proves a wake-up


def store() -> Store:
    return Store(get_settings().database)


def make_job(queue: str = "default", status: str = "waiting", **fields: object) -> Job:
    values: dict[str, object] = {
        "name": "tests.effect",
        "queue": queue,
        "status": status,
        "arguments": json.dumps({"args": [], "kwargs": {}}),
        "run_at_ms": NOW - 60_000,
        "created_ms": NOW - 60_000,
        "lease_ms": 30_000,
    }
    values.update(fields)
    return Job.objects.create(**values)


# --- ops ------------------------------------------------------------------------------------------


def test_pause_and_resume_say_whether_they_changed_anything():
    assert ops.paused_queues() == {}
    assert ops.pause("default", now_ms=NOW) is True
    assert ops.pause("default", now_ms=NOW + 5_000) is False, "already paused"
    assert ops.paused_queues() == {"default": NOW}, "a second pause keeps the first pause's time"
    assert ops.resume("default", now_ms=NOW + 9_000) is True
    assert ops.resume("default", now_ms=NOW + 9_500) is False, "not paused any more"
    assert ops.paused_queues() == {}
    assert ops.resume("never-paused") is False
    assert not QueueControl.objects.filter(queue="never-paused").exists(), "a resume of an unknown queue writes nothing"
    row = QueueControl.objects.get(queue="default")
    assert (row.paused, row.paused_ms, row.limited, row.updated_ms) == (False, None, False, NOW + 9_000)


def test_pause_and_resume_leave_the_limited_flag_alone():
    QueueControl.objects.create(queue="default", limited=True, updated_ms=NOW)
    assert ops.pause("default", now_ms=NOW + 1)
    assert QueueControl.objects.filter(queue="default", paused=True, paused_ms=NOW + 1, limited=True).exists()
    assert ops.resume("default", now_ms=NOW + 2)
    assert QueueControl.objects.filter(queue="default", paused=False, limited=True).exists()


@pytest.mark.parametrize(
    ("queue", "error"), [("", ValueError), ("a:b", ValueError), ("q" * 101, ValueError), (None, TypeError), (3, TypeError)]
)
def test_a_bad_queue_name_is_refused(queue, error):
    for act in (ops.pause, ops.resume):
        with pytest.raises(error):
            act(queue)
    assert not QueueControl.objects.exists()


# --- claims and the idle probe ---------------------------------------------------------------------


def test_a_paused_queue_gives_no_claim_and_no_due_time_and_other_queues_are_untouched():
    now = now_ms()
    waiting = make_job(run_at_ms=now - 1_000)
    lapsed = make_job(status="running", attempts=1, max_attempts=3, lease_expires_ms=now - 1_000, claimed_by="gone")
    fast = make_job(queue="fast", run_at_ms=now - 1_000)
    ops.pause("default")

    # An idle worker of a paused queue has nothing to wake for; the expired lease is not a last attempt.
    assert store().due_times("default") == (None, None, None)
    assert store().claim("default", 10, now, "w1") == [], "neither a waiting job nor an expired lease is claimed"
    assert [job.id for job in store().claim("fast", 10, now, "w1")] == [fast.pk]
    assert not drain(), "drain() claims like a worker: nothing of a paused queue"

    ops.resume("default")
    assert store().due_times("default") == (waiting.run_at_ms, lapsed.lease_expires_ms, None)
    claimed = store().claim("default", 10, now, "w2")
    assert sorted(job.id for job in claimed) == sorted([waiting.pk, lapsed.pk])
    assert next(job for job in claimed if job.id == lapsed.pk).reclaimed_from == "gone"


def test_the_mariadb_watcher_sees_no_due_job_in_a_paused_queue():
    if db_vendor() != "mysql":
        pytest.skip("the MariaDB watcher's statement")
    from django.db import connection

    from django_durq.db.mysql import watcher_look

    now = now_ms()
    make_job(run_at_ms=now - 1_000)
    newest = make_job(queue="fast", run_at_ms=now - 1_000).pk
    ops.pause("default")
    look = watcher_look(0, 2)
    params = [newest, "default", now, "default", "fast", now, "fast"]  # no id above the newest
    with connection.cursor() as cursor:
        cursor.execute(look, params)
        assert [tuple(row) for row in cursor.fetchall()] == [(None, "fast")]
        ops.resume("default")
        cursor.execute(look, params)
        assert sorted(tuple(row) for row in cursor.fetchall()) == [(None, "default"), (None, "fast")]


# --- stats, health, metrics ---------------------------------------------------------------------


def test_stats_show_the_paused_state_and_list_a_paused_queue_without_jobs():
    ops.pause("default", now_ms=NOW)
    ops.pause("holiday", now_ms=NOW + 1)
    rows = {row.queue: row for row in ops.stats(now_ms=NOW + 10)}
    assert (rows["default"].paused, rows["default"].paused_ms) == (True, NOW)
    assert (rows["fast"].paused, rows["fast"].paused_ms) == (False, None)
    assert rows["holiday"].paused, "a paused queue is listed so that it can be resumed"
    assert rows["default"].as_dict()["paused"] is True


def test_health_counts_no_paused_queue_as_stuck():
    now = now_ms()
    make_job(queue="video", run_at_ms=now - 3_600_000)  # due an hour ago, no worker serves "video"
    report = ops.health(now_ms=now, min_workers=0)
    assert not report["healthy"] and report["unserved_queues"] == {"video": 1}

    ops.pause("video")
    report = ops.health(now_ms=now, min_workers=0)
    assert report["healthy"], report["problems"]
    assert report["unserved_queues"] == {} and report["oldest_wait_seconds"] is None
    assert report["paused_queues"] == ["video"]
    assert ops.unserved(now_ms=now) == {}


@pytest.mark.urls("tests.admin.test_admin")
def test_metrics_have_a_paused_gauge_per_queue(settings):
    settings.DURQ = {**settings.DURQ, "MONITORING": {"PUBLIC": True}}
    ops.pause("fast")
    body = Client().get("/durq/metrics/").content.decode()
    assert "# TYPE durq_queue_paused gauge" in body
    assert 'durq_queue_paused{queue="fast"} 1' in body
    assert 'durq_queue_paused{queue="default"} 0' in body


# --- the durq command ------------------------------------------------------------------------------


def durq(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("durq", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_durq_pause_resume_and_stats():
    out, err = durq("pause", "default", "fast", "default")
    assert out.splitlines() == [
        "Paused queue 'default': workers start none of its jobs; running jobs finish.",
        "Paused queue 'fast': workers start none of its jobs; running jobs finish.",
    ]
    assert err == ""
    assert set(ops.paused_queues()) == {"default", "fast"}
    out, _ = durq("pause", "fast")
    assert out.startswith("Queue 'fast' was already paused (since ")

    out, _ = durq("stats")
    states = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:]}
    assert states["default"] == states["fast"] == "paused" and states["slow"] == "active"
    out, _ = durq("stats", "--json")
    paused = {row["queue"]: row["paused"] for row in json.loads(out)}
    assert {queue: paused[queue] for queue in ("default", "fast", "slow")} == {"default": True, "fast": True, "slow": False}
    assert not any(state for queue, state in paused.items() if queue not in ("default", "fast"))

    out, _ = durq("resume", "fast", "slow")
    assert out.splitlines() == ["Resumed queue 'fast': its due jobs start now.", "Queue 'slow' was not paused."]
    assert set(ops.paused_queues()) == {"default"}


def test_durq_pause_warns_of_a_queue_nobody_knows():
    out, err = durq("pause", "emial")
    assert out.startswith("Paused queue 'emial'")
    assert "no queue 'emial' is configured, registered or holds jobs: is it misspelt?" in err


@pytest.mark.parametrize("args", [["pause"], ["resume"], ["pause", "a:b"], ["resume", ""], ["pause", "q" * 101]])
def test_durq_pause_and_resume_refuse_bad_input(args):
    with pytest.raises(CommandError) as raised:
        durq(*args)
    assert raised.value.returncode == 2
    assert not QueueControl.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_durq_pause_exits_2_with_one_line_on_a_bad_queue_name(worker_env):
    done = run_command("durq", "pause", "bad:name", env=worker_env)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.endswith(
        "durq pause: error: argument QUEUE: 'bad:name' is not a queue name (1 to 100 characters, no ':' or NUL) (see --help)"
    )
    assert done.stdout == ""
    assert not QueueControl.objects.exists()


# --- the admin's Queues page ------------------------------------------------------------------


def staff(username: str, *codenames: str) -> Client:
    account = User.objects.create_user(username, is_staff=True)
    account.user_permissions.set(Permission.objects.filter(content_type__app_label="django_durq", codename__in=codenames))
    client = Client()
    client.force_login(account)
    return client


@pytest.mark.urls("tests.admin.test_admin")
def test_the_queues_page_pauses_and_resumes():
    admin = Client()
    admin.force_login(User.objects.create_superuser("root"))
    page = admin.get("/admin/django_durq/queue/").content.decode()
    assert 'href="/admin/django_durq/queue/pause/?queue=fast"' in page and "durq-paused" not in page

    response = admin.post("/admin/django_durq/queue/pause/", {"queue": "fast", "reason": "provider outage"}, follow=True)
    assert response.redirect_chain == [("/admin/django_durq/queue/", 302)]
    page = response.content.decode()
    assert "Paused queue “fast”: workers start none of its jobs until it is resumed; running jobs finish." in page
    assert 'class="durq-status durq-paused"' in page and 'href="/admin/django_durq/queue/resume/?queue=fast"' in page
    assert set(ops.paused_queues()) == {"fast"}

    page = admin.post("/admin/django_durq/queue/pause/", {"queue": "fast", "reason": "again"}, follow=True).content.decode()
    assert "Queue “fast” was already paused." in page
    page = admin.post("/admin/django_durq/queue/resume/", {"queue": "fast", "reason": "back"}, follow=True).content.decode()
    assert "Resumed queue “fast”: its due jobs start now." in page
    assert ops.paused_queues() == {}


@pytest.mark.urls("tests.admin.test_admin")
def test_the_queues_page_refuses_what_it_should():
    admin = Client()
    admin.force_login(User.objects.create_superuser("root"))
    assert admin.get("/admin/django_durq/queue/pause/?queue=fast").status_code == 200, "the confirmation"
    assert admin.post("/admin/django_durq/queue/pause/", {"queue": "a:b", "reason": "x"}).status_code == 400
    assert admin.post("/admin/django_durq/queue/resume/", {"reason": "x"}).status_code == 400

    viewer = staff("viewer", "view_queue")
    page = viewer.get("/admin/django_durq/queue/").content.decode()
    assert "durq-pause" not in page and "/queue/pause/" not in page
    assert viewer.post("/admin/django_durq/queue/pause/", {"queue": "fast", "reason": "x"}).status_code == 403

    changer = staff("changer", "view_queue", "change_queue")
    assert changer.post("/admin/django_durq/queue/pause/", {"queue": "fast", "reason": "x"}).status_code == 302

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="root"))
    assert strict.post("/admin/django_durq/queue/resume/", {"queue": "fast", "reason": "x"}).status_code == 403, "no CSRF"
    assert set(ops.paused_queues()) == {"fast"}


# --- real workers ---------------------------------------------------------------------------------


def wait_for(predicate, what: str, *workers, timeout: float = 30) -> None:
    try:
        wait_until(predicate, timeout, what)
    except AssertionError as error:
        logs = "\n".join(f"--- worker {worker.pid} ---\n{worker.output()}" for worker in workers)
        raise AssertionError(f"{error}\n{logs}") from None


def ran(tag: str) -> bool:
    return Effect.objects.filter(tag=tag).exists()


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_worker_started_after_the_pause_runs_other_queues_and_wakes_at_once_on_resume(spawn_worker):
    ops.pause("default")
    held = [jobs.effect.enqueue(tag=f"held-{i}") for i in range(3)]
    jobs.effect_fast.enqueue(tag="fast-1")
    worker = spawn_worker("--queue", "default:2", "--queue", "fast:1", env={"DURQ_TEST_POLL": str(POLL_S)})
    wait_for(lambda: ran("fast-1"), "the other queue's job", worker)
    jobs.effect_fast.enqueue(tag="fast-2")
    wait_for(lambda: ran("fast-2"), "a job queued in the other queue while one is paused", worker)
    time.sleep(1.5)  # time enough for the paused queue's due jobs to start, were they claimable
    assert not Effect.objects.filter(tag__startswith="held-").exists()
    assert set(Job.objects.filter(pk__in=[job.pk for job in held]).values_list("status", flat=True)) == {"waiting"}

    started = time.monotonic()
    assert ops.resume("default")
    # The poll interval is 120 s: running well before that means the resume woke the worker.
    wait_for(lambda: Effect.objects.filter(tag__startswith="held-").count() == 3, "the resumed queue's jobs", worker)
    assert time.monotonic() - started < POLL_S / 4


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_pause_stops_new_starts_while_the_running_job_finishes(spawn_worker):
    worker = spawn_worker("--queue", "default:1", env={"DURQ_TEST_PREFETCH": "0"})
    wait_for(lambda: WorkerProcess.objects.exists(), "the worker to register", worker)
    first = jobs.effect.enqueue(tag="first", sleep=2.0)
    wait_for(lambda: Job.objects.filter(pk=first.pk, status="running").exists(), "the first job to start", worker)
    second = jobs.effect.enqueue(tag="second")
    assert ops.pause("default")

    wait_for(lambda: ran("first"), "the running job to finish", worker)
    time.sleep(1.5)  # the slot is free and the next job due: it would start now were the queue not paused
    assert not ran("second")
    assert Job.objects.get(pk=second.pk).status == "waiting"

    assert ops.resume("default")
    wait_for(lambda: ran("second"), "the waiting job after the resume", worker)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process and its threads, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_an_idle_worker_of_a_paused_queue_with_due_jobs_costs_no_more_than_one_of_an_empty_queue(spawn_worker):
    ops.pause("default")
    for i in range(20):
        jobs.effect.enqueue(tag=f"held-{i}")
    # A short poll interval makes any loop show: each poll is a probe, and a wasted claim would be a write.
    env = {"DURQ_TEST_POLL": "0.05"}
    paused = spawn_worker("--queue", "default:2", env=env)
    empty = spawn_worker("--queue", "slow:2", env=env)
    wait_for(lambda: WorkerProcess.objects.count() == 2, "both workers to register", paused, empty)
    time.sleep(2)  # past start-up
    before = {worker: cpu_seconds(worker.pid) for worker in (paused, empty)}
    time.sleep(5)
    used = {worker: cpu_seconds(worker.pid) - before[worker] for worker in (paused, empty)}
    assert not ran("held-0")
    # A loop that claims without pause would take a good part of a core (seconds in 5 s); the margin
    # keeps a loaded machine's noise out of it.
    assert used[paused] <= 2 * used[empty] + 0.5, f"paused {used[paused]:.2f} s of CPU, empty {used[empty]:.2f} s"
