"""The Schedules admin page and ``manage.py durq schedules``."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_durq import schedules
from django_durq.clock import now_ms
from django_durq.models import Job, Schedule
from tests.admin.helpers import staff

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.admin.test_admin")]

NIGHTLY = {"nightly": {"cron": "0 3 * * *", "job": "tests.effect", "kwargs": {"tag": "cron"}}}


@pytest.fixture
def declared(settings):
    with override_settings(DURQ={**settings.DURQ, "SCHEDULES": NIGHTLY}):
        schedules.sync(schedules.schedules(now_ms()), now_ms())
        yield


def test_schedules_page_lists_last_and_next_run(declared, superuser):
    page = superuser.get("/admin/django_durq/schedule/").content.decode()
    assert "nightly" in page and "0 3 * * *" in page and "tests.effect" in page and "never" in page


def test_run_now_queues_one_run_and_leaves_due_times_alone(declared, superuser):
    before = Schedule.objects.get(name="nightly").next_due_ms
    response = superuser.post("/admin/django_durq/schedule/", {"action": "run_now", "_selected_action": ["nightly"]}, follow=True)
    assert "Queued 1 run: nightly" in response.content.decode()
    job = Job.objects.get()
    assert job.name == "tests.effect" and job.kwargs == {"tag": "cron"}
    assert Schedule.objects.get(name="nightly").next_due_ms == before


def test_run_now_needs_the_change_permission(declared):
    viewer = staff("viewer", "view_schedule")
    response = viewer.post("/admin/django_durq/schedule/", {"action": "run_now", "_selected_action": ["nightly"]})
    assert response.status_code in (200, 302)
    assert Job.objects.count() == 0


def test_durq_schedules_command_prints_the_table(declared, capsys):
    call_command("durq", "schedules")
    out = capsys.readouterr().out
    assert "NEXT DUE" in out and "nightly" in out and "tests.effect" in out
