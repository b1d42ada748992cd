"""Cron schedules: due times (UTC and daylight-saving days), declarations and checks, and the claim of
each due time by exactly one caller, with a manual clock and with racing processes."""

from __future__ import annotations

import io
import itertools
import signal

import pytest

from django_durq import cron
from tests.conftest import run_command, wait_until
from tests.schedules.helpers import BERLIN, NEW_YORK, at, local, local_day, problem_ids, race, run_clock, scheduled_jobs

# --- due times: pure functions ----------------------------------------------------------------------


def test_next_due_time_is_strictly_after_and_a_whole_second():
    noon = at(2024, 5, 6, 12)
    assert cron.next_due_ms("*/5 * * * *", "UTC", noon) == noon + 5 * 60_000
    assert cron.next_due_ms("*/5 * * * *", "UTC", noon - 1) == noon
    assert cron.next_due_ms("*/5 * * * *", "UTC", noon + 299_999) == noon + 300_000


def test_six_fields_have_seconds_first():
    noon = at(2024, 5, 6, 12)
    assert cron.next_due_ms("*/15 * * * * *", "UTC", noon + 7_500) == noon + 15_000
    assert list(cron.due_times("0,30 * * * * *", "UTC", noon, noon + 60_000)) == [noon + 30_000, noon + 60_000]


def test_aliases():
    noon = at(2024, 5, 6, 12, 30)
    assert cron.next_due_ms("@hourly", "UTC", noon) == at(2024, 5, 6, 13)
    assert cron.next_due_ms("@daily", "UTC", noon) == at(2024, 5, 7)
    assert cron.next_due_ms("@weekly", "UTC", noon) == at(2024, 5, 12)  # a Sunday


def test_a_time_zone_moves_the_due_time():
    noon = at(2024, 5, 6, 12)
    assert local(cron.next_due_ms("0 9 * * *", NEW_YORK, noon), NEW_YORK) == "2024-05-06T09:00:00-04:00"  # 08:00 there
    assert local(cron.next_due_ms("0 9 * * *", BERLIN, noon), BERLIN) == "2024-05-07T09:00:00+02:00"


@pytest.mark.parametrize("seconds", ["", "0 "])
@pytest.mark.parametrize(
    ("tz", "day", "time", "expected"),
    [
        # Clocks go forward 02:00 -> 03:00: the skipped 02:30 runs once, at the end of the gap.
        (BERLIN, (2024, 3, 31), "30 2", ["2024-03-31T03:00:00+02:00"]),
        (NEW_YORK, (2024, 3, 10), "30 2", ["2024-03-10T03:00:00-04:00"]),
        # Clocks go back: the repeated half hour runs once, the first time.
        (BERLIN, (2024, 10, 27), "30 2", ["2024-10-27T02:30:00+02:00"]),
        (NEW_YORK, (2024, 11, 3), "30 1", ["2024-11-03T01:30:00-04:00"]),
    ],
)
def test_a_fixed_local_time_runs_once_on_daylight_saving_days(seconds, tz, day, time, expected):
    start, end = local_day(*day, tz)
    dues = cron.due_times(f"{seconds}{time} * * *", tz, start - 1, end - 1)
    assert [local(due, tz) for due in dues] == expected


def test_seconds_within_a_fixed_time_follow_the_shifted_minute():
    start, end = local_day(2024, 3, 31, BERLIN)
    dues = cron.due_times("15,45 30 2 * * *", BERLIN, start - 1, end - 1)
    assert [local(due, BERLIN) for due in dues] == ["2024-03-31T03:00:15+02:00", "2024-03-31T03:00:45+02:00"]


@pytest.mark.parametrize(
    ("expression", "day", "count"),
    [
        ("*/30 * * * *", (2024, 10, 27), 50),  # a 25-hour day
        ("*/30 * * * *", (2024, 3, 31), 46),  # a 23-hour day
        ("0 * * * *", (2024, 10, 27), 25),
        ("0 * * * *", (2024, 3, 31), 23),
        ("0 * * * *", (2024, 5, 6), 24),
    ],
)
def test_jobs_every_so_often_follow_elapsed_time(expression, day, count):
    start, end = local_day(*day, BERLIN)
    dues = list(cron.due_times(expression, BERLIN, start - 1, end - 1))
    assert len(dues) == count
    assert all(b - a == dues[1] - dues[0] for a, b in itertools.pairwise(dues))


@pytest.mark.parametrize(
    ("expression", "timezone", "fragment"),
    [
        ("61 * * * *", "UTC", "Bad minute"),
        ("* * *", "UTC", "3 fields"),
        ("", "UTC", "0 fields"),
        ("* * * * * * *", "UTC", "7 fields"),
        ("0 0 30 2 *", "UTC", "day-of-month"),
        ("0 9 * * MON", "Mars/Olympus", "not an IANA time zone"),
        ("0 9 * * MON", "", "not an IANA time zone"),
        ("0 9 * * MON", "../../etc/passwd", "not an IANA time zone"),
    ],
)
def test_problems_are_named(expression, timezone, fragment):
    message = cron.problem(expression, timezone)
    assert message is not None and fragment in message


def test_good_expressions_have_no_problem():
    for expression in ("*/5 * * * *", "0 3 * * MON-FRI", "0 0 L * *", "*/10 * * * * *", "@daily", "0 0 29 2 *"):
        assert cron.problem(expression, BERLIN) is None, expression
    assert cron.describe("*/5 * * * *").startswith("Every fifth minute")


# --- declarations and checks ---------------------------------------------------------------------


@pytest.fixture
def hourly_job():
    """A job declared with ``@job(cron=...)``, registered for one test only."""
    from django_durq import job
    from django_durq.handlers.registry import registry

    definition = job(name="tests.cron.hourly", cron="0 * * * *", queue="fast", priority=3)(lambda ctx: None)
    yield definition
    registry.remove(definition.name)


def test_schedules_come_from_code_job_decorator_and_settings(declare, hourly_job, settings):
    from django_durq import schedules

    declare("tests.cron.report", "0 3 * * *", "tests.effect", kwargs={"tag": "report"}, timezone=BERLIN, missed="skip")
    declare("tests.cron.off", "0 4 * * *")
    settings.DURQ = {
        **settings.DURQ,
        "SCHEDULES": {
            "tests.cron.ops": {"cron": "*/10 * * * *", "job": "tests.noop", "queue": "slow", "priority": 2},
            "tests.cron.off": None,  # turns the code declaration off
        },
    }
    found = {spec.name: spec for spec in schedules.schedules()}
    assert set(found) >= {"tests.cron.report", "tests.cron.hourly", "tests.cron.ops"}
    assert "tests.cron.off" not in found
    assert (found["tests.cron.report"].timezone, found["tests.cron.report"].missed) == (BERLIN, "skip")
    assert (found["tests.cron.hourly"].job, found["tests.cron.hourly"].cron) == ("tests.cron.hourly", "0 * * * *")
    assert (found["tests.cron.ops"].queue, found["tests.cron.ops"].source) == ("slow", "DURQ[\"SCHEDULES\"]['tests.cron.ops']")
    assert [p.message for p in schedules.schedule_problems() if "'tests.cron." in p.message] == []


@pytest.mark.parametrize(
    ("expression", "options", "expected"),
    [
        ("61 * * * *", {}, ["durq.E010"]),
        ("0 0 30 2 *", {}, ["durq.E010"]),
        ("* * *", {}, ["durq.E010"]),
        ("0 3 * * *", {"timezone": "Mars/Olympus"}, ["durq.E011"]),
        ("0 3 * * *", {"job": "tests.nope"}, ["durq.E012"]),
        ("0 3 * * *", {"missed": "burst"}, ["durq.E013"]),
        ("0 3 * * *", {"kwargs": {"when": object()}}, ["durq.E013"]),
        ("0 3 * * *", {"queue": "a:b"}, ["durq.E013"]),
        ("0 3 * * *", {"priority": 10**6}, ["durq.E013"]),
        ("61 * * * *", {"timezone": "Nowhere/Else", "job": "tests.nope"}, ["durq.E010", "durq.E011", "durq.E012"]),
    ],
)
def test_a_bad_schedule_is_a_check_error_naming_it(declare, expression, options, expected):
    declare("tests.cron.bad", expression, **options)
    assert problem_ids("tests.cron.bad") == expected


def test_bad_schedules_in_settings_are_check_errors(settings):
    settings.DURQ = {
        **settings.DURQ,
        "SCHEDULES": {
            "tests.cron.typo": {"cron": "0 3 * * *", "job": "tests.noop", "tiemzone": "UTC"},
            "tests.cron.nocron": {"job": "tests.noop"},
            "tests.cron.zone": {"cron": "0 3 * * *", "job": "tests.nooop", "timezone": "Europe/Berln"},
        },
    }
    assert problem_ids("tests.cron.typo") == ["durq.E013"]
    assert problem_ids("tests.cron.nocron") == ["durq.E010"]  # neither cron nor every
    assert problem_ids("tests.cron.zone") == ["durq.E011", "durq.E012"]
    from django_durq.checks import check_schedules

    hint = next(m.hint for m in check_schedules() if m.id == "durq.E012")
    assert "tests.noop" in hint


def test_declaring_one_name_twice_differently_is_a_check_error(declare, hourly_job):
    declare("tests.cron.twice", "0 3 * * *")
    declare("tests.cron.twice", "0 4 * * *")
    declare("tests.cron.hourly", "0 5 * * *")
    assert problem_ids("tests.cron.twice") == ["durq.E013"]
    from django_durq.checks import check_schedules

    assert any("tests.cron.hourly" in m.msg and m.id == "durq.E013" for m in check_schedules())


# --- claiming due times with a manual clock ------------------------------------------------------


@pytest.mark.django_db
def test_a_new_schedule_waits_for_its_first_due_time(declare, clock):
    from django_durq import schedules
    from django_durq.models import Schedule

    declare("tests.cron.minutely", "* * * * *")
    clock.set(at(2024, 5, 6, 12, 0, 30))
    assert schedules.tick(clock.now_ms())["ran"] == 0
    row = Schedule.objects.get(name="tests.cron.minutely")
    assert (row.cron, row.timezone, row.next_due_ms, row.last_due_ms) == ("* * * * *", "UTC", at(2024, 5, 6, 12, 1), None)
    assert scheduled_jobs() == []


@pytest.mark.django_db
def test_due_times_across_a_day_run_once_each_at_their_time(declare, clock, hourly_job):
    from django_durq.models import Job, Schedule

    declare("tests.cron.berlin", "15 */3 * * *", "tests.effect", kwargs={"tag": "berlin"}, timezone=BERLIN, priority=7)
    start, end = local_day(2024, 5, 6, BERLIN)
    clock.set(start - 1_000)
    totals = run_clock(clock, end, 7 * 60_000)
    assert [local(ms, BERLIN)[11:19] for ms in scheduled_jobs("tests.effect")] == [
        f"{hour:02d}:15:00" for hour in range(0, 24, 3)
    ]
    assert len(scheduled_jobs("tests.cron.hourly")) == 24
    assert totals == {"ran": 32, "skipped": 0, "lost": 0, "failed": 0}
    queued = Job.objects.filter(name="tests.effect").first()
    assert (queued.priority, queued.queue, queued.kwargs) == (7, "default", {"tag": "berlin"})
    hourly = Job.objects.filter(name="tests.cron.hourly").order_by("-run_at_ms").first()
    assert (hourly.queue, hourly.priority) == ("fast", 3)
    row = Schedule.objects.get(name="tests.cron.berlin")
    assert local(row.last_due_ms, BERLIN) == "2024-05-06T21:15:00+02:00"
    assert row.last_job_id == Job.objects.filter(name="tests.effect").order_by("-run_at_ms").first().pk


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("day", "expression", "expected"),
    [
        ((2024, 3, 31), "30 2 * * *", ["03:00:00+02:00"]),
        ((2024, 10, 27), "30 2 * * *", ["02:30:00+02:00"]),
        ((2024, 10, 27), "0 1-3 * * *", ["01:00:00+02:00", "02:00:00+02:00", "03:00:00+01:00"]),
        ((2024, 10, 27), "*/30 2 * * *", ["02:00:00+02:00", "02:30:00+02:00", "02:00:00+01:00", "02:30:00+01:00"]),
        ((2024, 3, 31), "*/30 2 * * *", []),  # by elapsed time: the skipped hour has no due time
    ],
)
def test_a_daylight_saving_day_with_the_manual_clock(declare, clock, day, expression, expected):
    declare("tests.cron.dst", expression, timezone=BERLIN)
    start, end = local_day(*day, BERLIN)
    clock.set(start - 60_000)
    run_clock(clock, end, 10 * 60_000)
    assert [local(ms, BERLIN)[11:] for ms in scheduled_jobs()] == expected


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("missed", "runs_at_restart"),
    [
        ("collapse", 1),  # one run stands for the twelve missed due times
        ("skip", 0),
        ("all", 12),
    ],
)
def test_downtime_then_catch_up_follows_the_missed_policy(declare, clock, missed, runs_at_restart):
    from django_durq import schedules
    from django_durq.models import Schedule

    declare("tests.cron.five", "*/5 * * * *", missed=missed)
    clock.set(at(2024, 5, 6, 12, 0, 1))
    schedules.tick(clock.now_ms())  # creates the row: next due 12:05
    clock.set(at(2024, 5, 6, 13, 2))  # every worker was down from 12:00:01 to 13:02
    counts = schedules.tick(clock.now_ms())
    assert counts["ran"] == runs_at_restart
    assert counts["skipped"] == (1 if missed == "skip" else 0)
    dues = scheduled_jobs()
    if missed == "collapse":
        assert dues == [at(2024, 5, 6, 12, 5)]
    elif missed == "all":
        assert dues == [at(2024, 5, 6, 12, 5) + i * 300_000 for i in range(12)]
    row = Schedule.objects.get(name="tests.cron.five")
    assert row.next_due_ms == at(2024, 5, 6, 13, 5)
    assert row.last_due_ms == (None if missed == "skip" else dues[-1])
    # Back on time: the next due time runs normally, once.
    clock.set(at(2024, 5, 6, 13, 5, 1))
    assert schedules.tick(clock.now_ms())["ran"] == 1
    assert schedules.tick(clock.now_ms())["ran"] == 0
    assert scheduled_jobs()[-1] == at(2024, 5, 6, 13, 5)


@pytest.mark.django_db
def test_skip_still_runs_a_due_time_that_is_only_a_little_late(declare, clock):
    from django_durq import schedules

    declare("tests.cron.skip", "0 * * * *", missed="skip")
    clock.set(at(2024, 5, 6, 11, 30))
    schedules.tick(clock.now_ms())
    clock.set(at(2024, 5, 6, 12, 0, 30))  # 30 s late: a slow takeover, not downtime
    assert schedules.tick(clock.now_ms())["ran"] == 1
    clock.set(at(2024, 5, 6, 13, 2))  # 2 min late
    assert schedules.tick(clock.now_ms())["skipped"] == 1
    assert scheduled_jobs() == [at(2024, 5, 6, 12)]


@pytest.mark.django_db
def test_changing_the_cron_recomputes_the_next_due_time(declare, clock):
    from django_durq import schedules
    from django_durq.models import Schedule

    declare("tests.cron.change", "0 3 * * *")
    clock.set(at(2024, 5, 6, 1))
    schedules.tick(clock.now_ms())
    assert Schedule.objects.get(name="tests.cron.change").next_due_ms == at(2024, 5, 6, 3)
    schedules.forget("tests.cron.change")
    declare("tests.cron.change", "0 4 * * *", timezone=BERLIN)  # a deploy changed it
    clock.set(at(2024, 5, 6, 3, 0, 30))  # the old due time has come: it must not run
    assert schedules.tick(clock.now_ms())["ran"] == 0
    row = Schedule.objects.get(name="tests.cron.change")
    assert (row.cron, row.timezone, row.next_due_ms) == ("0 4 * * *", BERLIN, at(2024, 5, 7, 4, tz=BERLIN))
    assert scheduled_jobs() == []


@pytest.mark.django_db
def test_a_due_time_is_claimed_once_and_a_failed_enqueue_gives_it_back(declare, clock):
    from django_durq import job, schedules
    from django_durq.exceptions import UnknownJobType
    from django_durq.handlers.registry import registry
    from django_durq.models import Schedule

    temporary = job(name="tests.cron.temporary")(lambda ctx: None)
    spec = declare("tests.cron.once", "* * * * *", temporary)
    clock.set(at(2024, 5, 6, 12, 0, 30))
    schedules.sync([spec], clock.now_ms())
    due = at(2024, 5, 6, 12, 1)
    registry.remove("tests.cron.temporary")
    with pytest.raises(UnknownJobType):
        schedules.claim(spec, due, due + 5)
    assert Schedule.objects.get(name="tests.cron.once").next_due_ms == due  # rolled back with the enqueue
    registry.add(temporary)
    try:
        assert schedules.claim(spec, due, due - 1) is None  # not due yet
        first = schedules.claim(spec, due, due + 5)
        assert first is not None and first.job_id is not None and first.next_due_ms == due + 60_000
        assert schedules.claim(spec, due, due + 6) is None
        assert schedules.claim_next(spec, due + 7) is None
        assert scheduled_jobs("tests.cron.temporary") == [due]
    finally:
        registry.remove("tests.cron.temporary")


# --- listing, run now, the command --------------------------------------------------------------


@pytest.mark.django_db
def test_list_format_and_run_now(declare, clock):
    from django.core.management import call_command

    from django_durq import schedules
    from django_durq.models import Job, Schedule

    declare("tests.cron.list", "30 2 * * *", "tests.effect", kwargs={"tag": "now"}, timezone=BERLIN)
    declare("tests.cron.pending", "0 4 * * *")
    clock.set(at(2024, 3, 30, 12))
    schedules.sync([schedules.find("tests.cron.list")], clock.now_ms())
    clock.set(at(2024, 3, 31, 3, 0, 5, tz=BERLIN))
    schedules.tick(clock.now_ms())
    Schedule.objects.create(name="tests.cron.gone", cron="0 1 * * *", next_due_ms=0, updated_ms=0)

    infos = {info.name: info for info in schedules.list_schedules(clock.now_ms())}
    listed = infos["tests.cron.list"]
    assert (listed.job, listed.timezone, listed.declared, listed.problem) == ("tests.effect", BERLIN, True, None)
    assert listed.last_due.isoformat() == "2024-03-31T03:00:00+02:00"
    assert listed.next_due.isoformat() == "2024-04-01T02:30:00+02:00"
    assert listed.last_job_id == Job.objects.get(name="tests.effect").pk
    assert infos["tests.cron.pending"].last_due is None
    assert infos["tests.cron.gone"].declared is False

    text = schedules.format_schedules(clock.now_ms())
    line = next(line for line in text.splitlines() if line.startswith("tests.cron.list "))
    assert "30 2 * * *" in line and "2024-03-31 03:00:00+02:00" in line and "2024-04-01 02:30:00+02:00" in line
    assert "(no longer declared)" in text

    queued = schedules.run_now("tests.cron.list")
    assert (queued.name, queued.kwargs, queued.run_at_ms) == ("tests.effect", {"tag": "now"}, clock.now_ms())
    with pytest.raises(schedules.UnknownSchedule):
        schedules.run_now("tests.cron.nope")

    out = io.StringIO()
    call_command("durq_schedules", stdout=out)
    assert "tests.cron.list" in out.getvalue() and "NEXT DUE" in out.getvalue()
    out = io.StringIO()
    call_command("durq_schedules", "--run-now", "tests.cron.pending", stdout=out)
    assert "Enqueued job" in out.getvalue()
    assert Job.objects.filter(name="tests.noop").count() == 1


# --- real processes ------------------------------------------------------------------------------

RACE_STEPS = 40


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_replicas_racing_in_real_processes_claim_each_due_time_once(declare):
    from django_durq import schedules
    from django_durq.models import Schedule

    spec = declare("tests.cron.race", "* * * * *")
    start = at(2024, 5, 6, 12)
    schedules.sync([spec], start - 30_000)
    declaration = {"name": "tests.cron.race", "cron": "* * * * *", "job": "tests.noop"}
    outcomes = race(declaration, start, 60_000, RACE_STEPS)
    assert [error for _, _, error in outcomes if error] == []
    expected = [start + step * 60_000 for step in range(RACE_STEPS)]
    won = sorted(due for _, dues, _ in outcomes for due in dues)
    assert won == expected  # every due time taken, none twice
    assert scheduled_jobs() == expected
    assert Schedule.objects.get(name="tests.cron.race").next_due_ms == start + RACE_STEPS * 60_000


@pytest.mark.processes
def test_workers_with_one_schedule_run_each_due_time_once(spawn_worker):
    from django_durq.models import Job, Schedule

    env = {"DURQ_TEST_CRON": "every-second", "DURQ_TEST_KEEP_FINISHED": "300"}
    workers = [spawn_worker("--queue", "default:1", env=env) for _ in range(3)]
    wait_until(lambda: Job.objects.filter(name="tests.noop").count() >= 10, timeout=60, message="10 scheduled runs")
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=30) == 0, worker.output()
    dues = sorted(Job.objects.filter(name="tests.noop").values_list("run_at_ms", flat=True))
    assert dues == list(range(dues[0], dues[-1] + 1, 1000)), "a due time was dropped or enqueued twice"
    assert Schedule.objects.get(name="tests.every-second").last_due_ms == max(dues)


def test_the_worker_refuses_to_start_on_a_bad_schedule(worker_env):
    from django_durq.models import Schedule, WorkerProcess

    result = run_command("durq_worker", "--burst", env={**worker_env, "DURQ_TEST_CRON": "bad"})
    assert result.returncode == 2, result.stdout + result.stderr
    for fragment in ("tests.bad-schedule", "durq.E010", "durq.E011", "Bad minute", "Mars/Olympus"):
        assert fragment in result.stderr
    assert not WorkerProcess.objects.exists() and not Schedule.objects.exists()
