"""``manage.py durq workflows`` and ``durq workflow ID`` against the real database, and bad input as a user meets it."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError

from django_durq import Workflow
from django_durq.clock import ManualClock, use_clock
from django_durq.testing import drain
from tests.ledger import jobs
from tests.management.test_durq import NOW, durq, refused

pytestmark = pytest.mark.django_db


def media(name: str = "video 42", fail_scan: bool = False) -> tuple[Workflow, dict]:
    flow = Workflow(name)
    scan = flow.add(jobs.step, tag="scan", fail=fail_scan)
    encodes = [flow.add(jobs.step, tag=p, after=[scan]) for p in ("1080p", "720p", "480p")]
    publish = flow.add(jobs.summary, after=encodes)
    flow.enqueue()
    return flow, {"scan": scan, "encodes": encodes, "publish": publish}


def test_workflows_lists_states_and_counts_as_a_table_and_as_json():
    clock = ManualClock(NOW)
    with use_clock(clock):
        failed, _ = media("failed", fail_scan=True)
        drain(clock=clock)
        running, _ = media("running")
    out, _ = durq("workflows")
    lines = out.splitlines()
    header = ["ID", "NAME", "STATE", "JOBS", "WAITING", "BLOCKED", "RUNNING", "FINISHED", "DEAD", "CANCELLED"]
    assert lines[0].split()[:10] == header
    assert lines[1].split()[:10] == [str(running.row.pk), "running", "running", "5", "1", "4", "0", "0", "0", "0"]
    assert lines[2].split()[:10] == [str(failed.row.pk), "failed", "failed", "5", "0", "0", "0", "0", "1", "4"]
    data = json.loads(durq("workflows", "--json", "--limit", "1")[0])
    assert [(row["id"], row["state"], row["jobs"]) for row in data] == [(running.row.pk, "running", 5)]
    assert data[0]["counts"]["waiting"] == 1 and data[0]["counts"]["blocked"] == 4
    assert data[0]["created_at"].startswith("2027-01-15")


def test_no_workflows_says_so():
    assert "No workflows." in durq("workflows")[0]


def test_workflow_shows_members_what_they_wait_for_and_the_edges():
    clock = ManualClock(NOW)
    with use_clock(clock):
        flow, steps = media()
        drain(clock=clock, max_jobs=1)
    out, _ = durq("workflow", str(flow.row.pk))
    lines = out.splitlines()
    assert lines[0] == f"Workflow {flow.row.pk} (video 42): running, 5 jobs (3 waiting, 1 blocked, 1 finished)"
    scan, publish = steps["scan"].job.pk, steps["publish"].job.pk
    encodes = [step.job.pk for step in steps["encodes"]]
    rows = {line.split()[0]: line for line in lines[4:]}
    assert rows[str(scan)].split()[:5] == [str(scan), "tests.step", "finished", "-", "1/5"] and '"scan"' in rows[str(scan)]
    assert "blocked (waiting for 3 upstream)" in rows[str(publish)]
    assert f"{', '.join(map(str, encodes))} (3 left)" in rows[str(publish)]
    data = json.loads(durq("workflow", str(flow.row.pk), "--json")[0])
    assert data["state"] == "running" and [job["id"] for job in data["jobs"]] == [scan, *encodes, publish]
    assert data["jobs"][0]["result"] == "scan" and data["jobs"][-1]["deps_left"] == 3
    assert {"job": encodes[0], "waits_for": scan, "counted": True} in data["edges"]
    assert {"job": publish, "waits_for": encodes[0], "counted": False} in data["edges"]


def test_bad_ids_are_refused_and_a_missing_workflow_exits_1():
    error = refused("workflow", "424242")
    assert error.returncode == 1 and "no workflow 424242: it never existed" in str(error)
    for bad in ("0", "x", "²"):
        assert refused("workflow", bad).returncode == 2
    assert "is not a workflow id" in str(refused("workflow", "x"))
    assert refused("workflows", "--limit", "0").returncode == 2
    with pytest.raises(CommandError, match="at most 1000"):
        durq("workflows", "--limit", "1001")
