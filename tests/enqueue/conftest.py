"""Fixtures of the enqueue tests: a manual clock from ``helpers.START``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_durq.clock import ManualClock, use_clock
from tests.enqueue.helpers import START


@pytest.fixture
def clock() -> Iterator[ManualClock]:
    manual = ManualClock(start_ms=START)
    with use_clock(manual):
        yield manual
