"""The Workflows pages in headless Chromium: the graph as drawn, and Cancel clicked on a running workflow.

The browser is the session's (``tests/admin/conftest.py``), the helpers those of ``tests/admin/helpers.py``.
"""

from __future__ import annotations

import pytest

from django_durq import Workflow
from django_durq.clock import ManualClock, now_ms, use_clock
from django_durq.models import Job
from django_durq.testing import drain
from tests.admin.helpers import user
from tests.ledger import jobs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_workflow_page_draws_the_graph_and_cancels_the_workflow(site):
    user("operator", superuser=True)
    flow = Workflow("publish video 42")
    scan = flow.add(jobs.step, tag="scan")
    encodes = [flow.add(jobs.step, tag=p, after=[scan]) for p in ("1080p", "720p", "480p")]
    publish = flow.add(jobs.summary, after=encodes)
    flow.enqueue()
    clock = ManualClock(now_ms())
    with use_clock(clock):
        drain(clock=clock, max_jobs=1)  # the scan finished; the transcodes are due

    site.login("operator")
    site.click_link("Workflows")
    site.wait_for("#durq-workflows")
    site.click_link("publish video 42")
    graph = site.wait_for("svg#durq-graph")
    assert graph.size["width"] > 700 and graph.size["height"] > 200  # drawn, not collapsed
    boxes = {int(node.get_attribute("data-job")): node for node in site.find("svg#durq-graph a.durq-node")}
    assert sorted(boxes) == sorted(step.job.pk for step in [scan, *encodes, publish])
    left = {pk: box.find_elements("css selector", "rect")[0].rect["x"] for pk, box in boxes.items()}
    assert left[scan.job.pk] < left[encodes[0].job.pk] == left[encodes[2].job.pk] < left[publish.job.pk]
    fill = site.driver.execute_script(
        "return getComputedStyle(arguments[0]).fill", boxes[scan.job.pk].find_elements("css selector", "rect")[0]
    )
    assert fill == "rgb(223, 240, 216)"  # finished: green
    assert len(site.find("svg#durq-graph path.durq-edge")) == 6
    assert "#" + str(publish.job.pk) in boxes[publish.job.pk].text and "0/5 attempts" in boxes[publish.job.pk].text

    site.find("#durq-cancel-workflow")[0].click()
    site.wait_for("ul.messagelist")
    assert site.messages() == ["Cancelled 4 waiting jobs."]
    assert site.find("#durq-workflow-state")[0].text == "cancelled"
    assert {node.get_attribute("data-status") for node in site.find("svg#durq-graph a.durq-node")} == {"finished", "cancelled"}
    assert set(Job.objects.filter(workflow_id=flow.row.pk).values_list("status", flat=True)) == {"finished", "cancelled"}
    assert site.find("#durq-retry-workflow") and not site.find("#durq-cancel-workflow")
