"""The start log of rates: a claim's starts on a scope are one row, counted as the starts it holds."""

from __future__ import annotations

import random

import pytest
from django.db import connection

from django_durq.clock import ManualClock, use_clock
from django_durq.conf import get_settings
from django_durq.db import dialect_for
from django_durq.db.flow import claim_limited, next_start
from django_durq.db.starts import ScopeLog
from django_durq.models import JobStart
from django_durq.ops.limits import limit_usage
from tests.ledger import jobs

START = 1_800_000_000_000


@pytest.fixture
def clock():
    manual = ManualClock(start_ms=START)
    with use_clock(manual):
        yield manual


def claim(clock: ManualClock, limit: int, worker: str = "w1"):
    limits = get_settings().queue("webhooks").limits  # 10 a second
    return claim_limited(dialect_for(connection), "webhooks", limit, clock.now_ms(), worker, limits)


@pytest.mark.django_db
def test_a_claim_logs_its_starts_on_a_scope_as_one_row_that_counts_them_all(clock):
    for _ in range(30):
        jobs.metered.enqueue(log="/dev/null")
    assert len(claim(clock, 6)) == 6
    clock.advance(100)
    assert len(claim(clock, 6, worker="w2")) == 4  # the window holds 6 starts in one row
    rows = list(JobStart.objects.filter(scope="q:webhooks").order_by("started_ms").values_list("started_ms", "starts"))
    assert rows == [(START, 6), (START + 100, 4)]
    assert claim(clock, 6) == []
    assert (
        next_start(dialect_for(connection), "webhooks", clock.now_ms(), get_settings().queue("webhooks").limits) == START + 1_000
    )
    (usage,) = limit_usage(queue="webhooks", now_ms=clock.now_ms())
    assert usage.started_in_window == 10
    clock.advance(900)  # the first row's 6 starts leave the window together; the second's 4 stay
    assert len(claim(clock, 10)) == 6


@pytest.mark.django_db
def test_rows_written_one_per_start_are_counted_as_one_start_each(clock):
    """A worker of an earlier version, during a rolling deploy, writes a row per start and no count."""
    for _ in range(20):
        jobs.metered.enqueue(log="/dev/null")
    with connection.cursor() as cursor:
        for n in range(7):
            cursor.execute(
                "INSERT INTO durq_start (scope, started_ms, period_ms) VALUES (%s, %s, %s)",
                ["q:webhooks", START - 500 + n, 1_000],
            )
    assert len(claim(clock, 10)) == 3
    clock.advance(500)  # the oldest of the earlier rows has left the window: 6 + 3 starts in it
    assert len(claim(clock, 10)) == 1
    clock.advance(6)  # all of them out: this claim's one and the 3 before are left
    assert len(claim(clock, 10)) == 6


def _expanded(rows: list[tuple[int, int]]) -> list[int]:
    return sorted(started for started, count in rows for _ in range(count))


def _in_window_one_by_one(starts: list[int], taken: int, now_ms: int, period_ms: int) -> int:
    return taken + sum(1 for started in starts if started > now_ms - period_ms)


def _nth_newest_one_by_one(starts: list[int], taken: int, now_ms: int, n: int) -> int | None:
    newest_first = sorted([*starts, *[now_ms] * taken], reverse=True)
    return newest_first[n - 1] if n <= len(newest_first) else None


def _random_log(rng: random.Random) -> tuple[list[tuple[int, int]], int, int, int, int]:
    """Rows (time, starts) around ``now``, some ahead of it (a claimer whose clock runs ahead), and what to ask."""
    rows = [(rng.randint(0, 3_000), rng.randint(1, 6)) for _ in range(rng.randint(0, 12))]
    return rows, rng.randint(0, 5), rng.randint(0, 3_000), rng.randint(1, 3_000), rng.randint(1, 40)


@pytest.mark.parametrize("seed", range(20))
def test_a_window_of_rows_holding_several_starts_counts_as_the_starts_one_by_one(seed):
    """Against the log as one row per start: the same counts, the same n-th newest, the same opening."""
    rng = random.Random(seed)
    for _ in range(50):
        rows, taken, now_ms, period_ms, count = _random_log(rng)
        log = ScopeLog(depth=count, period_ms=period_ms)
        log.add(rows)
        starts = _expanded(rows)
        assert log.in_window(taken, now_ms, period_ms) == _in_window_one_by_one(starts, taken, now_ms, period_ms)
        for n in range(1, len(starts) + taken + 2):
            assert log.nth_newest(taken, now_ms, n) == _nth_newest_one_by_one(starts, taken, now_ms, n), (rows, n)
        full = _in_window_one_by_one(starts, taken, now_ms, period_ms) >= count
        assert log.full(taken, now_ms, count, period_ms) is full
        nth = _nth_newest_one_by_one(starts, taken, now_ms, count)
        assert log.opens_at(taken, now_ms, count, period_ms) == (nth + period_ms if full and nth is not None else None)
