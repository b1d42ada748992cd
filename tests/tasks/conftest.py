"""Fixtures of the tasks-backend tests: a manual clock, and finished jobs kept so results can be read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_durq.clock import ManualClock, use_clock


@pytest.fixture
def clock() -> Iterator[ManualClock]:
    manual = ManualClock(start_ms=1_800_000_000_000)
    with use_clock(manual):
        yield manual


@pytest.fixture
def keep_results(settings: Any) -> None:
    settings.DURQ = {**settings.DURQ, "KEEP_FINISHED": 3600}
