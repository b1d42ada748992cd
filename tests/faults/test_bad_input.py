"""Bad input at the boundary and in the table (T29-T33), beyond the one-process checks of test_core.

The same decision on every database: a refused payload raises ``InvalidPayload`` at
``enqueue()`` and writes nothing; a payload that is accepted comes back byte-identical in the
handler; a row that older code or raw SQL left behind fails its attempt and never takes the
worker down; a dedupe key raced by several processes makes one active job.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import threading
import time

import pytest
from django.core import checks
from django.db import connection, connections, transaction

from django_durq import InvalidPayload
from django_durq.clock import ManualClock, use_clock
from django_durq.conf import get_settings
from django_durq.models import Job, Status
from django_durq.testing import drain
from tests.conftest import db_vendor, run_command
from tests.ledger import checker, jobs
from tests.ledger.models import Effect

from .conftest import one_leg, only_on, problems_in, size
from .racers import race

transactional = pytest.mark.django_db(transaction=True)


def insert_row(name: str, arguments: str, *, max_attempts: int = 1, now: int | None = None) -> int:
    """A job row as older code or raw SQL would leave it: no validation at all."""
    stamp = now if now is not None else int(time.time() * 1000)
    row = Job.objects.create(
        name=name,
        arguments=arguments,
        max_attempts=max_attempts,
        run_at_ms=stamp,
        created_ms=stamp,
        lease_ms=get_settings().lease_ms,
    )
    return row.pk


# --- T30: large payloads -----------------------------------------------------------------------------


@transactional
@pytest.mark.parametrize("text", ["a" * 10_000_000, "字" * 3_400_000], ids=["ascii-10MB", "cjk-10MB"])
def test_t30_payload_over_the_default_cap_is_refused_naming_the_limit(text):
    limit = get_settings().max_payload_bytes
    with pytest.raises(InvalidPayload, match=rf"over the limit of {limit} bytes \(DURQ\[\"MAX_PAYLOAD_BYTES\"\]\)"):
        jobs.digest.enqueue(text=text)
    assert Job.objects.count() == 0


@one_leg
@pytest.mark.processes
def test_t30_largest_accepted_payload_round_trips_byte_identical(faults):
    # Just under the cap in UTF-8: CJK (3 bytes), astral emoji (4 bytes), separators that JSON escapes.
    text = ("字" * 1000 + "🎉" * 10 + "\u2028\u2029\\\"'") * 320
    assert len(json.dumps({"args": [], "kwargs": {"text": text}}, ensure_ascii=False).encode()) < get_settings().max_payload_bytes
    queued = jobs.digest.enqueue(text=text)
    worker = faults.spawn("--queue", "default:1", "--burst")
    assert worker.wait(timeout=60) == 0, worker.output()
    assert Effect.objects.get(job_id=queued.pk).tag == hashlib.sha256(text.encode()).hexdigest()


@one_leg
@pytest.mark.processes
def test_t30_t31_rows_left_by_raw_sql_fail_their_attempt_and_the_worker_survives(faults, tmp_path):
    deep = insert_row("tests.noop", "[" * 100_000 + "]" * 100_000)
    not_an_object = insert_row("tests.noop", '["args", "kwargs"]')
    pwned = tmp_path / "pwned"
    dotted = insert_row("os.system", json.dumps({"args": [f"touch {pwned}"], "kwargs": {}}))
    after = jobs.effect.enqueue_many([{"tag": "after"} for _ in range(5)])
    worker = faults.spawn("--queue", "default:1", "--burst")
    assert worker.wait(timeout=60) == 0, worker.output()

    for pk in (deep, not_an_object):
        (entry,) = Job.objects.get(pk=pk).error_list
        assert (entry["kind"], entry["message"][:21]) == ("decode", "payload decode error:"), entry
    # No handler has that name: handed back for a worker that has one, never imported.
    row = Job.objects.get(pk=dotted)
    (entry,) = row.error_list
    assert entry["message"].startswith("unknown job type 'os.system' in worker ")
    assert (row.status, row.attempts, entry["counted"]) == ("waiting", 0, False)
    assert not pwned.exists()
    assert set(Job.objects.filter(pk__in=[deep, not_an_object]).values_list("status", flat=True)) == {"dead"}
    assert checker.check({row.pk for row in after}).exact
    assert set(Effect.objects.values_list("pid", flat=True)) == {worker.pid}
    assert len(problems_in(worker.output())) == 2  # the two dead letters, nothing else


# --- T31: unknown job type ----------------------------------------------------------------------------


@transactional
def test_t31_unknown_type_is_handed_back_uncounted_then_dead_after_the_limit_and_others_run():
    from django_durq.execution.unknown_types import UNKNOWN_TYPE_LIMIT_MS, delay_ms

    clock = ManualClock(start_ms=1_800_000_000_000)
    with use_clock(clock):
        old = insert_row("old_job", json.dumps({"args": [], "kwargs": {}}), max_attempts=3, now=clock.now_ms())
        other = jobs.effect.enqueue(tag="unaffected")
        first = clock.now_ms()
        assert drain(clock=clock) == {"unknown type": 1, "finished": 1}
        for _ in range(3):
            row = Job.objects.get(pk=old)
            assert (row.status, row.attempts) == (Status.WAITING, 0)
            assert row.run_at_ms - clock.now_ms() == delay_ms(clock.now_ms() - first)
            clock.advance(row.run_at_ms - clock.now_ms() - 1)
            assert drain(clock=clock) == {}  # not a millisecond early
            clock.advance(1)
            assert drain(clock=clock) == {"unknown type": 1}
        clock.advance(first + UNKNOWN_TYPE_LIMIT_MS - clock.now_ms())
        assert drain(clock=clock) == {"dead": 1}
    row = Job.objects.get(pk=old)
    assert row.attempts == 1 and [(e["kind"], e.get("counted", True)) for e in row.error_list] == [
        ("unknown_job", False),
        ("unknown_job", True),
    ]
    assert checker.check({other.pk}).exact


# --- T32: dedupe races ----------------------------------------------------------------------------------


@one_leg
@transactional
def test_t32_processes_racing_one_key_get_one_job_and_the_same_id():
    rounds, racers = size(60, 1000), size(4, 8)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(racers)
    results = context.Queue()
    os.environ["DURQ_TEST_DB_IN_USE"] = str(connection.settings_dict["NAME"])
    connection.close()
    try:
        processes = [context.Process(target=race, args=(i, rounds, racers, barrier, results)) for i in range(racers)]
        for process in processes:
            process.start()
        outcomes = [entry for _ in processes for entry in results.get(timeout=300)]
        for process in processes:
            process.join(timeout=60)
            assert process.exitcode == 0
    finally:
        del os.environ["DURQ_TEST_DB_IN_USE"]

    assert [entry for entry in outcomes if entry[3]] == [], "no IntegrityError (or any error) escapes"
    by_round: dict[int, list[tuple[int, bool]]] = {}
    for round_number, pk, deduplicated, _ in outcomes:
        by_round.setdefault(round_number, []).append((pk, deduplicated))
    assert sorted(by_round) == list(range(rounds))
    for round_number, calls in by_round.items():
        assert len({pk for pk, _ in calls}) == 1, (round_number, calls)
        assert sum(1 for _, deduplicated in calls if not deduplicated) == 1, (round_number, calls)
    assert Job.objects.count() == rounds
    assert sorted(Job.objects.values_list("unique_key", flat=True)) == sorted(f"race-{n}" for n in range(rounds))


@one_leg
@transactional
def test_t32_key_held_by_a_transaction_that_rolls_back_goes_to_the_waiter():
    holding = threading.Event()
    outcome: dict[str, object] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                outcome["first"] = jobs.noop.using(unique="K").enqueue(who="first").pk
                holding.set()
                time.sleep(1.0)
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
        finally:
            holding.set()
            connection.close()

    def second() -> None:
        holding.wait(10)
        try:
            job = jobs.noop.using(unique="K").enqueue(who="second")
            outcome["second"] = (job.pk, job.deduplicated)
        except Exception as error:  # noqa: BLE001 - reported below
            outcome["second"] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    pk, deduplicated = outcome["second"]  # type: ignore[misc]
    assert deduplicated is False  # (SQLite may hand the rolled-back id out again)
    (row,) = Job.objects.filter(unique_key="K")
    assert row.pk == pk and row.kwargs == {"who": "second"}


def test_t32_no_database_drops_the_dedupe_index():
    found = [m for m in checks.run_checks() if m.id == "models.W036" and "durq" in str(m.obj).lower()]
    assert found == []


# --- T33: settings and databases the worker must refuse ----------------------------------------------


@pytest.mark.processes
def test_t33_lease_not_above_two_heartbeats_stops_the_worker_before_it_starts(worker_env):
    env = {**worker_env, "DURQ_TEST_LEASE": "1", "DURQ_TEST_HEARTBEAT": "1"}
    jobs.effect.enqueue(tag="untouched")
    result = run_command("durq_worker", "--burst", env=env, timeout=60)
    assert result.returncode == 2
    assert "durq.E005" in result.stderr and 'DURQ["LEASE"]' in result.stderr
    assert Job.objects.get().attempts == 0 and not Effect.objects.exists()


@only_on("sqlite")
@pytest.mark.django_db  # the database checks read the queue's table too
def test_t33_sqlite_without_returning_is_refused(monkeypatch):
    monkeypatch.setattr("django_durq.db.checks.sqlite_version", lambda: (3, 34, 1))
    errors = [m for m in checks.run_checks(databases=["default"]) if m.id == "durq.E009"]
    assert len(errors) == 1 and "SQLite 3.34.1 is too old" in errors[0].msg


@only_on("mysql")
@pytest.mark.django_db
def test_t33_mariadb_without_skip_locked_is_refused():
    wrapper = connections["default"]
    wrapper.ensure_connection()
    saved = wrapper.__dict__.get("mysql_version")
    wrapper.__dict__["mysql_version"] = (10, 5, 9) if wrapper.mysql_is_mariadb else (8, 0, 0)
    try:
        errors = [m for m in checks.run_checks(databases=["default"]) if m.id == "durq.E009"]
    finally:
        wrapper.__dict__.pop("mysql_version", None)
        if saved is not None:
            wrapper.__dict__["mysql_version"] = saved
    assert len(errors) == 1 and "too old" in errors[0].msg and "SKIP LOCKED" in errors[0].msg


def test_t33_exclusivity_is_reported_for_the_database_in_use():
    words = {"sqlite": "processes on one host sharing the database file"}.get(db_vendor(), "any number of hosts")
    infos = [m for m in checks.run_checks(include_deployment_checks=True) if m.id == "durq.I001"]
    assert len(infos) == 1 and infos[0].msg.endswith(f"a job is claimed exclusively across {words}")
