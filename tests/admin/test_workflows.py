"""The admin's Workflows pages through Django's test client on the real database: list, graph, Cancel, Retry."""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.urls import path

from django_durq import Workflow
from django_durq.admin import workflow_graph
from django_durq.admin import workflows as workflow_admin
from django_durq.admin.workflow_graph import NODE_W, depths
from django_durq.clock import ManualClock, use_clock
from django_durq.models import Job
from django_durq.testing import drain
from tests.admin.helpers import SCRIPT, messages_of, staff, text
from tests.ledger import jobs

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.admin.test_workflows")]

urlpatterns = [path("admin/", admin.site.urls)]

LIST = "/admin/django_durq/workflow/"
START = 1_800_000_000_000


def page(workflow_id: int, action: str = "change") -> str:
    return f"{LIST}{workflow_id}/{action}/"


def media(name: str = "video 42", fail_scan: bool = False) -> tuple[Workflow, dict]:
    flow = Workflow(name)
    scan = flow.add(jobs.step, tag="scan", fail=fail_scan)
    encodes = [flow.add(jobs.step, tag=p, after=[scan]) for p in ("1080p", "720p", "480p")]
    publish = flow.add(jobs.summary, after=encodes)
    flow.enqueue()
    return flow, {"scan": scan, "encodes": encodes, "publish": publish}


def nodes(response) -> dict[int, dict[str, str]]:
    """Each drawn job: its status and the position of its box."""
    box = (
        r'<a href="[^"]+" class="durq-node[^"]*" data-job="(\d+)" data-status="(\w+)">'
        r'\s*<title>[^<]*</title>\s*<rect x="(\d+)" y="(\d+)"'
    )
    return {
        int(pk): {"status": status, "x": int(x), "y": int(y)} for pk, status, x, y in re.findall(box, response.content.decode())
    }


def test_the_list_shows_each_workflow_with_its_state_and_counts(superuser):
    clock = ManualClock(START)
    with use_clock(clock):
        failed, _ = media("failed", fail_scan=True)
        drain(clock=clock)
    running, _ = media(SCRIPT)
    response = superuser.get(LIST)
    assert response.status_code == 200
    page_text = text(response)
    assert "&lt;script&gt;" in response.content.decode() and SCRIPT not in response.content.decode()
    rows = re.findall(r'<tr data-workflow="(\d+)">.*?class="durq-status durq-wf-(\w+)"', response.content.decode(), re.S)
    assert rows == [(str(running.row.pk), "running"), (str(failed.row.pk), "failed")]
    assert "0 · 0 · 0 · 1 · 4" in re.sub(r"<[^>]+>", "", page_text)  # the failed one: 1 dead, 4 cancelled with it
    assert "Waiting · blocked · running · finished · dead · cancelled" in page_text, "each count named in the header"
    assert f'href="{page(running.row.pk)}"' in response.content.decode()


def test_the_list_pages_back_through_older_workflows(superuser, monkeypatch):
    monkeypatch.setattr(workflow_admin, "PAGE_SIZE", 2)
    ids = [media(f"w{n}")[0].row.pk for n in range(3)]
    first = superuser.get(LIST).content.decode()
    assert re.findall(r'<tr data-workflow="(\d+)"', first) == [str(ids[2]), str(ids[1])]
    older = re.search(r'href="\?before=(\d+)" id="durq-older"', first).group(1)
    second = superuser.get(f"{LIST}?before={older}").content.decode()
    assert re.findall(r'<tr data-workflow="(\d+)"', second) == [str(ids[0])] and "durq-older" not in second


def test_the_graph_puts_each_job_right_of_what_it_waits_for_and_colours_it_by_state(superuser):
    clock = ManualClock(START)
    with use_clock(clock):
        flow, steps = media()
        drain(clock=clock, max_jobs=1)  # the scan finished; the transcodes are due
    response = superuser.get(page(flow.row.pk))
    assert response.status_code == 200
    drawn = nodes(response)
    scan, publish = steps["scan"].job.pk, steps["publish"].job.pk
    encodes = [step.job.pk for step in steps["encodes"]]
    assert drawn[scan]["status"] == "finished" and drawn[publish]["status"] == "blocked"
    assert {drawn[pk]["x"] for pk in encodes} == {drawn[scan]["x"] + NODE_W + 64}
    assert drawn[publish]["x"] > drawn[encodes[0]]["x"]
    assert len({drawn[pk]["y"] for pk in encodes}) == 3
    assert drawn[publish]["y"] == drawn[encodes[1]]["y"]  # the fan-in sits level with the middle of its fan-out
    html = response.content.decode()
    assert html.count('class="durq-edge durq-edge-counted"') == 3 and html.count("durq-edge-waiting") == 3
    assert "<script" not in html.split('id="durq-graph"')[1].split("</svg>")[0]
    members = re.findall(r'<tr data-job="(\d+)"', html)
    assert [int(pk) for pk in members] == [scan, *encodes, publish]
    assert f"#{scan}, #{encodes[0]}" not in html and "(3 left)" in text(response)
    assert 'id="durq-cancel-workflow"' in html and 'id="durq-retry-workflow"' not in html


def test_a_job_page_links_to_its_workflow(superuser):
    flow, steps = media()
    response = superuser.get(f"/admin/django_durq/job/{steps['publish'].job.pk}/change/")
    assert f'<a href="{page(flow.row.pk)}" id="durq-workflow-link">workflow #{flow.row.pk}</a> · waits for 3 more jobs' in (
        response.content.decode()
    )
    plain = jobs.step.enqueue(tag="alone")
    assert "durq-workflow-link" not in superuser.get(f"/admin/django_durq/job/{plain.pk}/change/").content.decode()


def test_cancel_and_then_retry_the_workflow_from_its_page(superuser):
    flow, steps = media()
    response = superuser.post(page(flow.row.pk, "cancel"), follow=True)
    assert messages_of(response) == ["Cancelled 5 waiting jobs."]
    assert set(Job.objects.filter(workflow_id=flow.row.pk).values_list("status", flat=True)) == {"cancelled"}
    html = response.content.decode()
    assert 'id="durq-workflow-state">cancelled<' in html and 'id="durq-cancel-workflow"' not in html
    response = superuser.post(page(flow.row.pk, "retry"), follow=True)
    assert messages_of(response) == ["Retried 5 jobs: due now."]
    assert Job.objects.get(pk=steps["publish"].job.pk).deps_left == 3
    response = superuser.post(page(flow.row.pk, "cancel"), follow=True)
    assert messages_of(response)[0] == "Cancelled 5 waiting jobs."


def test_cancelling_a_workflow_with_nothing_left_says_so(superuser):
    clock = ManualClock(START)
    with use_clock(clock):
        flow, _ = media()
        drain(clock=clock)
    response = superuser.post(page(flow.row.pk, "cancel"), follow=True)
    assert messages_of(response) == ["Nothing to cancel: no job of this workflow is waiting or running."]


def test_actions_need_post_the_change_permission_and_the_csrf_token(superuser):
    flow, _ = media()
    assert superuser.get(page(flow.row.pk, "cancel")).status_code == 405
    viewer = staff("viewer", "view_workflow", "view_job")
    response = viewer.get(page(flow.row.pk))
    assert response.status_code == 200 and "durq-cancel-workflow" not in response.content.decode()
    assert viewer.post(page(flow.row.pk, "cancel")).status_code == 403
    assert staff("nobody").get(LIST).status_code == 403
    staff("changer", "view_workflow", "change_workflow")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="changer"))
    assert strict.post(page(flow.row.pk, "cancel")).status_code == 403
    assert Job.objects.filter(workflow_id=flow.row.pk).active().count() == 5


def test_unknown_and_malformed_ids_are_not_found_and_a_nul_byte_is_refused(superuser):
    assert superuser.get(page(987654)).status_code == 404
    assert superuser.get(page("²")).status_code == 404  # type: ignore[arg-type]
    assert superuser.post(page(987654, "retry")).status_code == 404
    assert superuser.get(f"{LIST}?before=%00").status_code == 400
    assert superuser.get(f"{LIST}?before=abc").status_code == 200


def test_depth_is_the_longest_path_from_a_root_and_a_cycle_does_not_hang():
    # 1 → 2 → 3, and 1 → 3 directly: 3 is drawn after 2, not beside it.
    assert depths([1, 2, 3], [(2, 1), (3, 2), (3, 1)]) == {1: 0, 2: 1, 3: 2}
    assert depths([1, 2, 3], [(2, 3), (3, 2)]) == {1: 0, 2: 1, 3: 1}


def test_a_workflow_too_big_to_draw_is_listed_without_a_graph(superuser, monkeypatch):
    monkeypatch.setattr(workflow_graph, "MAX_NODES", 4)
    flow, _ = media()
    html = superuser.get(page(flow.row.pk)).content.decode()
    assert "5 jobs: too many to draw (at most 4)" in html and 'id="durq-graph"' not in html
    assert len(re.findall(r'<tr data-job="\d+"', html)) == 5
