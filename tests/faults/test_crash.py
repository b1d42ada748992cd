"""Crashes: kill -9 at a race point, a claim whose outcome the worker never learns, poison pills,
a reused worker name, lost worker rows, a killed process with its slots full (T07, T08, T11-T13).

``durq_worker`` is one process whose pools are threads, so there is no child to replace: when
it dies, its running jobs come back through their leases, and restarting the process is the
process manager's job (systemd, Kubernetes, supervisord). The tests play that role.
"""

from __future__ import annotations

import re
import signal
import time

import pytest

from django_durq.clock import now_ms
from django_durq.models import Job, Status, WorkerProcess
from tests.conftest import db_vendor, wait_until
from tests.ledger import checker, jobs
from tests.ledger.models import Effect

from .conftest import LEASE_S, POLL_S, cut_connections, is_gone, one_leg, only_on, problems_in

pytestmark = pytest.mark.processes

RECOVERY_S = LEASE_S + POLL_S + 2  # the catalogue's cap: L + P + 2 s
# A killed worker's attempt is taken over once its presence lock is released, or once its lease
# expires, whichever comes first: with L = 2 s either may.
LOST = checker.WORKER_LOST_KINDS
# How a worker says it lost a lease: from a heartbeat, at the end of the run, or at completion.
FENCED = re.compile(r"lost its lease|finished after its lease was lost")


def no_stale_running_rows() -> None:
    """Fail when a running row has kept an expired lease for longer than P + 1 s."""
    horizon = now_ms() - int((POLL_S + 1) * 1000)
    stale = list(Job.objects.filter(status=Status.RUNNING, lease_expires_ms__lt=horizon).values_list("pk", flat=True))
    assert not stale, f"running rows whose lease expired over {POLL_S + 1} s ago: {stale}"


def held_at_after_claim(faults, job_id: int, *args: str):
    """A worker that claimed ``job_id`` and is held right after the claim committed."""
    faults.gates.close("after_claim")
    worker = faults.spawn("--queue", "default:1", *args, hooks=True)
    faults.gates.wait("after_claim", job_id)
    return worker


def worker_id_of(job_id: int) -> str:
    return Job.objects.values_list("claimed_by", flat=True).get(pk=job_id)


def test_t07_kill_9_after_the_claim_is_recovered_through_the_lease(faults):
    held = jobs.effect.enqueue(tag="held")
    victim = held_at_after_claim(faults, held.pk)
    victim_id = worker_id_of(held.pk)
    others = jobs.effect.enqueue_many([{"tag": "other"} for _ in range(100)])
    rescuer = faults.spawn_ready("--queue", "default:2")

    victim.kill()
    wait_until(lambda: Job.objects.get(pk=held.pk).attempts == 2, RECOVERY_S, "the held job to be claimed again")
    acked = {held.pk} | {row.pk for row in others}
    wait_until(lambda: not Job.objects.active().exists(), 60, "the drain")

    row = Job.objects.get(pk=held.pk)
    assert row.status == Status.FINISHED and row.attempts == 2
    assert [(e["attempt"], e["kind"] in LOST, e["worker"]) for e in row.error_list] == [(1, True, victim_id)]
    verdict = checker.check(acked)
    assert verdict.exact, verdict
    assert set(Effect.objects.values_list("pid", flat=True)) == {rescuer.pid}
    assert problems_in(rescuer.output()) == []


@only_on("postgres", "mysql")
def test_t08_claim_outcome_unknown_connection_cut_then_kill_9(faults):
    held = jobs.effect.enqueue(tag="held")
    victim = held_at_after_claim(faults, held.pk)
    rescuer = faults.spawn_ready("--queue", "default:1")

    # The victim's connections go first (the rescuer's too: it must reconnect), then the victim.
    assert cut_connections() >= 1
    victim.kill()
    deadline = time.monotonic() + RECOVERY_S
    while Job.objects.get(pk=held.pk).attempts < 2:
        no_stale_running_rows()
        assert time.monotonic() < deadline, f"the job was not runnable again within {RECOVERY_S} s"
        time.sleep(0.05)
    wait_until(lambda: Job.objects.get(pk=held.pk).status == Status.FINISHED, 30, "the rescue to finish")

    row = Job.objects.get(pk=held.pk)
    assert row.attempts == 2 and len(row.error_list) == 1 and row.error_list[0]["kind"] in LOST
    assert checker.check({held.pk}).exact
    # The rescuer lost its connections too; it reconnected without an error.
    assert problems_in(rescuer.output()) == []


# One way to die per database in CI; all three on every database with DURQ_TEST_HEAVY=1.
CRASH_MODE = {"sqlite": "exit", "postgres": "segv", "mysql": "sigkill"}[db_vendor()]


@pytest.mark.parametrize(
    "mode", [pytest.param(mode, marks=[] if mode == CRASH_MODE else [pytest.mark.heavy]) for mode in ("exit", "sigkill", "segv")]
)
def test_t11_poison_pill_that_kills_its_worker_becomes_a_dead_letter(faults, mode):
    poison = jobs.crash.enqueue(mode=mode)  # max_attempts=3
    normal = jobs.effect.enqueue_many([{"tag": "normal"} for _ in range(50)])

    # The process manager: restart the worker whenever it dies.
    exits: list[int] = []
    crashed_pids: set[int] = set()
    worker = faults.spawn("--queue", "default:1")
    deadline = time.monotonic() + 60
    while Job.objects.get(pk=poison.pk).status != Status.DEAD:
        assert time.monotonic() < deadline, f"no dead letter after 60 s; exits {exits}"
        if worker.popen.poll() is not None:
            exits.append(worker.popen.returncode)
            crashed_pids.add(worker.popen.pid)
            worker = faults.spawn("--queue", "default:1")
        time.sleep(0.05)
    wait_until(lambda: not Job.objects.active().exists(), 30, "the normal jobs")

    row = Job.objects.get(pk=poison.pk)
    assert row.attempts == 3 and len(row.error_list) == 3
    assert {e["kind"] for e in row.error_list} <= LOST
    assert len(exits) == 3, exits
    assert set(exits) == {{"exit": 137, "sigkill": -9, "segv": -11}[mode]}
    assert worker.popen.poll() is None, "the pool is alive at the end"
    assert Effect.objects.filter(job_id=poison.pk).count() == 3  # each crash came after its effect
    verdict = checker.check({poison.pk} | {row.pk for row in normal})
    assert verdict.ok and verdict.dead == [poison.pk] and poison.pk in verdict.duplicated, verdict
    # A normal job whose completion was still held for its batch when the poison pill killed the
    # process (up to COMPLETION_HOLD_MS plus the write in progress: several no-op jobs on a busy
    # machine) runs again. Each such job ran exactly twice: first in a process that crashed, then
    # in another, its first attempt recorded as lost (explained: verdict.ok). A later process may
    # also have claimed it ahead and crashed before starting it: one more lost attempt, no run.
    for job_id in set(verdict.duplicated) - {poison.pk}:
        runs = list(Effect.objects.filter(job_id=job_id).order_by("started_ms", "pk").values_list("pid", flat=True))
        assert len(runs) == 2 and runs[0] in crashed_pids and runs[1] != runs[0], (job_id, runs, crashed_pids)
        lost = [e["kind"] in LOST for e in Job.objects.get(pk=job_id).error_list]
        assert 1 <= len(lost) <= len(crashed_pids) and all(lost), (job_id, lost)
    assert re.search(r"on its last attempt.* -> dead letter", worker.output())


@one_leg
@only_on("sqlite", "postgres")
@pytest.mark.parametrize("variant", ["same-worker-id", "worker-rows-deleted"])
def test_t12_recovery_needs_only_the_job_lease(faults, variant):
    held = jobs.effect.enqueue(tag="held")
    victim = held_at_after_claim(faults, held.pk, "--worker-id", "w1")
    assert worker_id_of(held.pk) == "w1"

    victim.kill()
    if variant == "same-worker-id":
        successor = faults.spawn("--queue", "default:1", "--worker-id", "w1")
    else:
        WorkerProcess.objects.all().delete()
        successor = faults.spawn("--queue", "default:1", "--worker-id", "w2")
    wait_until(lambda: Job.objects.get(pk=held.pk).attempts == 2, RECOVERY_S + 2, "the orphan to be reclaimed")
    wait_until(lambda: Job.objects.get(pk=held.pk).status == Status.FINISHED, 30, "the orphan to finish")

    row = Job.objects.get(pk=held.pk)
    assert [(e["kind"] in LOST, e["worker"]) for e in row.error_list] == [(True, "w1")]
    assert row.claimed_by == ("w1" if variant == "same-worker-id" else "w2")
    assert checker.check({held.pk}).exact
    assert Effect.objects.get(job_id=held.pk).pid == successor.pid


@one_leg
@only_on("sqlite", "postgres")
def test_t13_killed_worker_with_every_slot_busy_leaves_nothing_behind(faults):
    # Long enough that the victim is still running them once the rescuer is up, on a busy machine.
    busy = jobs.effect.enqueue_many([{"tag": "busy", "sleep": 5.0} for _ in range(4)])
    victim = faults.spawn("--queue", "default:4")
    wait_until(lambda: Job.objects.running().count() == 4, 60, "four running jobs")
    rescuer = faults.spawn_ready("--queue", "default:4")

    victim.kill()
    wait_until(lambda: is_gone(victim), 5, "no process of the killed worker to remain")
    wait_until(lambda: Effect.objects.count() == 4, RECOVERY_S + 5 + 5, "the four jobs to be recovered")
    wait_until(lambda: not Job.objects.active().exists(), 10, "completion")

    for row in Job.objects.all():
        assert row.attempts == 2 and len(row.error_list) == 1 and row.error_list[0]["kind"] in LOST
    assert checker.check({row.pk for row in busy}).exact
    assert set(Effect.objects.values_list("pid", flat=True)) == {rescuer.pid}


@one_leg
def test_paused_worker_past_its_lease_is_fenced_when_it_resumes(faults):
    paused = jobs.stubborn.enqueue(seconds=5.0)  # sleeps on its first run only
    sleeper = faults.spawn("--queue", "default:1")
    wait_until(lambda: Job.objects.running().exists(), 60, "the job to start")
    rescuer = faults.spawn_ready("--queue", "default:1")

    sleeper.signal(signal.SIGSTOP)  # a VM pause, a stop-the-world swap storm, a debugger
    try:
        wait_until(lambda: Job.objects.get(pk=paused.pk).attempts == 2, RECOVERY_S, "the rescuer to claim the job")
        wait_until(lambda: Job.objects.get(pk=paused.pk).status == Status.FINISHED, 30, "the rescue to finish")
    finally:
        sleeper.signal(signal.SIGCONT)
    # Back from the pause, the first worker learns it lost the lease (from its heartbeat or from
    # its fenced completion, whichever comes first); its outcome changes nothing.
    wait_until(lambda: Effect.objects.filter(pid=sleeper.pid).exists(), 30, "the resumed handler to finish its run")
    wait_until(lambda: FENCED.search(sleeper.output()), 10, "the fence")
    row = Job.objects.get(pk=paused.pk)
    assert (row.status, row.attempts, row.claimed_by) == (Status.FINISHED, 2, worker_id_of(paused.pk))
    assert len(row.error_list) == 1 and row.error_list[0]["kind"] in LOST
    verdict = checker.check({paused.pk})
    assert verdict.ok and verdict.duplicated == [paused.pk], verdict  # explained by the recorded expiry
    # The resumed worker is healthy: it runs the next job.
    rescuer.signal(signal.SIGTERM)  # first, so that only the resumed worker can take the next job
    assert rescuer.wait(timeout=30) == 0
    after = jobs.effect.enqueue(tag="after")
    wait_until(lambda: Effect.objects.filter(job_id=after.pk, pid=sleeper.pid).exists(), 30, "the resumed worker's next job")
    assert problems_in(sleeper.output()) == []


@only_on("postgres", "mysql")  # SQLite: a frozen writer holds the whole file (docs/sqlite.md)
def test_a_worker_frozen_inside_its_renewal_does_not_keep_its_job_from_the_rescuer(faults):
    """Frozen (``SIGSTOP``) while its lease keeper's renewal holds the job's row lock, the worker's
    session stays open and the lock with it; the rescuer's claim skips locked rows. The server
    ends a renewal's session once it is silent inside its transaction for longer than the
    renewal's bound, so the job is taken over within the catalogue's cap all the same.
    """
    frozen_job = jobs.stubborn.enqueue(seconds=5.0)  # sleeps on its first run only
    faults.gates.close("in_renewal")
    sleeper = faults.spawn("--queue", "default:1", hooks=True)
    faults.gates.wait("in_renewal", frozen_job.pk)
    sleeper.signal(signal.SIGSTOP)
    faults.gates.open("in_renewal")  # takes effect only once the worker is continued
    try:
        # The job's lease runs out at most LEASE_S after the stop: once the rescuer is ready, the
        # cap is counted from there (it is what a rescuer already running would see).
        rescuer = faults.spawn_ready("--queue", "default:1")
        wait_until(lambda: Job.objects.get(pk=frozen_job.pk).attempts == 2, RECOVERY_S, "the rescuer to claim the job")
        wait_until(lambda: Job.objects.get(pk=frozen_job.pk).status == Status.FINISHED, 30, "the rescue to finish")
    finally:
        sleeper.signal(signal.SIGCONT)
    wait_until(lambda: FENCED.search(sleeper.output()), 30, "the continued worker to learn it lost the lease")
    row = Job.objects.get(pk=frozen_job.pk)
    assert (row.status, row.attempts) == (Status.FINISHED, 2)
    assert checker.check({frozen_job.pk}).ok
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait(timeout=30) == 0


@one_leg
@only_on("sqlite", "postgres")
def test_stalled_heartbeat_loses_the_lease_and_the_late_completion_is_fenced(faults):
    # Sleeps on its first claim only: long enough for the rescuer to start on a busy machine.
    stalled = jobs.stubborn.enqueue(seconds=6.0)
    faults.gates.close("in_heartbeat")  # the heartbeat thread hangs, as on a stuck connection
    holder = faults.spawn("--queue", "default:1", hooks=True)
    faults.gates.wait("in_heartbeat", stalled.pk)
    rescuer = faults.spawn_ready("--queue", "default:1")
    wait_until(lambda: Effect.objects.filter(pid=rescuer.pid).exists(), RECOVERY_S + 6, "the rescuer to take the job")
    wait_until(lambda: FENCED.search(holder.output()), 15, "the holder's fenced completion")
    faults.gates.open("in_heartbeat")
    wait_until(lambda: Job.objects.get(pk=stalled.pk).status == Status.FINISHED, 15, "the rescuer's completion")

    row = Job.objects.get(pk=stalled.pk)
    assert (row.status, row.attempts) == (Status.FINISHED, 2) and [e["kind"] for e in row.error_list] == ["lease_expired"]
    verdict = checker.check({stalled.pk})
    assert verdict.ok and sorted(Effect.objects.values_list("token", flat=True)) == [1, 2], verdict
