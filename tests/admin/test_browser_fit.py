"""Every admin page of django-durq at 1366 × 768 in headless Chromium: it fits, it shows no placeholder, it tells the state.

A page fits when neither the page nor any box holding a table scrolls (or clips) sideways, when nothing is cut
off without its whole text one hover away, and when no date wraps past two lines. The workflow's
graph may scroll, inside its own box only. A placeholder is a value that stands for a missing one
(a 9999 date, ``None``, ``NaN``) or Django's "Select … to change" title.

Runs on the demo of ``tests/admin/demo.py``. With ``DURQ_SCREENSHOT_DIR`` set, it saves each page of
docs/admin.md at 1366 and 1920 pixels (``scripts/admin-screenshots`` puts them in docs/img).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_durq.models import Job
from tests.admin.demo import GONE, PAUSE_REASON, Demo, demo_settings, seed
from tests.admin.helpers import user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.one_leg]

WIDTH, HEIGHT = 1366, 768
WIDE = 1920
TALLEST = 1400  # px of a screenshot: the top of a long list is what the docs show
PLACEHOLDER = re.compile(r"9999-\d\d|\bNone\b|\bnull\b|\bundefined\b|\bNaN\b|1970-01-01|\[object |^Select .* to change")

# What the page measures of itself: sideways scrolling, text cut off with nothing to hover, dates
# wrapped past two lines. Each problem is one line naming the element.
MEASURE = """
const problems = [];
const name = (el) => {
  if (el.id) return '#' + el.id;
  const classes = typeof el.className === 'string' ? el.className.trim().split(/\\s+/).filter(Boolean) : [];
  return [el.tagName.toLowerCase(), ...classes].join('.');
};
const root = document.documentElement;
if (root.scrollWidth > root.clientWidth) {
  problems.push(`the page scrolls sideways: ${root.scrollWidth} px in ${root.clientWidth} px`);
}
const content = document.getElementById('content');
// A table's containers that scroll or clip (a box whose overflow is visible scrolls nothing).
for (const table of content.querySelectorAll('table')) {
  for (let box = table.parentElement; box && box !== content.parentElement; box = box.parentElement) {
    if (getComputedStyle(box).overflowX !== 'visible' && box.scrollWidth > box.clientWidth + 1) {
      problems.push(`${name(table)} needs ${box.scrollWidth} px in ${name(box)} of ${box.clientWidth} px`);
      break;
    }
  }
}
for (const el of content.querySelectorAll('*')) {
  if (el.closest('.durq-graph-scroll, pre, svg, select, option, input, textarea, .visually-hidden')) continue;
  const style = getComputedStyle(el);
  const cutX = style.overflowX !== 'visible' && el.scrollWidth > el.clientWidth + 1;
  const cutY = style.overflowY === 'hidden' && el.scrollHeight > el.clientHeight + 2;
  if ((cutX || cutY) && !el.closest('[title]')) {
    problems.push(`${name(el)} is cut off with no title: ${el.textContent.trim().slice(0, 60)}`);
  }
}
const walker = document.createTreeWalker(content, NodeFilter.SHOW_TEXT);
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  if (!/\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d/.test(node.textContent) || node.textContent.length > 40) continue;
  const range = document.createRange();
  range.selectNodeContents(node);
  const lines = new Set([...range.getClientRects()].map((rect) => Math.round(rect.top)));
  if (lines.size > 2) {
    problems.push(`"${node.textContent.trim()}" wraps onto ${lines.size} lines in ${name(node.parentElement)}`);
  }
}
const shown = [];
const texts = document.createTreeWalker(content, NodeFilter.SHOW_TEXT);
for (let node = texts.nextNode(); node; node = texts.nextNode()) {
  // A job's own text (its arguments, a traceback) is shown as it is: only the page's words are judged.
  if (!node.parentElement.closest('pre, code, .visually-hidden')) shown.push(node.textContent);
}
for (const el of content.querySelectorAll('[title]')) if (!el.closest('pre, code')) shown.push(el.title);
const titles = [...document.querySelectorAll('h1')].map((h) => h.innerText);
return {problems, shown, titles};
"""


@pytest.fixture
def demo() -> Iterator[Demo]:
    with override_settings(DURQ=demo_settings()):
        yield seed()


def set_width(shown, width: int, height: int = HEIGHT) -> None:
    """The viewport itself at this size (a window's size would include the browser's frame)."""
    metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
    shown.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)


def pages(demo: Demo) -> list[tuple[str, str, str]]:
    """(file name in docs/img or "", path, a selector that is there once the page is drawn), every page of the admin."""
    jobs = "/admin/django_durq/job/"
    dead = "/admin/django_durq/deadletter/"
    workflows = "/admin/django_durq/workflow/"
    return [
        ("", "/admin/django_durq/", "#content-main"),
        ("admin-jobs", jobs, "#result_list"),
        ("", f"{jobs}?status=running", "#result_list"),
        ("admin-job-orphaned", f"{jobs}{demo.orphaned}/change/", "#content-main"),
        ("", f"{jobs}{demo.held_by_queue[0]}/change/", "#content-main"),
        ("", f"{jobs}{demo.held_by_key}/change/", "#content-main"),
        ("", f"{jobs}{demo.blocked}/change/", "#content-main"),
        ("", f"{jobs}{demo.paused}/change/", "#content-main"),
        ("", f"{jobs}{demo.running}/change/", "#content-main"),
        ("admin-dead-letters", dead, "#result_list"),
        ("admin-dead-letter", f"{dead}{demo.long_error}/change/", ".durq-attempts"),
        ("", f"{dead}{demo.dead[0]}/purge/", "#durq-purge-question"),
        ("admin-queues", "/admin/django_durq/queue/", "#durq-queues"),
        ("admin-pause", "/admin/django_durq/queue/pause/?queue=default", "#content-main form"),
        ("admin-schedules", "/admin/django_durq/schedule/", "#result_list"),
        ("", "/admin/django_durq/schedule/feed-refresh/change/", "#content-main"),
        ("admin-workflows", workflows, "#durq-workflows"),
        ("admin-workflow", f"{workflows}{demo.workflow}/change/", "#durq-members"),
        ("", f"{workflows}{demo.failed_workflow}/change/", "#durq-members"),
    ]


def measure(shown, path: str, ready: str) -> dict[str, Any]:
    """What MEASURE finds on the page at ``path`` (the browser's get returns once the page has loaded)."""
    shown.open(path)
    if not shown.find(ready):
        return {"problems": [f"not shown ({shown.driver.title})"], "shown": [], "titles": []}
    return shown.driver.execute_script(MEASURE)


def screenshot(shown, name: str) -> None:
    """Save the page at both widths, as tall as it is up to TALLEST, when DURQ_SCREENSHOT_DIR is set."""
    folder = os.environ.get("DURQ_SCREENSHOT_DIR")
    if not folder or not name:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    try:
        for width in (WIDTH, WIDE):
            set_width(shown, width)
            tall = shown.driver.execute_script("return document.documentElement.scrollHeight")
            set_width(shown, width, min(max(tall, HEIGHT), TALLEST))
            shown.driver.save_screenshot(str(Path(folder) / f"{name}-{width}.png"))
    finally:
        set_width(shown, WIDTH)


def test_every_page_fits_1366_pixels_and_shows_no_placeholder(site, demo):
    user("operator", superuser=True)
    site.login("operator")
    set_width(site, WIDTH)
    problems = []
    for name, path, ready in pages(demo):
        seen = measure(site, path, ready)
        problems.extend(f"{path}: {problem}" for problem in seen["problems"])
        for text in [*seen["shown"], *seen["titles"]]:
            for line in text.splitlines():
                if PLACEHOLDER.search(line):
                    problems.append(f"{path}: a placeholder in {line.strip()[:100]!r}")
        screenshot(site, name)
    assert not problems, "\n".join(problems)


def row_of(shown, job_id: int) -> Any:
    [box] = shown.find(f'#result_list input[name="_selected_action"][value="{job_id}"]')
    return box.find_element("xpath", "./ancestor::tr")


def is_grey(shown, element: Any) -> bool:
    colour = shown.driver.execute_script("return getComputedStyle(arguments[0]).backgroundColor", element)
    red, green, blue = (int(part) for part in re.findall(r"\d+", colour)[:3])
    return max(red, green, blue) - min(red, green, blue) < 40


def test_each_state_is_shown_with_its_reason_on_the_lists_and_the_detail_pages(site, demo):
    user("operator", superuser=True)
    site.login("operator")
    set_width(site, WIDTH)
    expected = {
        demo.orphaned: ("Orphaned", GONE),
        demo.held_by_queue[0]: ("Held by a limit", "queue “video” runs 3 of at most 3"),
        demo.held_by_key: ("Held by a limit", "key “customer-7” runs 1 of at most 1"),
        demo.blocked: ("Blocked", "waiting for 3 upstream"),
        demo.paused: ("Paused", PAUSE_REASON),
        demo.running: ("Running", "27 / 40"),
    }
    site.open("/admin/django_durq/job/")
    site.wait_for("#result_list")
    for job_id, (label, reason) in expected.items():
        cell = row_of(site, job_id).find_element("css selector", "td.field-state")
        assert cell.find_element("css selector", ".durq-status").text == label, job_id
        assert reason in cell.text or reason in (cell.find_element("css selector", "[title]").get_attribute("title") or ""), (
            cell.text
        )
    for job_id, (label, reason) in expected.items():
        site.open(f"/admin/django_durq/job/{job_id}/change/")
        state = site.wait_for("div.field-state")
        assert state.find_element("css selector", ".durq-status").text == label and reason in state.text, state.text
    assert Job.objects.get(pk=demo.orphaned).status == "running", "a state shown, not a status written"

    site.open(f"/admin/django_durq/workflow/{demo.workflow}/change/")
    site.wait_for("#durq-members")
    member = site.find(f'#durq-members tr[data-job="{demo.blocked}"]')[0]
    assert "Blocked" in member.text and "waiting for 3 upstream" in member.text
    assert "9999" not in member.text

    site.open("/admin/django_durq/queue/")
    site.wait_for("#durq-queues")
    slow = site.find('#durq-queues tr[data-queue="slow"]')[0]
    assert "Paused" in slow.text and "ada" in slow.text and PAUSE_REASON in slow.text
    served = site.find('#durq-queues tr[data-queue="default"] td.durq-served')[0].text
    assert "web-1" in served and "web-2" in served and "web-3" not in served

    site.open("/admin/django_durq/schedule/")
    site.wait_for("#result_list")
    assert site.find("h1")[0].text == "Schedules"
    outcomes = {row.find_element("css selector", "th").text: row.text for row in site.find("#result_list tbody tr")}
    assert "Finished" in outcomes["feed-refresh"] and "Dead" in outcomes["card-sweep"] and "never" in outcomes["nightly-report"]


def test_the_buttons_that_act_look_like_buttons_and_the_last_error_is_readable(site, demo):
    user("operator", superuser=True)
    site.login("operator")
    set_width(site, WIDTH)
    site.open("/admin/django_durq/deadletter/")
    site.wait_for("#result_list")
    cell = row_of(site, demo.long_error).find_element("css selector", "td.field-last_error")
    assert cell.size["width"] >= 300, f"the last error gets {cell.size['width']} px"
    site.open(f"/admin/django_durq/deadletter/{demo.dead[0]}/change/")
    retry = site.wait_for("#durq-retry")
    assert not is_grey(site, retry) and retry.value_of_css_property("cursor") == "pointer"
    site.open(f"/admin/django_durq/workflow/{demo.failed_workflow}/change/")
    retry = site.wait_for("#durq-retry-workflow")
    assert not is_grey(site, retry) and retry.value_of_css_property("cursor") == "pointer"
