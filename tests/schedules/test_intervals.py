"""Interval schedules ("every 45 minutes") next to cron, positional schedule arguments, and the
six-field cron form: declared, checked, and each due time claimed once, with a manual clock and
with racing processes and workers."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest

from tests.conftest import wait_until
from tests.schedules.helpers import at, problem_ids, race, run_clock, scheduled_jobs


@pytest.fixture
def pair_job():
    """A job that takes two positional arguments, registered for one test only."""
    from django_durq import job
    from django_durq.handlers.registry import registry

    definition = job(name="tests.schedule.pair")(lambda ctx, left, right=0: [left, right])
    yield definition
    registry.remove(definition.name)


# --- declaring and checking ---------------------------------------------------------------------------


def test_an_interval_is_declared_by_duration_and_shown_in_words(declare):
    spec = declare("tests.every.sync", every=timedelta(minutes=45))
    assert (spec.every_ms, spec.cron, spec.timezone) == (2_700_000, "every 45m", "UTC")
    assert declare("tests.every.mixed", every=5400).cron == "every 1h30m"
    assert declare("tests.every.day", every=timedelta(days=1, seconds=5)).cron == "every 1d5s"
    assert problem_ids("tests.every.sync") == problem_ids("tests.every.mixed") == []


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"every": 0}, ["durq.E010"]),
        ({"every": 1.5}, ["durq.E010"]),
        ({"every": timedelta(milliseconds=300)}, ["durq.E010"]),
        ({"every": "45m"}, ["durq.E010"]),
        ({"every": True}, ["durq.E010"]),
        ({"every": 60, "cron": "* * * * *"}, ["durq.E010"]),
        ({}, ["durq.E010"]),
        ({"every": 60, "timezone": "Europe/Berlin"}, ["durq.E013"]),
        ({"every": 60, "args": "ab"}, ["durq.E013"]),
        ({"every": 60, "args": [object()]}, ["durq.E013"]),
    ],
)
def test_a_bad_interval_or_bad_arguments_are_check_errors_naming_the_schedule(declare, options, expected):
    cron = options.pop("cron", None)
    declare("tests.every.bad", cron, **options)
    assert problem_ids("tests.every.bad") == expected


def test_arguments_the_handler_cannot_take_are_a_check_error(declare, pair_job):
    from django_durq.checks import check_schedules

    declare("tests.args.missing", "0 3 * * *", pair_job.name)  # `left` is required
    declare("tests.args.extra", "0 3 * * *", pair_job.name, args=[1, 2, 3])
    declare("tests.args.fine", "0 3 * * *", pair_job.name, args=[1], kwargs={"right": 2})
    assert problem_ids("tests.args.missing") == problem_ids("tests.args.extra") == ["durq.E013"]
    assert problem_ids("tests.args.fine") == []
    message = next(m.msg for m in check_schedules() if "tests.args.extra" in m.msg)
    assert "takes 3 positional arguments but 4 were given" in message or "too many positional arguments" in message


def test_settings_declare_intervals_and_positional_arguments(settings, pair_job):
    from django_durq import schedules

    settings.DURQ = {
        **settings.DURQ,
        "SCHEDULES": {
            "tests.every.ops": {"every": timedelta(minutes=10), "job": pair_job.name, "args": [7], "kwargs": {"right": 8}},
            "tests.every.both": {"every": 60, "cron": "* * * * *", "job": "tests.noop"},
            "tests.every.neither": {"job": "tests.noop"},
        },
    }
    found = {spec.name: spec for spec in schedules.schedules()}
    assert (found["tests.every.ops"].every_ms, found["tests.every.ops"].args) == (600_000, (7,))
    assert problem_ids("tests.every.both") == problem_ids("tests.every.neither") == ["durq.E010"]


def test_six_fields_read_seconds_first_and_pass_the_check(declare):
    """Supported, not refused: ``*/30 * * * * *`` is every 30 seconds (docs/cron.md says so)."""
    from django_durq import cron

    declare("tests.cron.seconds", "*/30 * * * * *")
    assert problem_ids("tests.cron.seconds") == []
    noon = at(2024, 5, 6, 12)
    assert list(cron.due_times("*/30 * * * * *", "UTC", noon, noon + 90_000)) == [noon + 30_000, noon + 60_000, noon + 90_000]


# --- claiming due times with a manual clock -------------------------------------------------------------


@pytest.mark.django_db
def test_an_interval_starts_one_interval_after_it_is_declared_and_keeps_its_grid(declare, clock):
    from django_durq import schedules
    from django_durq.models import Schedule

    declare("tests.every.grid", every=timedelta(minutes=45))
    declared_at = at(2024, 5, 6, 12, 0, 30) + 250  # not on a whole second
    clock.set(declared_at)
    assert schedules.tick(clock.now_ms())["ran"] == 0
    first = Schedule.objects.get(name="tests.every.grid").next_due_ms
    assert first == at(2024, 5, 6, 12, 45, 31)  # 45 minutes later, on the next whole second
    totals = run_clock(clock, first + 4 * 2_700_000 + 7 * 60_000, 7 * 60_000)  # late passes: 7 minutes apart
    assert totals["ran"] == 5
    assert scheduled_jobs() == [first + k * 2_700_000 for k in range(5)]  # each run at its own due time, no drift


@pytest.mark.django_db
def test_an_interval_after_downtime_follows_the_missed_policy_on_its_grid(declare, clock):
    from django_durq import schedules

    declare("tests.every.down", every=600, missed="collapse")
    clock.set(at(2024, 5, 6, 12))
    schedules.tick(clock.now_ms())
    clock.advance(timedelta(hours=1, minutes=5))  # six due times passed with no worker
    assert schedules.tick(clock.now_ms())["ran"] == 1  # one run stands for them all
    assert scheduled_jobs() == [at(2024, 5, 6, 12, 10)]
    clock.set(at(2024, 5, 6, 13, 10))
    assert schedules.tick(clock.now_ms())["ran"] == 1  # and the grid goes on where it was
    assert scheduled_jobs()[-1] == at(2024, 5, 6, 13, 10)


@pytest.mark.django_db
def test_changing_the_interval_recomputes_the_next_due_time(declare, clock):
    from django_durq import schedules
    from django_durq.models import Schedule

    declare("tests.every.change", every=3600)
    clock.set(at(2024, 5, 6, 12))
    schedules.tick(clock.now_ms())
    schedules.forget("tests.every.change")
    declare("tests.every.change", every=60)
    clock.advance(1_000)
    schedules.tick(clock.now_ms())
    row = Schedule.objects.get(name="tests.every.change")
    assert (row.cron, row.next_due_ms) == ("every 1m", at(2024, 5, 6, 12, 1, 1))


@pytest.mark.django_db
def test_positional_arguments_reach_the_handler(declare, clock, pair_job):
    from django_durq import schedules
    from django_durq.models import Job
    from django_durq.testing import drain

    declare("tests.args.cron", "* * * * *", pair_job.name, args=[4], kwargs={"right": 5})
    declare("tests.args.every", None, pair_job.name, every=60, args=(6, 7))
    clock.set(at(2024, 5, 6, 12, 0, 30))
    schedules.tick(clock.now_ms())
    clock.advance(60_000)
    assert schedules.tick(clock.now_ms())["ran"] == 2
    queued = {tuple(job.args): job.kwargs for job in Job.objects.filter(name=pair_job.name)}
    assert queued == {(4,): {"right": 5}, (6, 7): {}}
    assert drain(clock=clock)["finished"] == 2
    info = next(s for s in schedules.list_schedules() if s.name == "tests.args.every")
    assert (info.cron, info.next_due_ms) == ("every 1m", at(2024, 5, 6, 12, 2, 30))
    assert schedules.run_now("tests.args.every").args == [6, 7]


# --- real processes -----------------------------------------------------------------------------------------

RACE_STEPS = 30


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_replicas_racing_in_real_processes_claim_each_interval_due_time_once(declare):
    from django_durq import schedules
    from django_durq.models import Schedule

    spec = declare("tests.every.race", every=90)
    start = at(2024, 5, 6, 12)
    schedules.sync([spec], start - 90_000)
    Schedule.objects.filter(name="tests.every.race").update(next_due_ms=start)
    outcomes = race({"name": "tests.every.race", "job": "tests.noop", "every": 90}, start, 90_000, RACE_STEPS)
    assert [error for _, _, error in outcomes if error] == []
    expected = [start + step * 90_000 for step in range(RACE_STEPS)]
    assert sorted(due for _, dues, _ in outcomes for due in dues) == expected  # every due time taken, none twice
    assert scheduled_jobs() == expected


@pytest.mark.processes
@pytest.mark.one_leg
def test_workers_with_one_interval_schedule_run_each_due_time_once_with_its_arguments(spawn_worker):
    from django_durq.models import Job
    from tests.ledger.models import Effect

    env = {"DURQ_TEST_CRON": "interval", "DURQ_TEST_KEEP_FINISHED": "300"}
    workers = [spawn_worker("--queue", "default:1", env=env) for _ in range(2)]
    wait_until(lambda: Effect.objects.filter(tag="every-second").count() >= 6, timeout=60, message="6 interval runs")
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=30) == 0, worker.output()
    dues = sorted(Job.objects.filter(name="tests.stamp").values_list("run_at_ms", flat=True))
    assert dues == list(range(dues[0], dues[-1] + 1, 1000)), "a due time was dropped or enqueued twice"
