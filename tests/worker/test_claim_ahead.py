"""How far ahead a pool claims: judged from its jobs' times on the slots, not misled by a slot whose process lost its core."""

from __future__ import annotations

from django_durq.clock import ManualClock
from django_durq.conf import get_settings
from django_durq.worker.claim_ahead import BUFFER_MAX_WAIT_S, MAX_AHEAD
from django_durq.worker.pool import Pool
from django_durq.worker.runtime import Runtime

# A no-op job's median time on a slot, and the same job's when its process waited for a core
# mid-job: both measured with 16 worker processes on 2 cores.
QUICK_S = 17e-6
DESCHEDULED_S = 0.030


def pool(concurrency: int = 2) -> Pool:
    built = Pool("default", concurrency, Runtime(settings=get_settings(), clock=ManualClock(0)))
    assert built.prefetch_ms == 20, "these cases are worked out for the default PREFETCH of 20 ms"
    return built


def test_a_job_whose_process_lost_its_core_does_not_cut_the_claim_ahead():
    slots = pool()
    targets = []
    for n in range(1, 301):
        slots._learn_job_time(DESCHEDULED_S if n % 100 == 0 else QUICK_S)
        targets.append(slots._target(longest_running_s=0.0))
    # One job in a hundred descheduled: the pool still holds as many ahead as for quick jobs alone
    # (the plain mean fell to a dozen jobs at each such job, and every claim then took a few).
    assert min(targets) == 2 + MAX_AHEAD, targets


def test_jobs_that_really_got_longer_cut_the_claim_ahead_within_a_few_dozen():
    slots = pool()
    for _ in range(200):
        slots._learn_job_time(QUICK_S)
    assert slots._target(longest_running_s=0.0) == 2 + MAX_AHEAD
    for _ in range(40):
        slots._learn_job_time(0.005)
    # Jobs of 5 ms: two slots start 8 of them within the 20 ms horizon.
    assert slots._target(longest_running_s=0.0) <= 2 + 12


def test_a_slot_busy_past_the_horizon_stops_the_claim_ahead_only_once_its_job_is_long():
    slots = pool()
    for _ in range(200):
        slots._learn_job_time(QUICK_S)
    # 30 ms on a slot is a job of microseconds whose process waited for a core as often as a long job.
    assert slots._target(longest_running_s=DESCHEDULED_S) == 2 + MAX_AHEAD
    # Past the buffer's own wait bound it is a long job: jobs held behind it would be handed back.
    assert slots._target(longest_running_s=BUFFER_MAX_WAIT_S + 0.001) == 2
