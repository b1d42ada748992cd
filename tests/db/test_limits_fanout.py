"""A per-key limit meets a workflow's fan-out (docs/flow-control.md and docs/workflows.md say so):
``Limit(max_running=1, key=video_id)`` lets one of a video's three transcodes run at a time, and
a key that names the rendition lets the three run at once while two of one rendition never do."""

from __future__ import annotations

import pytest
from django.db import connection

from django_durq import Limit, Workflow, job
from django_durq.clock import ManualClock, use_clock
from django_durq.db import dialect_for
from django_durq.db.flow import claim_limited
from django_durq.handlers.limits import QueueLimits
from django_durq.handlers.registry import registry

pytestmark = pytest.mark.django_db

QUALITIES = ("1080p", "720p", "480p")


@pytest.fixture
def clock():
    manual = ManualClock(start_ms=1_800_000_000_000)
    with use_clock(manual):
        yield manual


def fan_out(limit: Limit) -> list[int]:
    """A video's three transcodes, queued as one workflow's fan-out; returns how many start at once."""
    definition = job(name="tests.fanout.transcode", queue="video", limit=limit)(lambda ctx, video_id, quality: None)
    try:
        flow = Workflow("video 7")
        for quality in QUALITIES:
            flow.add(definition, video_id=7, quality=quality)
        flow.enqueue()
        claimed = claim_limited(dialect_for(connection), "video", 10, 1_800_000_000_000, "w1", QueueLimits())
        return [job.id for job in claimed]
    finally:
        registry.remove(definition.name)


def test_a_limit_keyed_on_the_video_runs_its_transcodes_one_at_a_time(clock):
    assert len(fan_out(Limit(max_running=1, key=lambda video_id, **_: video_id))) == 1


def test_a_limit_keyed_on_the_rendition_runs_them_together(clock):
    assert len(fan_out(Limit(max_running=1, key=lambda video_id, quality, **_: f"{video_id}:{quality}"))) == 3
