"""Settings and system checks: every bad setting is reported with a stable id and a hint."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.db import connection

from django_durq import job
from django_durq.clock import ShiftedClock, SystemClock
from django_durq.conf import get_settings, parse
from django_durq.db.checks import sqlite_setup_warnings
from django_durq.db.clock import database_clock
from django_durq.handlers.registry import registry
from tests.conftest import database_alias, db_vendor, run_command


def ids(raw: object) -> list[str]:
    return [problem.id for problem in parse(raw).problems]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("not a dict", ["durq.E001"]),
        ({"LEASES": 30}, ["durq.E001"]),
        ({"LEASE": "30s"}, ["durq.E002"]),
        ({"LEASE": -1}, ["durq.E002"]),
        ({"POLL_INTERVAL": 0}, ["durq.E002"]),
        ({"MAX_ATTEMPTS": 0}, ["durq.E003"]),
        ({"MAX_ATTEMPTS": True}, ["durq.E003"]),
        ({"MAX_PAYLOAD_BYTES": "1MB"}, ["durq.E003"]),
        ({"DATABASE": 3}, ["durq.E004"]),
        ({"LEASE": 10, "HEARTBEAT_INTERVAL": 6}, ["durq.E005"]),
        ({"SCHEDULES": []}, ["durq.E006"]),
        ({"BACKOFF": {"base": 2, "factor": 0.5}}, ["durq.E007"]),
        ({"BACKOFF": {"speed": 2}}, ["durq.E007"]),
        ({"QUEUES": {}}, ["durq.E008"]),
        ({"QUEUES": {"a:b": {}}}, ["durq.E008"]),
        ({"QUEUES": {"video": {"concurrency": 0}}}, ["durq.E003"]),
        ({"QUEUES": {"video": {"workers": 2}}}, ["durq.E008"]),
        ({"PREFETCH": -0.01}, ["durq.E002"]),
        ({"PREFETCH": "20ms"}, ["durq.E002"]),
        ({"QUEUES": {"video": {"prefetch": -1}}}, ["durq.E002"]),
        ({"PREFETCH": 0, "QUEUES": {"video": {"prefetch": 0.5}}}, []),
        ({"LEASE": timedelta(minutes=5), "HEARTBEAT_INTERVAL": timedelta(seconds=30)}, []),
        ({"LISTEN_DATABASE": 3}, ["durq.E021"]),
        ({"DURABLE_CLAIMS": "yes"}, ["durq.E024"]),
        ({"DURABLE_CLAIMS": 1}, ["durq.E024"]),
        ({"LISTEN_DATABASE": "direct"}, []),
        ({"LISTEN_DATABASE": None}, []),
    ],
)
def test_bad_settings_have_stable_ids(raw, expected):
    assert ids(raw) == expected


def test_every_problem_says_what_to_write_instead():
    for problem in parse({"LEASE": "x", "MAX_ATTEMPTS": 0, "QUEUES": {"v": {"concurrency": -1}}}).problems:
        assert problem.hint and problem.message


def test_defaults_are_sane():
    settings = parse(None)
    assert settings.problems == ()
    assert settings.lease_ms >= 2 * settings.heartbeat_interval_ms
    assert settings.queues["default"].concurrency == 4
    assert settings.prefetch_ms("default") == 20


def test_prefetch_per_queue_overrides_the_global_horizon():
    settings = parse({"PREFETCH": 0, "QUEUES": {"video": {"prefetch": 0.5}, "mail": {}}})
    assert (settings.prefetch_ms("video"), settings.prefetch_ms("mail"), settings.prefetch_ms("unlisted")) == (500, 0, 0)


def test_settings_errors_reach_manage_py_check(settings):
    settings.DURQ = {"LEASE": 10, "HEARTBEAT_INTERVAL": 6, "NOPE": 1}
    found = {message.id for message in run_checks()}
    assert {"durq.E001", "durq.E005"} <= found


def test_check_deploy_names_the_database_guarantee():
    (info,) = [m for m in run_checks(include_deployment_checks=True) if m.id == "durq.I001"]
    assert get_settings().database in info.msg
    expected = "processes on one host sharing the database file" if db_vendor() == "sqlite" else "any number of hosts"
    assert expected in info.msg


@pytest.mark.django_db(transaction=True)
def test_ordinary_commands_are_quiet_on_a_correct_configuration(worker_env):
    result = run_command("check", env=worker_env)
    assert result.returncode == 0, result.stderr
    assert "durq" not in result.stdout + result.stderr
    assert "identified no issues" in result.stdout
    assert not [m for m in run_checks() if m.id == "durq.I001"]


def test_a_queue_no_setting_names_is_warned_about(settings):
    settings.DURQ = {**settings.DURQ, "QUEUES": {"default": {}, "fast": {}, "slow": {}, "video": {}, "webhooks": {}}}
    assert "durq.W003" not in {message.id for message in run_checks()}

    @job(name="tests.reports.monthly", queue="reports")
    def monthly(ctx):
        pass

    try:
        (warning,) = [m for m in run_checks() if m.id == "durq.W003"]
    finally:
        registry.remove("tests.reports.monthly")
    assert "'reports'" in warning.msg and "tests.reports.monthly" in warning.msg
    assert 'DURQ["QUEUES"]' in warning.hint and "--queue reports" in warning.hint


def test_unknown_database_alias(settings):
    settings.DURQ = {"DATABASE": "queue"}
    assert "durq.E004" in {message.id for message in run_checks()}


def test_sqlite_without_wal_or_immediate_is_warned_about():
    assert [w[0] for w in sqlite_setup_warnings({"NAME": "x.sqlite3", "OPTIONS": {}})] == ["durq.W001", "durq.W002"]
    good = {"init_command": "PRAGMA journal_mode=WAL;", "transaction_mode": "IMMEDIATE"}
    assert sqlite_setup_warnings({"NAME": "x.sqlite3", "OPTIONS": good}) == []


@pytest.mark.skipif(db_vendor() != "postgres", reason="connection pools are a PostgreSQL option")
def test_a_pool_too_small_for_the_worker_is_an_error(settings):
    queues = {"default": {"concurrency": 4}, "fast": {"concurrency": 2}, "slow": {"concurrency": 1}}
    settings.DURQ = {**settings.DURQ, "QUEUES": queues}
    options = connection.settings_dict["OPTIONS"]
    try:
        connection.settings_dict["OPTIONS"] = {**options, "pool": {"max_size": 3}}
        (error,) = [m for m in run_checks() if m.id == "durq.E020"]
        # slots 4 + 2 + 1, a dispatcher per queue (3), the monitor, lease keeper, maintenance runner, events
        assert "max_size 3" in error.msg and "holds up to 14 connections" in error.msg
    finally:
        connection.settings_dict["OPTIONS"] = options


@pytest.mark.skipif(db_vendor() != "mysql", reason="an isolation level of the MariaDB backend")
def test_a_mariadb_isolation_level_other_than_read_committed_is_warned_about():
    """At REPEATABLE READ a fan-in callback can stay blocked for good (tests/enqueue/test_workflow_races.py
    run with DURQ_TEST_MYSQL_ISOLATION="repeatable read" shows it)."""
    assert "durq.W011" not in {message.id for message in run_checks()}
    options = connection.settings_dict["OPTIONS"]
    try:
        connection.settings_dict["OPTIONS"] = {**options, "isolation_level": "repeatable read"}
        (warning,) = [m for m in run_checks() if m.id == "durq.W011"]
    finally:
        connection.settings_dict["OPTIONS"] = options
    assert "'repeatable read'" in warning.msg and "READ COMMITTED" in warning.msg and "isolation_level" in warning.hint


def test_listen_database_defaults_to_the_queue_database():
    assert parse({"DATABASE": "queue"}).listen_database == "queue"
    assert parse({"DATABASE": "queue", "LISTEN_DATABASE": None}).listen_database is None


def listen_problems() -> dict[str, str]:
    # Django's own checks would connect to every database, and so would django-durq's database checks.
    messages = run_checks(tags=["django_durq"], databases=[])
    return {m.id: f"{m.msg} / {m.hint}" for m in messages if m.id in ("durq.E021", "durq.E022", "durq.E023")}


@pytest.mark.skipif(db_vendor() == "postgres", reason="a queue that is not on PostgreSQL")
def test_listen_database_applies_to_a_postgresql_queue_only(settings):
    settings.DURQ = {**settings.DURQ, "LISTEN_DATABASE": None}
    assert "only a worker on PostgreSQL LISTENs" in listen_problems()["durq.E022"]


@pytest.mark.skipif(db_vendor() != "postgres", reason="LISTEN is PostgreSQL's")
def test_listen_database_names_a_postgresql_database(settings):
    settings.DURQ = {**settings.DURQ, "LISTEN_DATABASE": "direct"}
    assert "'direct', which is not in DATABASES" in listen_problems()["durq.E021"]
    with database_alias("direct", {**connection.settings_dict, "ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}):
        assert "'direct', a sqlite database" in listen_problems()["durq.E022"]
    with database_alias("direct", dict(connection.settings_dict)):
        assert not {"durq.E021", "durq.E022"} & set(listen_problems())


@pytest.mark.skipif(db_vendor() != "postgres", reason="prepared statements are PostgreSQL's")
@pytest.mark.parametrize("listen", [None, "direct"])
def test_prepared_statements_behind_a_transaction_pooler_are_an_error(settings, listen):
    options = connection.settings_dict["OPTIONS"]
    bound = {**{key: value for key, value in options.items() if key != "prepare_threshold"}, "server_side_binding": True}
    prepared = {**bound, "prepare_threshold": 5}
    try:
        with database_alias("direct", dict(connection.settings_dict)):
            connection.settings_dict["OPTIONS"] = prepared
            settings.DURQ = {**settings.DURQ, "LISTEN_DATABASE": listen}
            problem = listen_problems()["durq.E023"]
            assert "prepares statements" in problem and 'Remove "prepare_threshold"' in problem
            # Without the setting the queue's connection is taken to hold a session: prepared statements are fine.
            settings.DURQ = {**settings.DURQ, "LISTEN_DATABASE": "default"}
            assert listen_problems() == {}
            connection.settings_dict["OPTIONS"] = bound  # Django's default threshold: nothing is prepared
            settings.DURQ = {**settings.DURQ, "LISTEN_DATABASE": listen}
            assert listen_problems() == {}
    finally:
        connection.settings_dict["OPTIONS"] = options


@pytest.mark.skipif(db_vendor() != "postgres", reason="LISTEN is PostgreSQL's")
@pytest.mark.django_db(transaction=True)  # the probe's NOTIFY must commit
def test_a_listen_database_that_does_not_hear_the_queue_is_warned_about(settings):
    settings.DURQ = {**settings.DURQ, "LISTEN_DATABASE": "direct"}

    def warnings() -> list[str]:
        return [m.msg for m in run_checks(tags=["django_durq"], databases=["default"]) if m.id == "durq.W004"]

    with database_alias("direct", dict(connection.settings_dict)):
        assert warnings() == []
    with database_alias("direct", {**connection.settings_dict, "NAME": "test"}):  # another database of the server
        (warning,) = warnings()
    assert "'direct' that LISTENs did not hear a NOTIFY sent through 'default'" in warning


@pytest.mark.django_db(transaction=True)
def test_worker_refuses_to_start_on_bad_settings(worker_env):
    env = {**worker_env, "DURQ_TEST_LEASE": "1", "DURQ_TEST_HEARTBEAT": "5"}
    result = run_command("durq_worker", "--burst", env=env, timeout=60)
    assert result.returncode == 2
    assert "durq.E005" in result.stderr


@pytest.mark.django_db
@pytest.mark.skipif(db_vendor() == "sqlite", reason="SQLite shares the worker's host and clock")
def test_clock_skew_against_the_database_is_reported_and_corrected(caplog):
    from django_durq.worker import Supervisor

    ahead = database_clock(base=ShiftedClock(600_000))  # a host whose clock runs 10 minutes fast
    supervisor = Supervisor({"default": 1}, get_settings(), clock=ahead)
    with caplog.at_level(logging.WARNING, logger="django_durq"):
        supervisor._report_clock()
    assert "clock is +600.0 s off the database server's" in caplog.text and "NTP" in caplog.text
    # The queue's timeline is the server's, not the host's.
    assert abs(ahead.now_ms() - SystemClock().now_ms()) < 5_000
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="django_durq"):
        Supervisor({"default": 1}, get_settings(), clock=database_clock())._report_clock()
    assert caplog.text == ""


def test_a_clock_reading_that_also_opened_the_connection_does_not_put_this_process_ahead():
    """The first reading waits 40 ms (connecting) and reads the server's clock only at its end."""
    from django_durq.clock import ServerClock

    readings = iter([0.04, 0.0, 0.0, 0.04, 0.0, 0.0])

    def connect_then_read() -> float:
        time.sleep(next(readings))
        return time.time_ns() / 1e6  # this host's clock stands in for the server's: they agree

    clock = ServerClock(connect_then_read)
    for _ in range(2):
        clock.measure()
        assert abs(clock.now_ms() - SystemClock().now_ms()) <= 2
        assert abs(clock.offset_ms) <= 2 and clock.uncertainty_ms < 5


@pytest.mark.django_db
@pytest.mark.skipif(db_vendor() == "sqlite", reason="SQLite shares the worker's host and clock")
def test_processes_on_one_host_read_the_same_time_from_the_server_to_the_millisecond():
    """A job queued by one process is due at once for another: both read the server within a millisecond."""
    from django.db import connection

    offsets = []
    for _ in range(5):
        connection.close()  # each measurement starts by opening the connection, as a new process does
        clock = database_clock()
        clock.now_ms()
        offsets.append(clock.offset_ms)  # the server's clock minus this host's: the same clock here
    assert max(abs(offset) for offset in offsets) <= 1, offsets


@pytest.mark.parametrize(
    "monitoring",
    [[], {"TOKEN": "short"}, {"PUBLIC": "yes"}, {"MIN_WORKERS": -1}, {"MAX_WAIT": "5m"}, {"SECRET": "x"}],
)
def test_bad_monitoring_settings(monitoring):
    assert ids({"MONITORING": monitoring}) in (["durq.E015"], ["durq.E002"])


@pytest.mark.django_db
def test_queued_jobs_of_a_type_no_handler_serves_are_warned_about_with_the_database_checks():
    from django_durq.models import Job

    def queued(name: str, status: str = "waiting") -> None:
        Job.objects.create(name=name, status=status, arguments="{}", run_at_ms=0, created_ms=0, lease_ms=1)

    for _ in range(3):
        queued("shop.removed")
    queued("shop.renamed", status="running")
    queued("shop.long_gone", status="dead")  # ended: nothing will run it
    queued("tests.effect")  # served
    assert "durq.W010" not in {m.id for m in run_checks()}  # a database check: only with --database
    found = sorted((m.msg, m.hint) for m in run_checks(databases=["default"]) if m.id == "durq.W010")
    assert [msg.split(" in database")[0] for msg, _ in found] == [
        "1 queued job(s) of type 'shop.renamed'",
        "3 queued job(s) of type 'shop.removed'",
    ]
    assert all("they never run" in msg and "Register a handler under the name" in hint for msg, hint in found)
