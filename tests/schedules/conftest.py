"""Fixtures of the schedule tests: schedules declared for one test, and a manual clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_durq.clock import ManualClock, use_clock
from tests.schedules.helpers import at


@pytest.fixture
def declare() -> Iterator[Callable[..., Any]]:
    """Declare schedules with ``django_durq.schedule`` for one test only."""
    from django_durq import schedule, schedules

    names: list[str] = []

    def add(name: str, cron: str | None = None, job: str = "tests.noop", **options: Any) -> Any:
        names.append(name)
        return schedule(name, cron, job, **options)

    yield add
    for name in names:
        schedules.forget(name)


@pytest.fixture
def clock() -> Iterator[ManualClock]:
    manual = ManualClock(start_ms=at(2024, 5, 6, 11, 58))
    with use_clock(manual):
        yield manual
