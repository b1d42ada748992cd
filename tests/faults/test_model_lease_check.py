"""The model chaos test's lease check, on histories written by hand: two executions of one job
may overlap only where the older one's lease may truly have run out because its process was
stopped. It must not blame a keeper that ran late before a stop (a loaded host: seen in the soak
on MariaDB, a takeover 65 ms before the end the old check assumed), and must still catch a
takeover while a reading of the handler's shows the lease held."""

from __future__ import annotations

from tests.faults.model.driver import Blackout, Record
from tests.faults.model.history import History, SpanRow
from tests.faults.model.job_checks import check_executions

OLD_PID = 4242
NEW_PID = 4343
JOB_ID = 7
# The old attempt's handler read its lease at the claim (0) and after two renewals, the second
# 900 ms after the first, where the keeper renews every 500 ms: a keeper running late.
LATE_KEEPER = "10:2000,520:2500,1420:3400"
STOPPED = Blackout(pid=OLD_PID, began_ms=2_300, ended_ms=6_000, cause="stop")


def _span(id: int, token: int, pid: int, claim_ms: int, start_ms: int, end_ms: int, outcome: str, confirmed: str) -> SpanRow:
    return SpanRow(
        id=id, job_id=JOB_ID, token=token, attempt=token, pid=pid, queue="default", key="", limit_running=None,
        limit_rate=None, limit_period_ms=None, claim_ms=claim_ms, start_us=start_ms * 1000,
        end_us=end_ms * 1000, outcome=outcome, tag="j",
        confirmed=confirmed,
    )  # fmt: skip


def _overlaps(old_confirmed: str, taken_over_ms: int, blackouts: list[Blackout]) -> list[list[int]]:
    """The jobs check_executions blames when a second worker claims the job at ``taken_over_ms``
    and starts it 20 ms later, while the old handler (stopped, then resumed and told to stop) runs
    until 6,500."""
    old = _span(1, 1, OLD_PID, 0, 10, 6_500, "stopped", old_confirmed)
    new = _span(2, 2, NEW_PID, taken_over_ms, taken_over_ms + 20, taken_over_ms + 100, "done", f"{taken_over_ms + 20}:0")
    history = History(None, Record(blackouts=blackouts), [old, new], {}, {})  # type: ignore[arg-type]
    return [violation.jobs for violation in check_executions(history)]


def test_a_takeover_after_the_last_renewal_seen_before_a_stop_ran_out_is_no_violation():
    # The old check assumed a renewal at most 800 ms before the stop (lease until 3,500).
    assert _overlaps(LATE_KEEPER, 3_420, [STOPPED]) == []


def test_a_takeover_while_the_last_renewal_seen_still_holds_the_lease_is_a_violation():
    assert _overlaps(LATE_KEEPER, 3_300, [STOPPED]) == [[JOB_ID]]


def test_a_lease_that_ran_out_while_its_process_ran_is_no_stops_doing():
    # The keeper renewed nothing after 520 ms: the lease was out at 2,500, before the stop at 3,000.
    stopped_later = Blackout(pid=OLD_PID, began_ms=3_000, ended_ms=6_000, cause="stop")
    assert _overlaps("10:2000,520:2500", 2_700, [stopped_later]) == [[JOB_ID]]


def test_renewals_seen_during_a_blackout_keep_the_lease_held():
    # A stall that held other jobs' rows: this job's renewals went on.
    stall = Blackout(pid=OLD_PID, began_ms=2_300, ended_ms=6_000, cause="stall")
    assert _overlaps(f"{LATE_KEEPER},2600:4500,3100:5000", 3_420, [stall]) == [[JOB_ID]]


def test_a_takeover_after_a_renewal_seen_once_the_stop_ended_is_a_violation():
    stopped = Blackout(pid=OLD_PID, began_ms=2_300, ended_ms=3_000, cause="stop")
    # Stopped before the lease ran out at 3,400; renewed at 3,100 as the process resumed.
    assert _overlaps(f"{LATE_KEEPER},3110:5100", 3_420, [stopped]) == [[JOB_ID]]
    # Had the renewal failed (none seen), the lease would have been out from 3,400 on.
    assert _overlaps(LATE_KEEPER, 3_420, [stopped]) == []


def test_without_readings_before_the_stop_a_renewal_is_assumed_a_heartbeat_and_slack_before_it():
    # The handler started after the stop: a renewal 800 ms before the stop keeps the lease until 3,500.
    assert _overlaps("", 3_420, [STOPPED]) == [[JOB_ID]]
    assert _overlaps("", 3_520, [STOPPED]) == []
