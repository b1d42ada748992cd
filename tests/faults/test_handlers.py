"""Handlers that misbehave, and completions that fail (T18-T22), in real worker processes."""

from __future__ import annotations

import math
import re
import signal
import time

import pytest

from django_durq.models import Job, Status, WorkerProcess
from tests.conftest import wait_until
from tests.ledger import checker, jobs
from tests.ledger.models import Effect

from .conftest import POLL_S, cut_connections, one_leg, only_on, problems_in, rss_mb, size

pytestmark = pytest.mark.processes

ODD_EXITS = {
    "SystemExit": ("SystemExit", "3"),
    "KeyboardInterrupt": ("KeyboardInterrupt", "KeyboardInterrupt"),
    "GeneratorExit": ("GeneratorExit", "GeneratorExit"),
    "RecursionError": ("RecursionError", "maximum recursion depth exceeded"),
    "MemoryError": ("MemoryError", "pretend"),
    "BadStr": ("tests.ledger.jobs.raise_base.<locals>.BadStr", "BadStr()"),
}


def test_t18_base_exceptions_and_odd_results_are_failed_attempts_in_a_live_worker(faults):
    odd = {kind: jobs.raise_base.using(max_attempts=1).enqueue(kind=kind) for kind in ODD_EXITS}
    bad_result = jobs.bad_result.enqueue()
    after = jobs.effect.enqueue_many([{"tag": "after"} for _ in range(10)])
    worker = faults.spawn("--queue", "default:1", "--burst")
    assert worker.wait(timeout=60) == 0, worker.output()

    for kind, (type_path, message) in ODD_EXITS.items():
        row = Job.objects.get(pk=odd[kind].pk)
        (entry,) = row.error_list
        assert (row.status, entry["kind"], entry["type"]) == (Status.DEAD, "exception", type_path), kind
        assert entry["message"].startswith(message), (kind, entry["message"])
        assert entry["traceback"], kind
    (entry,) = Job.objects.get(pk=bad_result.pk).error_list
    assert "returned a value that is not JSON" in entry["message"] and "object" in entry["message"]
    # The same process ran everything after the odd ones, and printed no traceback of its own.
    assert checker.check({row.pk for row in after}).exact
    assert set(Effect.objects.values_list("pid", flat=True)) == {worker.pid}
    assert len(problems_in(worker.output())) == len(ODD_EXITS) + 1  # one ERROR line per dead letter, nothing else


@one_leg
@only_on("sqlite", "postgres")
def test_t19_hung_handlers_time_out_their_slots_are_refilled_and_their_late_writes_fenced(faults):
    timeout_s = 3.0
    jobs.hang.using(timeout=timeout_s, max_attempts=1).enqueue_many([{"seconds": 7.0}, {"seconds": 7.0}])
    normal = jobs.effect.enqueue_many([{"tag": "normal"} for _ in range(20)])
    worker = faults.spawn("--queue", "default:2")
    wait_until(lambda: Job.objects.running().filter(name="tests.hang").count() == 2, 60, "both hung jobs to start")

    # Each hung job gets a failed attempt within T + P + 2 s, and the pool goes on with two slots.
    wait_until(
        lambda: Job.objects.filter(name="tests.hang", status=Status.DEAD).count() == 2, timeout_s + POLL_S + 2, "the timeouts"
    )
    wait_until(lambda: Effect.objects.filter(tag="normal").count() == 20, 30, "the normal jobs on the refilled slots")
    # The hung handlers return at 7 s; their attempts' outcomes were recorded at the timeout.
    wait_until(lambda: Effect.objects.filter(tag="hang-returned").count() == 2, 30, "the hung handlers to return")
    wait_until(lambda: worker.output().count("returned after its attempt was settled") == 2, 10, "the discarded late returns")

    for row in Job.objects.filter(name="tests.hang"):
        (entry,) = row.error_list
        assert (row.status, row.attempts, entry["kind"]) == (Status.DEAD, 1, "timeout")
        assert "the handler did not return" in entry["message"]
    assert checker.check({row.pk for row in normal}, tag="normal").exact
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert problems_in(worker.output(), allowed=("-> dead letter",)) == []


@one_leg
@only_on("sqlite", "postgres")
def test_t20_leaking_handler_is_contained_by_recycling_between_jobs(faults):
    total, per_worker = size(200, 10_000), 50
    queued = jobs.leak.enqueue_many([{"megabytes": 1} for _ in range(total)])
    recycles, peaks, baselines = 0, [], []
    while Job.objects.active().exists():
        assert recycles < math.ceil(total / per_worker) + 2, "too many recycles"
        worker = faults.spawn("--queue", "default:2", "--max-jobs", str(per_worker))
        baseline = peak = None
        while worker.popen.poll() is None:
            sample = rss_mb(worker.pid)
            if sample is not None:
                if baseline is None and WorkerProcess.objects.filter(pid=worker.pid).exists():
                    baseline = sample[0]  # registered, about to claim: the idle footprint
                peak = sample[1]
            time.sleep(0.02)
        assert worker.popen.returncode == 0, worker.output()
        recycles += 1
        if baseline is not None and peak is not None:
            baselines.append(baseline)
            peaks.append(peak - baseline)
    assert recycles == math.ceil(total / per_worker)
    # Peak growth of each process stays within N x 1 MB plus 30 MB; recycling happens only between jobs.
    assert peaks and max(peaks) <= per_worker * 1 + 30, (baselines, peaks)
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    assert checker.check({row.pk for row in queued}).exact


@one_leg
@only_on("sqlite", "postgres")
def test_t21_job_deleted_while_running_is_not_recreated_and_the_worker_goes_on(faults):
    doomed = jobs.effect.enqueue(tag="doomed")
    faults.gates.close("before_complete")
    worker = faults.spawn("--queue", "default:1", hooks=True)
    faults.gates.wait("before_complete", doomed.pk)
    Job.objects.filter(pk=doomed.pk).delete()
    faults.gates.open("before_complete")

    following = jobs.effect.enqueue(tag="following")
    wait_until(lambda: Effect.objects.filter(tag="following").exists(), 30, "the next job")
    assert Effect.objects.get(tag="following").pid == worker.pid
    wait_until(lambda: Job.objects.get(pk=following.pk).status == Status.FINISHED, 10, "the next job's completion")
    time.sleep(2 * 0.5)  # two heartbeat intervals: nothing may bring the row back
    assert not Job.objects.filter(pk=doomed.pk).exists()
    output = worker.output()
    assert f"job {doomed.pk} (tests.effect) finished after its lease was lost" in output
    assert problems_in(output) == []
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


def test_t22_failed_completion_writes_are_retried_without_running_the_handler_again(faults):
    faults.gates.fail("complete", 2)  # the next two completion statements raise OperationalError
    done = jobs.effect.enqueue(tag="once")
    worker = faults.spawn("--queue", "default:1", "--burst", hooks=True)
    assert worker.wait(timeout=60) == 0, worker.output()

    row = Job.objects.get(pk=done.pk)
    assert (row.status, row.attempts, row.error_list) == (Status.FINISHED, 1, [])
    assert checker.check({done.pk}).exact
    assert worker.output().count("durq: complete failed (OperationalError: injected fault in complete") == 2
    assert problems_in(worker.output()) == []


@only_on("postgres", "mysql")
def test_t22_connection_cut_before_the_completion_is_retried_on_a_new_connection(faults):
    done = jobs.effect.enqueue(tag="once")
    faults.gates.close("before_complete")
    worker = faults.spawn("--queue", "default:1", hooks=True)
    faults.gates.wait("before_complete", done.pk)
    assert cut_connections() >= 1
    faults.gates.open("before_complete")
    wait_until(lambda: Job.objects.get(pk=done.pk).status == Status.FINISHED, 30, "the completion")

    row = Job.objects.get(pk=done.pk)
    assert (row.attempts, row.error_list) == (1, [])
    assert checker.check({done.pk}).exact
    # The dispatcher, which commits completions, met the cut connection and retried on a new one.
    assert re.search(r"durq: [a-z ]+ failed \((OperationalError|InterfaceError)", worker.output()), worker.output()
    assert problems_in(worker.output()) == []
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


@one_leg
@only_on("sqlite", "postgres")
def test_t14_long_and_cpu_bound_handlers_keep_their_lease(faults):
    lease = 2.0
    sleeper = jobs.effect.enqueue(tag="long", sleep=size(3, 10) * lease)
    burner = jobs.cpu.enqueue(seconds=3 * lease)
    worker = faults.spawn("--queue", "default:2")
    wait_until(lambda: Job.objects.running().count() == 2, 60, "both handlers running")
    rival = faults.spawn_ready("--queue", "default:2")  # would take over any lease that lapsed
    wait_until(lambda: not Job.objects.active().exists(), 60, "both to finish")

    # Heartbeats come from a thread of the worker; the interpreter switches threads while a
    # handler sleeps or runs Python code, so both leases were renewed the whole time.
    assert set(Job.objects.values_list("attempts", "errors")) == {(1, "[]")}
    assert checker.check({sleeper.pk, burner.pk}).exact
    assert set(Effect.objects.values_list("pid", flat=True)) == {worker.pid}
    for process in (worker, rival):
        process.signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0


@one_leg
@only_on("sqlite")
def test_t14_a_c_call_holding_the_gil_past_the_lease_is_the_documented_limit(faults):
    # One C call that holds the GIL for 2 L: no heartbeat can run in that process meanwhile.
    starved = jobs.gil.using(max_attempts=2).enqueue(seconds=4)
    first = faults.spawn("--queue", "slow:1")
    wait_until(lambda: Job.objects.running().filter(pk=starved.pk).exists(), 60, "the GIL holder to start")
    second = faults.spawn("--queue", "slow:1")
    wait_until(lambda: not Job.objects.active().exists(), 60, "the starved job to settle")
    remedied = jobs.gil.using(lease=10).enqueue(seconds=4)  # the remedy: a lease longer than the call
    wait_until(lambda: not Job.objects.active().exists(), 60, "the remedied job to finish")

    # Every attempt loses its lease to the other worker; the job ends as a dead letter whose
    # history says why, and each run's completion was fenced off.
    row = Job.objects.get(pk=starved.pk)
    assert (row.status, row.attempts) == (Status.DEAD, 2)
    assert [e["kind"] for e in row.error_list] == ["lease_expired", "lease_expired"]
    # With a lease longer than the call, the same handler finishes at the first attempt.
    row = Job.objects.get(pk=remedied.pk)
    assert (row.status, row.attempts, row.error_list) == (Status.FINISHED, 1, [])
    verdict = checker.check({starved.pk, remedied.pk})
    assert verdict.ok and verdict.dead == [starved.pk], verdict
    for process in (first, second):
        process.signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
