"""The admin pages and the monitoring views, through Django's test client on the real database."""

from __future__ import annotations

import json
import re

import pytest
from django.conf import settings
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import include, path

from django_durq.admin import queues as queue_admin
from django_durq.admin.lists import CappedCountPaginator
from django_durq.admin.queues import throughput_chart
from django_durq.clock import now_ms
from django_durq.models import Job, QueueStat, WorkerProcess
from django_durq.ops import Bucket
from django_durq.ops import format_age as age
from tests.admin.helpers import JOBS, QUEUES, SCRIPT, dead_letter, messages_of, staff, text
from tests.ops.test_ops import ended_worker, make_job

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.admin.test_admin")]

urlpatterns = [path("admin/", admin.site.urls), path("durq/", include("django_durq.urls"))]

LOST = "lease expired: worker lost"
DEAD = "/admin/django_durq/deadletter/"


def action(client: Client, url: str, name: str, ids: list[int], **extra: str):
    return client.post(url, {"action": name, "_selected_action": [str(i) for i in ids], "index": "0", **extra}, follow=True)


# --- jobs ---------------------------------------------------------------------------------------


def test_job_list_filters_search_and_local_times(superuser):
    dead = dead_letter(unique_key="invoice:42")
    waiting = make_job("waiting", name="tests.noop", queue="fast", run_at_ms=1_700_000_000_000)
    with override_settings(TIME_ZONE="Asia/Tokyo"):
        page = superuser.get(JOBS).content.decode()
    assert "2023-11-15 07:13:20 JST" in page, "1_700_000_000_000 ms shown in the local time zone"
    assert "3 of 3" in page and "ValueError: attempt 3 broke" in page
    assert "?name=tests.noop" in page and "?queue=slow" in page, "choices from the registry and the settings"
    assert superuser.get(JOBS, {"status": "dead"}).context["cl"].result_list[0].pk == dead.pk
    assert [job.pk for job in superuser.get(JOBS, {"queue": "fast"}).context["cl"].result_list] == [waiting.pk]
    assert [job.pk for job in superuser.get(JOBS, {"name": "tests.noop"}).context["cl"].result_list] == [waiting.pk]
    assert [job.pk for job in superuser.get(JOBS, {"q": "invoice:42"}).context["cl"].result_list] == [dead.pk]
    assert [job.pk for job in superuser.get(JOBS, {"q": f"#{waiting.pk}"}).context["cl"].result_list] == [waiting.pk]
    assert not superuser.get(JOBS, {"q": "nothing-like-it"}).context["cl"].result_list
    numeric = make_job("waiting", unique_key="2024")
    assert [job.pk for job in superuser.get(JOBS, {"q": "2024"}).context["cl"].result_list] == [numeric.pk]


def test_job_list_never_counts_the_whole_table(superuser, monkeypatch):
    monkeypatch.setattr(CappedCountPaginator, "cap", 20)
    Job.objects.bulk_create(
        [Job(name="tests.noop", status="finished", arguments="{}", run_at_ms=0, created_ms=0, lease_ms=1) for _ in range(30)]
    )
    with CaptureQueriesContext(connection) as queries:
        page = superuser.get(JOBS).content.decode()
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper() and "durq_job" in q["sql"]]
    assert counts and all("LIMIT" in sql.upper() for sql in counts), counts
    assert not any("DISTINCT" in q["sql"].upper() for q in queries.captured_queries)
    assert "More than 20 jobs" in page and "Select all matching jobs" in page
    assert "31 jobs" not in superuser.get(JOBS, {"status": "dead"}).content.decode()


def test_job_detail_shows_a_running_job_whose_worker_ended_as_orphaned(superuser):
    job = make_job("running", claimed_by=ended_worker("gone:2:bbbbbb"), lease_expires_ms=1_700_000_030_000)
    page = superuser.get(f"{JOBS}{job.pk}/change/").content.decode()
    assert "gone:2:bbbbbb (ended: the job is orphaned until a running worker takes it over" in page


def test_job_detail_shows_arguments_errors_lease_and_progress(superuser):
    now = now_ms()
    WorkerProcess.objects.create(  # a live worker (heartbeats): its job is not orphaned
        worker_id="web-1:42:abc", host="web-1", pid=42, queues='{"default": 4}', started_ms=now, last_seen_ms=now
    )
    job = make_job(
        "running",
        arguments=json.dumps({"args": [1], "kwargs": {"video": "cat.mp4"}}),
        claimed_by="web-1:42:abc",
        lease_expires_ms=1_700_000_030_000,
        progress_done=3,
        progress_total=4,
        errors=json.dumps(
            [{"attempt": 1, "at_ms": 1_700_000_000_000, "kind": "lease_expired", "message": "lease expired: worker lost"}]
        ),
    )
    page = superuser.get(f"{JOBS}{job.pk}/change/").content.decode()
    assert "&quot;video&quot;: &quot;cat.mp4&quot;" in page and "&quot;args&quot;: [\n    1\n  ]" in page
    assert "web-1:42:abc" in page and "2023-11-14 22:13:50 UTC" in page
    assert "orphaned" not in page.lower()
    assert '<progress class="durq-progress" value="3" max="4"></progress> 3 / 4 (75%)' in page
    assert LOST in page
    assert "Ask to stop" in page and "Retry now" not in page
    assert 'name="_save"' not in page, "a job is never saved from a form"


def test_everything_from_a_job_is_escaped(superuser):
    job = dead_letter(
        name=SCRIPT,
        queue=SCRIPT,
        unique_key=SCRIPT,
        arguments=json.dumps({"args": [SCRIPT], "kwargs": {}}),
        errors=json.dumps([{"attempt": 1, "type": SCRIPT, "message": SCRIPT, "traceback": SCRIPT, "worker": SCRIPT}]),
    )
    pages = [
        superuser.get(JOBS).content.decode(),
        superuser.get(DEAD).content.decode(),
        superuser.get(f"{JOBS}{job.pk}/change/").content.decode(),
        superuser.get(f"{DEAD}{job.pk}/change/").content.decode(),
        superuser.get(f"{DEAD}{job.pk}/purge/").content.decode(),
        superuser.get(QUEUES).content.decode(),
    ]
    for page in pages:
        assert SCRIPT not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


# --- actions and permissions --------------------------------------------------------------------


def test_retry_and_cancel_actions_on_the_job_list(superuser):
    dead, waiting, finished = dead_letter(), make_job("waiting"), make_job("finished")
    response = action(superuser, JOBS, "retry_selected", [dead.pk, finished.pk])
    assert messages_of(response) == [
        "Retried 1 job: due now.",
        f"1 job was not retried: #{finished.pk} is finished, so it is not retried.",
    ]
    assert Job.objects.get(pk=dead.pk).status == "waiting"
    response = action(superuser, JOBS, "cancel_selected", [waiting.pk])
    assert messages_of(response) == ["Cancelled 1 waiting job."]
    assert Job.objects.get(pk=waiting.pk).status == "cancelled"


def test_dead_letters_page_retry_and_purge_with_confirmation(superuser):
    keep, retry, purge = dead_letter(), dead_letter(), dead_letter()
    make_job("waiting")
    listing = superuser.get(DEAD)
    assert sorted(job.pk for job in listing.context["cl"].result_list) == sorted([keep.pk, retry.pk, purge.pk])
    assert "attempt 3 broke" in listing.content.decode()

    response = action(superuser, DEAD, "retry_selected", [retry.pk])
    assert messages_of(response) == ["Retried 1 job: due now."]
    assert retry.pk not in [job.pk for job in response.context["cl"].result_list]

    confirm = action(superuser, DEAD, "purge_selected", [purge.pk])
    assert "1 dead letter will be deleted for good" in text(confirm)
    assert Job.objects.filter(pk=purge.pk).exists(), "nothing is deleted before the confirmation"
    done = action(superuser, DEAD, "purge_selected", [purge.pk], post="yes")
    assert messages_of(done) == ["Purged 1 dead letter."]
    assert not Job.objects.filter(pk=purge.pk).exists() and Job.objects.filter(pk=keep.pk).exists()


def test_purge_across_every_matching_dead_letter(superuser):
    fast = [dead_letter(queue="fast") for _ in range(3)]
    other = dead_letter(queue="default")
    done = superuser.post(
        f"{DEAD}?queue=fast",
        {"action": "purge_selected", "_selected_action": [str(fast[0].pk)], "select_across": "1", "index": "0", "post": "yes"},
        follow=True,
    )
    assert messages_of(done) == ["Purged 3 dead letters."]
    assert list(Job.objects.values_list("pk", flat=True)) == [other.pk]


def test_single_job_buttons_retry_and_purge(superuser):
    job, other = dead_letter(), dead_letter()
    detail = superuser.get(f"{DEAD}{job.pk}/change/").content.decode()
    assert "Retry now" in detail and "Purge" in detail
    assert superuser.get(f"{DEAD}{job.pk}/retry/").status_code == 405
    response = superuser.post(f"{DEAD}{job.pk}/retry/", follow=True)
    assert response.redirect_chain[-1][0] == DEAD and messages_of(response) == ["Retried 1 job: due now."]
    assert "1 dead letter will be deleted" in text(superuser.get(f"{DEAD}{other.pk}/purge/"))
    response = superuser.post(f"{DEAD}{other.pk}/purge/", follow=True)
    assert messages_of(response) == ["Purged 1 dead letter."] and not Job.objects.filter(pk=other.pk).exists()
    running = make_job("waiting")
    response = superuser.post(f"{JOBS}{running.pk}/cancel/", follow=True)
    assert messages_of(response) == ["Cancelled 1 waiting job."]


def test_without_permission_there_is_no_action_and_the_views_refuse():
    viewer = staff("viewer", "view_job", "view_deadletter", "view_queue")
    job = dead_letter()
    listing = viewer.get(DEAD)
    assert listing.status_code == 200 and listing.context["action_form"] is None
    detail = viewer.get(f"{DEAD}{job.pk}/change/").content.decode()
    assert "Retry now" not in detail and "Purge" not in detail
    assert viewer.post(f"{DEAD}{job.pk}/retry/").status_code == 403
    assert viewer.post(f"{JOBS}{job.pk}/retry/").status_code == 403
    assert viewer.post(f"{DEAD}{job.pk}/purge/").status_code == 403
    assert viewer.get(f"{DEAD}{job.pk}/purge/").status_code == 403
    assert viewer.post(f"{JOBS}{job.pk}/cancel/").status_code == 403
    action(viewer, DEAD, "purge_selected", [job.pk], post="yes")
    assert Job.objects.get(pk=job.pk).status == "dead"

    retrier = staff("retrier", "view_deadletter", "change_deadletter")
    choices = [name for name, _ in retrier.get(DEAD).context["action_form"].fields["action"].choices]
    assert "retry_selected" in choices and "purge_selected" not in choices
    assert retrier.post(f"{DEAD}{job.pk}/purge/").status_code == 403
    assert staff("nobody").get(QUEUES).status_code == 403


def test_actions_need_the_csrf_token():
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("root"))
    job = dead_letter()
    assert client.post(f"{DEAD}{job.pk}/retry/").status_code == 403
    assert client.post(f"{DEAD}{job.pk}/purge/").status_code == 403
    assert Job.objects.get(pk=job.pk).status == "dead"


# --- queues page --------------------------------------------------------------------------------


def test_queues_page_counts_workers_and_chart(superuser):
    now = now_ms()
    make_job("waiting", run_at_ms=now - 125_000)
    make_job("waiting", run_at_ms=now + 3_600_000)
    dead_letter(queue="fast")
    minute = now // 60_000 * 60_000
    QueueStat.objects.create(queue="default", minute_ms=minute - 5 * 60_000, finished=40, failed=3)
    WorkerProcess.objects.create(
        worker_id="web-1:42:abc", host="web-1", pid=42, queues='{"default": 4}', started_ms=now, last_seen_ms=now
    )
    response = superuser.get(QUEUES)
    page = response.content.decode()
    rows = {row["stats"].queue: row for row in response.context["rows"]}
    assert (rows["default"]["stats"].waiting, rows["default"]["stats"].delayed, rows["fast"]["stats"].dead) == (1, 1, 1)
    assert rows["default"]["oldest"].startswith("2 min")
    assert "web-1:42:abc" in page and "default:4" in page
    assert '<svg id="durq-throughput"' in page
    assert page.count('<rect class="durq-finished"') == 1 and page.count('<rect class="durq-failed"') == 1
    assert re.search(r'id="durq-finished-total">40<', page) and re.search(r'id="durq-failed-total">3<', page)
    assert "<script" not in page.split('<div id="content-main">')[1], "the page needs no script"


def test_queues_page_warns_of_due_jobs_no_live_worker_serves(superuser):
    now = now_ms()
    WorkerProcess.objects.create(worker_id="w", host="h", pid=1, queues='{"default": 2}', started_ms=now, last_seen_ms=now)
    make_job("waiting", queue="default", run_at_ms=now - 1_000)
    assert 'id="durq-unserved"' not in superuser.get(QUEUES).content.decode()
    make_job("waiting", queue="video", run_at_ms=now - 1_000)
    make_job("waiting", queue="video", run_at_ms=now - 1_000)
    page = text(superuser.get(QUEUES))
    assert 'id="durq-unserved"' in page
    assert "2 jobs are due in queue “video”, and no live worker serves it: they wait until a worker runs that queue." in page
    assert "queue “default”" not in page


def test_queues_page_counts_stop_at_the_cap(superuser, monkeypatch):
    monkeypatch.setattr(queue_admin, "COUNT_CAP", 2)
    for _ in range(3):
        dead_letter(queue="slow")
    page = text(superuser.get(QUEUES))
    assert "more than 2" in page


def test_chart_geometry_and_age():
    buckets = [Bucket(60_000 * i, finished=i, failed=1 if i == 59 else 0) for i in range(60)]
    chart = throughput_chart(buckets)
    assert len(chart["bars"]) == 60 and chart["finished"] == sum(range(60)) and chart["failed"] == 1
    assert [line["label"] for line in chart["grid"]] == ["0", "20", "40", "60", "80"]
    last = chart["bars"][-1]
    assert last["failed_y"] + last["failed_h"] == pytest.approx(last["finished_y"])
    assert [age(ms) for ms in (None, 5, 12_000, 192_000, 7_500_000, 90_000_000)] == [
        "-",
        "5 ms",
        "12 s",
        "3 min 12 s",
        "2 h 5 min",
        "1 d 1 h",
    ]


# --- looking like the admin's own pages -------------------------------------------------------


def crumbs(page: str) -> str:
    """The breadcrumbs markup of an admin page, whitespace between tags dropped."""
    found = re.search(r'<nav aria-label="Breadcrumbs">(.*?)</nav>', page, re.S)
    assert found, "the page has the admin's breadcrumbs"
    return re.sub(r">\s+<", "><", re.sub(r"\s+", " ", found.group(1))).strip()


def test_breadcrumbs_render_like_the_admins_own(superuser):
    job = dead_letter()
    user = User.objects.get(username="root")
    stock_list = crumbs(superuser.get(JOBS).content.decode())
    assert crumbs(superuser.get(QUEUES).content.decode()) == stock_list.replace("Jobs", "Queues")
    stock_history = crumbs(superuser.get(f"{DEAD}{job.pk}/history/").content.decode())
    assert crumbs(superuser.get(f"{DEAD}{job.pk}/purge/").content.decode()) == stock_history.replace("History", "Purge")
    stock_delete = crumbs(action(superuser, "/admin/auth/user/", "delete_selected", [user.pk]).content.decode())
    ours = crumbs(action(superuser, DEAD, "purge_selected", [job.pk]).content.decode())
    app = str(Job._meta.app_config.verbose_name)
    for stock, own in [
        ("/admin/auth/user/", DEAD),
        ("/admin/auth/", "/admin/django_durq/"),
        ("Users", "Dead letters"),
        ("Authentication and Authorization", app),
        ("Delete multiple objects", "Purge"),
    ]:
        stock_delete = stock_delete.replace(stock, own)
    assert ours == stock_delete


def test_messages_count_in_words(superuser):
    jobs = [dead_letter() for _ in range(2)]
    assert messages_of(action(superuser, DEAD, "retry_selected", [job.pk for job in jobs])) == ["Retried 2 jobs: due now."]
    finished = [make_job("finished") for _ in range(2)]
    retried = action(superuser, JOBS, "retry_selected", [job.pk for job in finished])
    assert [message.split(":")[0] for message in messages_of(retried)] == ["2 jobs were not retried"]
    doomed = [dead_letter().pk, dead_letter().pk]
    assert "2 dead letters will be deleted for good" in text(action(superuser, DEAD, "purge_selected", doomed))
    assert messages_of(action(superuser, DEAD, "purge_selected", doomed, post="yes")) == ["Purged 2 dead letters."]


# --- monitoring views ---------------------------------------------------------------------------


def test_monitoring_views_are_closed_by_default():
    assert Client().get("/durq/health/").status_code == 403
    assert Client().get("/durq/metrics/").status_code == 403
    assert staff("nobody").get("/durq/metrics/").status_code == 403
    assert staff("viewer", "view_job").get("/durq/health/").status_code in (200, 503)


def test_health_and_metrics_with_a_token():
    now = now_ms()
    bearer = {"HTTP_AUTHORIZATION": "Bearer s3cret-s3cret-s3cret"}
    with override_settings(DURQ={**settings.DURQ, "MONITORING": {"TOKEN": "s3cret-s3cret-s3cret", "MAX_WAIT": 60}}):
        assert Client().get("/durq/health/", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
        unhealthy = Client().get("/durq/health/", **bearer)
        assert unhealthy.status_code == 503 and unhealthy.json()["problems"] == ["0 live workers, fewer than 1"]
        WorkerProcess.objects.create(worker_id="w", host="h", pid=1, queues='{"default": 2}', started_ms=now, last_seen_ms=now)
        assert Client().get("/durq/health/", **bearer).status_code == 200
        make_job("waiting", run_at_ms=now - 120_000, queue='we"ird')
        stranded = Client().get("/durq/health/", **bearer)
        assert stranded.status_code == 503 and stranded.json()["unserved_queues"] == {'we"ird': 1}
        assert "1 due job in queue 'we\"ird', which no live worker serves" in stranded.json()["problems"]
        metrics = Client().get("/durq/metrics/", **bearer)
    assert metrics["Content-Type"].startswith("text/plain; version=0.0.4")
    text = metrics.content.decode()
    assert "# TYPE durq_jobs gauge" in text
    assert 'durq_jobs{queue="default",state="waiting"} 0' in text
    assert 'durq_jobs{queue="we\\"ird",state="waiting"} 1' in text
    assert 'durq_workers{queue="default"} 1' in text
    assert re.search(r'durq_oldest_waiting_seconds\{queue="we\\"ird"\} 1[12]\d', text)
    with override_settings(DURQ={**settings.DURQ, "MONITORING": {"PUBLIC": True}}):
        assert Client().get("/durq/metrics/").status_code == 200
