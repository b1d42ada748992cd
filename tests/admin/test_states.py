"""What the admin says a job is doing and why (orphaned, blocked, held by a limit, paused); who paused a queue, and why.

Through Django's test client on the real database; jobs get their states through the product's
paths (claims that take them, a workflow, ``ops.pause``). The last test kills a real worker.
"""

from __future__ import annotations

import io
import json
import re
import signal

import pytest
from django.core.management import CommandError, call_command
from django.test import Client, override_settings

from django_durq import Workflow, ops, schedules
from django_durq.clock import now_ms
from django_durq.models import Job, WorkerProcess
from django_durq.testing import drain
from tests.admin.demo import NIGHTLY_CRON
from tests.admin.helpers import JOBS, QUEUES, SCRIPT, claim, messages_of, staff, text
from tests.conftest import wait_until
from tests.ledger import jobs

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.admin.test_admin")]

LIVE = "web-1:4101:a1b2c1"
LOG = "/srv/media/runs.log"


def worker(worker_id: str, queues: dict[str, int], seen_ago_ms: int = 1_000) -> None:
    host, pid, _ = worker_id.split(":")
    now = now_ms()
    WorkerProcess.objects.create(
        worker_id=worker_id, host=host, pid=int(pid), queues=json.dumps(queues), started_ms=now - 3_600_000,
        last_seen_ms=now - seen_ago_ms,
    )  # fmt: skip


def state_cell(page: str, job_id: int) -> str:
    """The text of the list's state cell in the row of ``job_id``, tags dropped."""
    row = re.search(rf'value="{job_id}"(.*?)</tr>', page, re.S)
    assert row, f"job {job_id} is listed"
    cell = re.search(r'<td class="field-state">(.*?)</td>', row.group(1), re.S)
    assert cell, "the row has a state"
    return " ".join(re.sub(r"<[^>]+>", " ", cell.group(1)).split())


def detail_state(client: Client, job_id: int) -> str:
    """The text of the state field on the job's page, its label left out."""
    page = client.get(f"{JOBS}{job_id}/change/").content.decode()
    field = re.search(r'<div class="form-row field-state">.*?</label>(.*?)(<div class="form-row|</fieldset>)', page, re.S)
    assert field, "the job's page has a state"
    return " ".join(re.sub(r"<[^>]+>", " ", field.group(1)).split())


def test_a_running_job_whose_worker_is_gone_is_orphaned_and_one_whose_worker_lives_is_running(superuser):
    worker(LIVE, {"fast": 2})
    worker("web-3:4103:9f8e7d", {"fast": 2}, seen_ago_ms=3_600_000)
    healthy = jobs.sleeper.using(queue="fast").enqueue(seconds=600)
    claim("fast", 1, LIVE)
    stale = jobs.sleeper.using(queue="fast").enqueue(seconds=600)
    claim("fast", 1, "web-3:4103:9f8e7d")
    rowless = jobs.sleeper.using(queue="fast").enqueue(seconds=600)
    claim("fast", 1, "web-4:4104:000001")
    page = superuser.get(JOBS).content.decode()

    assert state_cell(page, healthy.pk).startswith(f"Running on {LIVE}")
    assert state_cell(page, stale.pk).startswith("Orphaned")
    assert "web-3:4103:9f8e7d" in state_cell(page, stale.pk) and "1 h" in state_cell(page, stale.pk)
    assert state_cell(page, rowless.pk).startswith("Orphaned") and "web-4:4104:000001" in state_cell(page, rowless.pk)
    state = detail_state(superuser, stale.pk)
    assert state.startswith("Orphaned") and "web-3:4103:9f8e7d" in state and "another worker takes it over" in state
    assert detail_state(superuser, healthy.pk).startswith(f"Running on {LIVE}")
    assert set(Job.objects.values_list("status", flat=True)) == {"running"}, "shown, never written"

    queues = superuser.get(QUEUES).content.decode()
    fast = re.search(r'<tr data-queue="fast">(.*?)</tr>', queues, re.S).group(1)
    assert "2 orphaned" in " ".join(re.sub(r"<[^>]+>", " ", fast).split())


def test_blocked_held_and_paused_jobs_say_why(superuser):
    worker(LIVE, {"default": 4, "video": 3, "fast": 2, "slow": 1})
    flow = Workflow("publish video 42")
    scan = flow.add(jobs.step, tag="scan")
    encodes = [flow.add(jobs.step, tag=p, after=[scan]) for p in ("1080p", "720p", "480p")]
    publish = flow.add(jobs.summary, after=encodes)
    flow.enqueue()
    video = [jobs.capped.enqueue(log=LOG) for _ in range(4)]
    claimed = claim("video", 3, LIVE)
    [held] = [job.pk for job in video if job.pk not in claimed]
    keyed = [jobs.one_per_key.using(queue="fast").enqueue(key="customer-7", log=LOG) for _ in range(2)]
    claim("fast", 1, LIVE)
    waiting = jobs.encode_video.enqueue(video_id=9000)
    ops.pause("slow", reason="encoder disk full, OPS-1432", by="ada")
    page = superuser.get(JOBS).content.decode()

    assert state_cell(page, publish.job.pk) == "Blocked waiting for 3 upstream jobs to end"
    assert state_cell(page, encodes[0].job.pk) == "Blocked waiting for 1 upstream job to end"
    assert state_cell(page, held) == "Held by a limit queue “video” runs 3 of at most 3"
    assert state_cell(page, keyed[1].pk) == "Held by a limit key “customer-7” runs 1 of at most 1"
    assert state_cell(page, waiting.pk).startswith("Paused queue “slow” paused by ada: encoder disk full, OPS-1432 (since ")
    assert detail_state(superuser, held) == "Held by a limit queue “video” runs 3 of at most 3"
    assert "9999" not in page and "None" not in text(superuser.get(f"{JOBS}{publish.job.pk}/change/"))

    drain(queue="default", max_jobs=2)  # the scan, then a transcode
    assert state_cell(superuser.get(JOBS).content.decode(), publish.job.pk) == "Blocked waiting for 2 upstream jobs to end"


def test_pause_and_resume_ask_for_a_reason_and_record_who_and_when(superuser):
    form = superuser.get(f"{QUEUES}pause/", {"queue": "fast"})
    assert form.status_code == 200 and 'name="reason"' in form.content.decode()
    assert "Pause queue “fast”?" in text(form)
    refused = superuser.post(f"{QUEUES}pause/", {"queue": "fast", "reason": "  "})
    assert refused.status_code == 200 and "Say why" in text(refused)
    assert ops.paused_queues() == {}, "no reason, no pause"

    done = superuser.post(f"{QUEUES}pause/", {"queue": "fast", "reason": "payment provider outage"}, follow=True)
    assert done.redirect_chain == [(QUEUES, 302)]
    assert messages_of(done) == ["Paused queue “fast”: workers start none of its jobs until it is resumed; running jobs finish."]
    switch = ops.queue_switches()["fast"]
    assert (switch.paused, switch.by, switch.reason) == (True, "root", "payment provider outage")
    row = " ".join(
        re.sub(r"<[^>]+>", " ", re.search(r'<tr data-queue="fast">(.*?)</tr>', done.content.decode(), re.S)[1]).split()
    )
    assert "Paused by root" in row and "payment provider outage" in row

    form = text(superuser.get(f"{QUEUES}resume/", {"queue": "fast"}))
    assert "Resume queue “fast”?" in form and "payment provider outage" in form and "by root" in form
    done = superuser.post(f"{QUEUES}resume/", {"queue": "fast", "reason": "provider is back"}, follow=True)
    assert messages_of(done) == ["Resumed queue “fast”: its due jobs start now."]
    switch = ops.queue_switches()["fast"]
    assert (switch.paused, switch.by, switch.reason) == (False, "root", "provider is back") and ops.paused_queues() == {}
    row = " ".join(
        re.sub(r"<[^>]+>", " ", re.search(r'<tr data-queue="fast">(.*?)</tr>', done.content.decode(), re.S)[1]).split()
    )
    assert "Active" in row and "resumed by root" in row and "provider is back" in row


def test_pausing_refuses_what_it_should_and_escapes_the_reason(superuser):
    assert superuser.post(f"{QUEUES}pause/", {"queue": "a:b", "reason": "x"}).status_code == 400
    assert superuser.get(f"{QUEUES}pause/", {"queue": "a:b"}).status_code == 400
    long = superuser.post(f"{QUEUES}pause/", {"queue": "fast", "reason": "x" * 501})
    assert long.status_code == 200 and "at most 500 characters" in text(long) and ops.paused_queues() == {}
    viewer = staff("viewer", "view_queue")
    assert viewer.get(f"{QUEUES}pause/", {"queue": "fast"}).status_code == 403
    assert viewer.post(f"{QUEUES}pause/", {"queue": "fast", "reason": "x"}).status_code == 403
    superuser.post(f"{QUEUES}pause/", {"queue": "fast", "reason": SCRIPT})
    jobs.effect_fast.enqueue(tag="held")
    for page in (superuser.get(QUEUES), superuser.get(JOBS), superuser.get(f"{QUEUES}resume/", {"queue": "fast"})):
        assert SCRIPT not in page.content.decode() and "&lt;script&gt;alert(1)&lt;/script&gt;" in page.content.decode()


def test_ops_pause_keeps_its_signature_and_checks_the_reason():
    now = now_ms()
    assert ops.pause("default", now_ms=now) is True
    switch = ops.queue_switches()["default"]
    assert (switch.paused, switch.at_ms, switch.by, switch.reason) == (True, now, "", "")
    assert ops.pause("default", reason="again", by="bob") is False
    assert ops.queue_switches()["default"].reason == "", "a second pause changes nothing"
    for bad in ("x" * 501, "a\x00b"):
        with pytest.raises(ValueError):
            ops.pause("fast", reason=bad)
    with pytest.raises(ValueError):
        ops.resume("default", by="b" * 151)
    assert set(ops.paused_queues()) == {"default"}


def durq(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("durq", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_durq_pause_and_resume_take_a_reason(monkeypatch):
    monkeypatch.setattr("getpass.getuser", lambda: "ada")
    out, _ = durq("pause", "fast", "--reason", "provider outage")
    assert out.splitlines() == ["Paused queue 'fast': workers start none of its jobs; running jobs finish."]
    switch = ops.queue_switches()["fast"]
    assert (switch.by, switch.reason) == ("ada (manage.py durq)", "provider outage")
    out, _ = durq("pause", "fast")
    assert out.startswith("Queue 'fast' was already paused (since ") and "by ada (manage.py durq): provider outage" in out
    durq("resume", "fast", "--reason", "back")
    assert ops.queue_switches()["fast"].reason == "back"
    with pytest.raises(CommandError) as refused:
        durq("pause", "fast", "--reason", "x" * 501)
    assert refused.value.returncode == 2 and ops.paused_queues() == {}


def test_the_queues_page_names_the_hosts_serving_each_queue(superuser):
    worker(LIVE, {"default": 4, "fast": 2})
    worker("web-2:4102:a1b2c2", {"default": 4})
    worker("web-2:4107:a1b2c7", {"default": 2})
    worker("web-3:4103:9f8e7d", {"default": 4}, seen_ago_ms=3_600_000)
    page = superuser.get(QUEUES).content.decode()
    cells = dict(re.findall(r'<tr data-queue="([^"]+)">.*?<td class="durq-served">(.*?)</td>', page, re.S))
    served = {queue: " ".join(re.sub(r"<[^>]+>", " ", cell).split()) for queue, cell in cells.items()}
    assert served["default"] == "web-1 · web-2 ×2 3 processes, 10 slots"
    assert served["fast"] == "web-1 1 process, 2 slots"
    assert served["slow"] == "no live worker"


def test_the_schedules_page_shows_last_run_outcome_and_next_due(superuser, settings):
    declared = {
        "feed-refresh": {"cron": "*/30 * * * *", "job": "tests.effect", "kwargs": {"tag": "feed"}},
        "card-sweep": {"cron": "15 * * * *", "job": "tests.fail", "kwargs": {"message": "card processor answered 502"}},
        "nightly-report": {"cron": NIGHTLY_CRON, "job": "tests.noop"},  # not due in the two hours declared back
    }
    with override_settings(DURQ={**settings.DURQ, "SCHEDULES": declared, "KEEP_FINISHED": 3600}):
        now = now_ms()
        schedules.sync(schedules.schedules(now), now - 2 * 3_600_000)
        schedules.tick(now)
        drain()
        response = superuser.get("/admin/django_durq/schedule/")
        page = response.content.decode()
        detail_page = text(superuser.get("/admin/django_durq/schedule/feed-refresh/change/"))
        detail = " ".join(re.sub(r"<[^>]+>", " ", detail_page).split())
    assert response.context["title"] == "Schedules" and "Select schedule to change" not in page
    rows = {
        name: " ".join(re.sub(r"<[^>]+>", " ", row).split())
        for name, row in re.findall(r'<th class="field-name"><a href="[^"]+">([^<]+)</a></th>(.*?)</tr>', page, re.S)
    }
    assert "Finished" in rows["feed-refresh"] and "Waiting" in rows["card-sweep"] and "never" in rows["nightly-report"]
    assert "None" not in page and "next due" in page.lower()
    assert re.search(r"Next due: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", detail) and "Last job: #" in detail


def test_no_placeholder_on_the_detail_of_a_schedule_that_never_ran(superuser, settings):
    with override_settings(DURQ={**settings.DURQ, "SCHEDULES": {"nightly": {"cron": "0 3 * * *", "job": "tests.noop"}}}):
        schedules.sync(schedules.schedules(now_ms()), now_ms())
        detail = text(superuser.get("/admin/django_durq/schedule/nightly/change/"))
    assert "None" not in detail and "never" in detail and not re.search(r"\b1[7-9]\d{11}\b", detail), "times, not epoch ms"


@pytest.mark.one_leg
@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_job_left_running_by_a_killed_worker_is_shown_orphaned(spawn_worker, superuser):
    sleeper = jobs.sleeper.enqueue(seconds=600)
    process = spawn_worker("--queue", "default:1")
    wait_until(lambda: Job.objects.get(pk=sleeper.pk).status == "running", 30, "the job to start")
    assert detail_state(superuser, sleeper.pk).startswith("Running on ")
    process.signal(signal.SIGKILL)
    process.wait(timeout=10)
    # A held presence lock is released with the process; a heartbeat row ages out in three intervals.
    wait_until(lambda: detail_state(superuser, sleeper.pk).startswith("Orphaned"), 40, "the job to be shown orphaned")
    assert Job.objects.get(pk=sleeper.pk).status == "running"
