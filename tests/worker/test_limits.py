"""Flow control across real worker processes: limits hold however the workers race, and a crash frees its place.

Every handler appends a line per run to a log file (see ``tests.ledger.jobs._log_run``): key,
job id, attempt, claim time on the database's clock, handler start and end (epoch ms), pid.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest

from django_durq.models import Job, WorkerProcess
from tests.conftest import wait_until
from tests.ledger import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


class Run:
    def __init__(self, line: str) -> None:
        key, job_id, attempt, claimed, started, ended, pid = line.split()
        self.key, self.job_id, self.attempt = key, int(job_id), int(attempt)
        self.claimed, self.started, self.ended, self.pid = int(claimed), int(started), int(ended), int(pid)


def runs(log: Path) -> list[Run]:
    """The runs logged so far; a line a handler is still writing (no newline yet) is not one."""
    if not log.exists():
        return []
    complete = log.read_text().split("\n")[:-1]
    return [Run(line) for line in complete if line.strip()]


def most_at_once(ran: list[Run]) -> int:
    """The most handlers that ran at the same moment."""
    events = sorted([(run.started, 1) for run in ran] + [(run.ended, -1) for run in ran], key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, change in events:
        now += change
        peak = max(peak, now)
    return peak


def wait_for_runs(log: Path, count: int, timeout: float, workers: list) -> list[Run]:
    try:
        wait_until(lambda: len(runs(log)) >= count, timeout, f"{count} runs")
    except AssertionError as error:
        output = "\n".join(worker.output()[-3000:] for worker in workers)
        raise AssertionError(f"{error} ({len(runs(log))} seen)\n--- workers ---\n{output}") from None
    return runs(log)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_one_per_key_across_eight_workers_never_overlaps_and_starves_no_key(spawn_worker, tmp_path):
    log = tmp_path / "runs.log"
    keys = [f"video-{n}" for n in range(20)]
    workers = [spawn_worker("--queue", "default:4") for _ in range(8)]
    # Every worker is up and idle before the jobs come, so all eight race for them.
    wait_until(lambda: WorkerProcess.objects.count() == 8, 60, "eight workers to register")
    # Key by key: a claim that took jobs in plain order without skipping full keys would run one key at a time.
    jobs.one_per_key.enqueue_many([{"key": key, "log": str(log)} for key in keys for _ in range(50)])
    ran = wait_for_runs(log, 1000, 180, workers)
    assert len(ran) == 1000 and len({run.job_id for run in ran}) == 1000  # each job once
    by_key: dict[str, list[Run]] = defaultdict(list)
    for run in ran:
        by_key[run.key].append(run)
    assert {key: len(by_key[key]) for key in keys} == dict.fromkeys(keys, 50)
    for key, key_runs in by_key.items():
        key_runs.sort(key=lambda run: run.started)
        for before, after in itertools.pairwise(key_runs):
            assert after.started >= before.ended, f"{key}: job {after.job_id} started while job {before.job_id} ran"
    first = sorted(ran, key=lambda run: run.started)[:40]
    assert len({run.key for run in first}) >= 10, "keys queued later waited for the first key's jobs"
    assert len({run.pid for run in ran}) >= 3, "the jobs were not raced for by several workers"
    assert not Job.objects.filter(attempts__gt=1).exists()


def test_a_queue_limit_of_three_holds_across_four_workers(spawn_worker, tmp_path):
    log = tmp_path / "runs.log"
    jobs.capped.enqueue_many([{"log": str(log), "hold": 0.2} for _ in range(30)])
    workers = [spawn_worker("--queue", "video:4") for _ in range(4)]
    ran = wait_for_runs(log, 30, 120, workers)
    assert most_at_once(ran) == 3  # never more, and the limit is used
    assert len({run.job_id for run in ran}) == 30


def test_a_rate_of_ten_a_second_is_never_exceeded_across_four_workers(spawn_worker, tmp_path):
    log = tmp_path / "runs.log"
    jobs.metered.enqueue_many([{"log": str(log)} for _ in range(35)])
    workers = [spawn_worker("--queue", "webhooks:4") for _ in range(4)]
    ran = wait_for_runs(log, 35, 120, workers)
    claims = sorted(run.claimed for run in ran)  # starts as the database's clock logged them
    for n in range(len(claims) - 10):
        assert claims[n + 10] - claims[n] >= 1_000, f"11 starts within {claims[n + 10] - claims[n]} ms"
    # Held-back jobs start when the window lets them, not at some later poll.
    assert claims[10] - claims[0] < 2_000


def test_a_killed_holder_frees_its_key_once_its_process_is_gone_and_a_blocked_worker_stays_idle(spawn_worker, tmp_path):
    log = tmp_path / "runs.log"
    holder_env = {"DURQ_TEST_HEARTBEAT": "1"}
    held = jobs.one_per_key.using(lease=3).enqueue(key="k", log=str(log), hold=0.0, hold_first=60)
    holder = spawn_worker("--queue", "default:1", env=holder_env)
    wait_until(lambda: Job.objects.filter(pk=held.pk, status="running").exists(), 30, "the holder to start")
    blocked = jobs.one_per_key.using(lease=3).enqueue(key="k", log=str(log), hold=0.0)
    waiter = spawn_worker("--queue", "default:4", env={"DURQ_TEST_HEARTBEAT": "1", "DURQ_TEST_POLL": "0.05"})
    time.sleep(2)  # the waiter starts, looks, and finds the key taken
    # Held back, not failed: no attempt spent; and the waiting worker does not spin on it.
    spent_before = cpu_seconds(waiter.pid)
    time.sleep(3)
    spent = cpu_seconds(waiter.pid) - spent_before
    assert Job.objects.filter(pk=blocked.pk, status="waiting", attempts=0).exists()
    assert spent < 0.6, f"a worker whose only due job is held back used {spent:.2f} s of CPU in 3 s"
    os.killpg(holder.pid, signal.SIGKILL)
    holder.popen.wait()
    killed_at = time.time() * 1000
    ran = wait_for_runs(log, 2, 60, [waiter])
    rerun = next(run for run in ran if run.job_id == held.pk)
    after = next(run for run in ran if run.job_id == blocked.pk)
    assert rerun.attempt == 2 and rerun.pid == waiter.pid  # run again once its lease expired
    # The key's place freed once the holder's process was known gone (its lock released), and
    # the two took turns on it, in whichever order they became claimable.
    assert after.started >= killed_at
    first, second = sorted([rerun, after], key=lambda run: run.started)
    assert second.started >= first.ended
    # One read: the row may be deleted on success between two.
    assert list(Job.objects.filter(pk=blocked.pk).values_list("attempts", flat=True)) in ([], [1])


def test_limits_hold_when_claimers_stall_at_random(spawn_worker, tmp_path):
    """Workers that stall up to 200 ms where threads meet (between counting and claiming too)."""
    log = tmp_path / "runs.log"
    jobs.one_per_key.enqueue_many([{"key": f"k{n % 8}", "log": str(log)} for n in range(160)])
    jobs.capped.enqueue_many([{"log": str(log), "hold": 0.05} for _ in range(40)])
    chaos = {"DURQ_TEST_CHAOS": "200:0.3"}
    workers = [spawn_worker("--queue", "default:4", "--queue", "video:4", env=chaos) for _ in range(4)]
    ran = wait_for_runs(log, 200, 240, workers)
    assert len({run.job_id for run in ran}) == 200
    assert most_at_once([run for run in ran if run.key == "capped"]) <= 3
    for key in {run.key for run in ran} - {"capped"}:
        key_runs = sorted((run for run in ran if run.key == key), key=lambda run: run.started)
        for before, after in itertools.pairwise(key_runs):
            assert after.started >= before.ended, f"{key}: job {after.job_id} started while job {before.job_id} ran"
