"""The admin in headless Chromium: dead letters (retry, purge), the Queues page (pause, resume), permissions, escaping.

Uses Debian's ``chromium`` and ``chromium-driver`` through Selenium; one browser for the session.
The screenshots in the docs are made by ``tests/admin/test_browser_fit.py``.
"""

from __future__ import annotations

import json
import random
import re

import pytest

from django_durq import ops
from django_durq.clock import ManualClock, now_ms, use_clock
from django_durq.models import Job, QueueStat, WorkerProcess
from django_durq.testing import drain
from tests.admin.helpers import SCRIPT, Site, user
from tests.ledger import jobs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def dead_letters() -> list[Job]:
    """Real dead letters: handlers that fail every attempt, run through their retries."""
    clock = ManualClock(now_ms() - 600_000)
    with use_clock(clock):
        queued = [
            jobs.encode_video.enqueue(video_id=8812, preset="4k"),
            jobs.charge_card.enqueue(invoice_id="INV-2041", amount_cents=129_00),
            jobs.send_receipt.enqueue(order_id=5531, to="ada@example"),
            jobs.charge_card.enqueue(invoice_id="INV-2042", amount_cents=49_00),
            jobs.encode_video.enqueue(video_id=8815),
        ]
        for _ in range(3):
            clock.advance(30_000)
            drain(clock=clock)
    dead = list(Job.objects.filter(pk__in=[job.pk for job in queued], status="dead").order_by("pk"))
    assert len(dead) == len(queued)
    return dead


def test_dead_letters_retry_and_purge(site):
    user("operator", superuser=True)
    letters = dead_letters()
    site.login("operator")
    site.click_link("Dead letters")
    site.wait_for("#result_list")
    assert sorted(site.listed_ids()) == [job.pk for job in letters]
    table = site.find("#result_list")[0].text
    assert "RuntimeError: ffmpeg exited with status 1" in table and "3 of 3" in table

    retried, purged = letters[0], letters[1]
    site.run_action("retry_selected", [retried.pk])
    site.wait_for("ul.messagelist")
    assert site.messages() == ["Retried 1 job: due now."]
    assert retried.pk not in site.listed_ids()
    assert Job.objects.get(pk=retried.pk).status == "waiting"

    site.run_action("purge_selected", [purged.pk])
    question = site.wait_for("#durq-purge-question")
    assert "1 dead letter will be deleted for good" in question.text
    assert Job.objects.filter(pk=purged.pk).exists()
    site.find("#durq-confirm-purge")[0].click()
    site.wait_for("ul.messagelist")
    assert site.messages() == ["Purged 1 dead letter."]
    assert purged.pk not in site.listed_ids() and not Job.objects.filter(pk=purged.pk).exists()

    # From a job's own page: its errors, then the Retry button.
    single = letters[2]
    site.open(f"/admin/django_durq/deadletter/{single.pk}/change/")
    site.wait_for(".durq-attempts")
    assert len(site.find(".durq-attempt")) == 3 and "invalid recipient address 'ada@example'" in site.driver.page_source
    site.find("#durq-retry")[0].click()
    site.wait_for("ul.messagelist")
    assert site.messages() == ["Retried 1 job: due now."] and single.pk not in site.listed_ids()


def test_a_script_payload_is_shown_as_text(site):
    user("operator", superuser=True)
    clock = ManualClock(now_ms())
    with use_clock(clock):
        job = jobs.send_receipt.enqueue(order_id=1, to=SCRIPT)
        for _ in range(3):
            clock.advance(30_000)
            drain(clock=clock)
    site.login("operator")
    for path in ("/admin/django_durq/deadletter/", f"/admin/django_durq/job/{job.pk}/change/"):
        site.open(path)
        site.wait_for("#content")
        assert SCRIPT in site.find("#content")[0].text, "the payload is visible as text"
        assert site.no_alert()
        assert not site.driver.execute_script("return [...document.scripts].some(s => s.text.includes('alert(1)'))")


LIVE_SLOW = "web-2:4102:a1b2c2"  # the worker below that serves "slow", holding its running job


def test_queues_page_shows_counts_workers_and_the_chart(site):
    user("operator", superuser=True)
    now = now_ms()
    minute = now // 60_000 * 60_000
    rng = random.Random(4)
    QueueStat.objects.bulk_create(
        [
            QueueStat(
                queue=queue,
                minute_ms=minute - i * 60_000,
                finished=rng.randint(18, 42) * scale + (25 if 20 <= i <= 26 else 0),
                failed=rng.choice([0, 0, 0, 1, 2]) + (9 if 20 <= i <= 23 and queue == "default" else 0),
            )
            for queue, scale in (("default", 1), ("fast", 2))
            for i in range(60)
        ]
        # The next minute too: if a minute ends while the page loads, the chart's hour moves on
        # by one and still has sixty minutes with jobs in it.
        + [QueueStat(queue=queue, minute_ms=minute + 60_000, finished=1, failed=0) for queue in ("default", "fast")]
    )
    dead_letters()  # first: drain() would run the waiting jobs below too
    base = {"arguments": json.dumps({"args": [], "kwargs": {}}), "created_ms": now - 300_000, "lease_ms": 60_000}
    Job.objects.bulk_create(
        [Job(name="billing.charge_card", queue="default", run_at_ms=now - 1_000 * i, **base) for i in range(1, 13)]
        + [Job(name="video.encode", queue="slow", run_at_ms=now - 95_000, **base)]
        + [Job(name="email.send_receipt", queue="fast", run_at_ms=now + 3_600_000, **base) for _ in range(4)]
        + [Job(name="video.encode", queue="slow", status="running", run_at_ms=now - 200_000, claimed_by=LIVE_SLOW, **base)]
    )
    for number, queues in ((1, {"default": 4, "fast": 2}), (2, {"default": 4, "slow": 1})):
        WorkerProcess.objects.create(
            worker_id=f"web-{number}:{4100 + number}:a1b2c{number}",
            host=f"web-{number}",
            pid=4100 + number,
            queues=json.dumps(queues),
            started_ms=now - 3 * 3_600_000,
            last_seen_ms=now - 2_000,
            jobs_done=18_000 + 611 * number,
        )
    site.login("operator")
    site.click_link("Queues")
    site.wait_for("#durq-queues")
    rows = {row.get_attribute("data-queue"): row.text for row in site.find("#durq-queues tbody tr")}
    assert set(rows) >= {"default", "fast", "slow"}
    # Queue, state, waiting, delayed, blocked, running, dead.
    assert rows["default"].split()[:7] == ["default", "Active", "12", "0", "0", "0", "2"]
    assert rows["slow"].split()[:7] == ["slow", "Active", "1", "0", "0", "1", "2"]
    assert len(site.find("#durq-throughput rect.durq-finished")) == 60
    assert len(site.find("#durq-throughput rect.durq-failed")) > 0
    stats = {row.queue: row for row in ops.stats()}
    total = sum(row.finished_last_hour for row in stats.values())
    assert abs(int(site.find("#durq-finished-total")[0].text) - total) <= 200  # the hour window moves on
    assert "web-1:4101:a1b2c1" in site.find("#durq-workers")[0].text


def test_without_permission_there_is_nothing_to_act_with(site):
    user("viewer", "view_job", "view_deadletter")
    [job, *_] = dead_letters()
    site.login("viewer")
    assert not site.find('a[href$="/django_durq/queue/"]'), "no Queues link without its view permission"
    site.click_link("Dead letters")
    site.wait_for("#result_list")
    assert not site.find('select[name="action"]') and not site.find('input[name="_selected_action"]')
    site.open(f"/admin/django_durq/deadletter/{job.pk}/change/")
    site.wait_for(".durq-attempts")
    assert not site.find("#durq-retry") and not site.find("#durq-purge")
    site.open(f"/admin/django_durq/deadletter/{job.pk}/purge/")
    assert "403" in site.driver.title or "Forbidden" in site.driver.page_source
    site.open("/admin/django_durq/queue/")
    assert "403" in site.driver.title or "Forbidden" in site.driver.page_source
    assert Job.objects.get(pk=job.pk).status == "dead"


def breadcrumbs_markup(site: Site) -> str:
    """The breadcrumbs as the browser parsed them, whitespace between tags dropped."""
    html = site.driver.execute_script("return document.querySelector('nav[aria-label=Breadcrumbs]').innerHTML")
    return re.sub(r">\s+<", "><", re.sub(r"\s+", " ", html)).strip()


def test_breadcrumbs_are_drawn_like_the_admins_own(site):
    account = user("operator", superuser=True)
    [job, *_] = dead_letters()
    site.login("operator")
    site.open("/admin/django_durq/job/")
    site.wait_for("#result_list")
    stock_list = breadcrumbs_markup(site)
    site.open("/admin/django_durq/queue/")
    site.wait_for("#durq-queues")
    assert breadcrumbs_markup(site) == stock_list.replace("Jobs", "Queues")

    site.open(f"/admin/django_durq/deadletter/{job.pk}/history/")
    site.wait_for("#change-history")
    stock_history = breadcrumbs_markup(site)
    site.open(f"/admin/django_durq/deadletter/{job.pk}/purge/")
    site.wait_for("#durq-purge-question")
    assert breadcrumbs_markup(site) == stock_history.replace("History", "Purge")

    site.open("/admin/auth/user/")
    site.run_action("delete_selected", [account.pk])
    # The confirmation page's own field: the list being left has a form in #content as well.
    site.wait_for('input[name="post"]')
    stock_delete = breadcrumbs_markup(site)
    site.open("/admin/django_durq/deadletter/")
    site.wait_for("#result_list")
    site.run_action("purge_selected", [job.pk])
    site.wait_for("#durq-purge-question")
    for stock, own in [
        ("/admin/auth/user/", "/admin/django_durq/deadletter/"),
        ("/admin/auth/", "/admin/django_durq/"),
        ("Users", "Dead letters"),
        ("Authentication and Authorization", str(Job._meta.app_config.verbose_name)),
        ("Delete multiple objects", "Purge"),
    ]:
        stock_delete = stock_delete.replace(stock, own)
    assert breadcrumbs_markup(site) == stock_delete
    # The admin's own stylesheet lays them out: one line, the same height as on the stock page.
    crumbs = site.find("nav[aria-label=Breadcrumbs] .breadcrumbs")[0]
    assert crumbs.size["height"] < 60


def test_a_long_last_error_stays_readable_at_1280_pixels(site):
    user("operator", superuser=True)
    token = "https://storage.example/" + "a1b2c3d4" * 40
    message = f"upload to {token} failed: " + "the server answered 503 " * 20
    clock = ManualClock(now_ms())
    with use_clock(clock):
        job = jobs.fail.enqueue(message=message)
        for _ in range(3):
            clock.advance(120_000)
            drain(clock=clock)
    site.driver.set_window_size(1280, 860)
    site.login("operator")
    site.open("/admin/django_durq/deadletter/")
    site.wait_for("#result_list")
    cell = site.find("#result_list td.field-last_error")[0]
    page_width = site.driver.execute_script("return document.documentElement.clientWidth")
    assert site.driver.execute_script("return document.documentElement.scrollWidth") <= page_width, "no sideways scrolling"
    assert cell.size["width"] <= 0.5 * page_width, "the column leaves room for the others"
    assert cell.size["height"] <= 80, "a few lines at most"
    assert site.driver.execute_script("return arguments[0].scrollWidth <= arguments[0].clientWidth", cell), "nothing spills out"
    assert cell.text.startswith("ValueError: upload to https://storage.example/")
    title = site.find("#result_list td.field-last_error [title]")[0].get_attribute("title")
    assert title == f"ValueError: {message}", "the whole message is one hover away"
    assert Job.objects.get(pk=job.pk).status == "dead"


def test_a_queue_no_live_worker_serves_is_flagged_at_the_top_of_the_queues_page(site):
    user("operator", superuser=True)
    now = now_ms()
    WorkerProcess.objects.create(
        worker_id="web-1:1:a", host="web-1", pid=1, queues='{"default": 2}', started_ms=now, last_seen_ms=now
    )
    base = {"name": "video.encode", "arguments": json.dumps({"args": [], "kwargs": {}}), "created_ms": now, "lease_ms": 60_000}
    Job.objects.bulk_create([Job(queue="video", run_at_ms=now - 5_000, **base) for _ in range(3)])
    site.login("operator")
    site.open("/admin/django_durq/queue/")
    warning = site.wait_for("#durq-unserved li.warning")
    assert warning.is_displayed() and warning.location["y"] < site.find("#durq-queues")[0].location["y"]
    assert (
        warning.text == "3 jobs are due in queue “video”, and no live worker serves it: they wait until a worker runs that queue."
    )


def test_a_queue_is_paused_and_resumed_from_the_queues_page(site):
    user("operator", superuser=True)
    user("viewer", "view_queue")
    now = now_ms()
    base = {
        "name": "email.send_receipt",
        "arguments": json.dumps({"args": [], "kwargs": {}}),
        "created_ms": now,
        "lease_ms": 60_000,
    }
    Job.objects.bulk_create([Job(queue="fast", run_at_ms=now - 5_000, **base) for _ in range(2)])
    site.login("operator")
    site.open("/admin/django_durq/queue/")
    site.wait_for("#durq-queues")
    site.find('tr[data-queue="fast"] a.durq-pause')[0].click()
    # A confirmation first: what a pause does, and a reason, which is required.
    site.wait_for("#durq-switch-form")
    assert site.find("h1")[0].text == "Pause queue “fast”?"
    assert "2 due jobs wait" in site.find("#content-main")[0].text
    site.find("#durq-confirm-switch")[0].click()
    assert site.find("#durq-switch-form") and ops.paused_queues() == {}, "the browser asks for the reason first"
    site.find('textarea[name="reason"]')[0].send_keys("payment provider outage")
    site.find("#durq-confirm-switch")[0].click()
    # The page before the click already holds a message list: the unserved-queue warning.
    site.wait_for("ul.messagelist:not(#durq-unserved)")
    assert site.messages() == ["Paused queue “fast”: workers start none of its jobs until it is resumed; running jobs finish."]
    row = site.find('tr[data-queue="fast"]')[0]
    assert row.text.split()[:2] == ["fast", "Paused"]
    assert "by operator" in row.text and "payment provider outage" in row.text
    assert site.find('tr[data-queue="default"] a.durq-pause'), "the other queues stay as they were"
    assert set(ops.paused_queues()) == {"fast"}
    assert not site.find("#durq-unserved"), "a paused queue's due jobs are not reported as unserved"

    site.login("viewer")
    site.open("/admin/django_durq/queue/")
    site.wait_for("#durq-queues")
    assert "Paused" in site.find('tr[data-queue="fast"]')[0].text
    assert not site.find(".durq-pause") and not site.find(".durq-resume"), "viewing is not pausing"

    site.login("operator")
    site.open("/admin/django_durq/queue/")
    site.wait_for("#durq-queues")
    site.find('tr[data-queue="fast"] a.durq-resume')[0].click()
    site.wait_for("#durq-switch-form")
    assert "payment provider outage" in site.find("#content-main")[0].text, "the pause's reason, before it is undone"
    site.find('textarea[name="reason"]')[0].send_keys("provider is back")
    site.find("#durq-confirm-switch")[0].click()
    site.wait_for("ul.messagelist:not(#durq-unserved)")
    assert site.find("ul.messagelist:not(#durq-unserved) li")[0].text == "Resumed queue “fast”: its due jobs start now."
    row = site.find('tr[data-queue="fast"]')[0]
    assert row.text.split()[:2] == ["fast", "Active"] and "resumed by operator" in row.text
    assert "2 jobs are due in queue “fast”" in site.find("#durq-unserved")[0].text, "resumed, they wait for a worker again"
    assert ops.paused_queues() == {}
