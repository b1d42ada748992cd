"""Flow-control promises judged from the ledger: limits per key and per queue, rates, delivery, pause.

- ``key_limit`` / ``queue_limit``: when a handler starts, the handlers of its key (of its queue)
  still running number fewer than the limit. A handler counts for as long as it runs, timed out
  or not, until it returns or its process is gone; the only exception is a handler whose lease
  may truly have expired (:meth:`History.lapsed`: its process was stopped or could not renew).
- ``rate``: no start is admitted while its key (its queue) already started ``count`` in the
  sliding window of the period that ends at that claim, on the claims' own clock. The ledger sees
  the starts whose handler ran, a subset of the starts the queue logged, so what it finds is real.
- ``rate_delivered``: a burst of jobs held back only by its queue's rate starts as fast as the
  rate lets it: its last job is claimed at most ``DELIVERY_SLACK_MS`` after the rate allowed it,
  without waiting for a poll; a pause of the queue, or a fault that touches its claims, before the
  burst is done may delay it (see ``_allowed``).
- ``pause``: no job of a paused queue starts later than ``PAUSE_LATENCY_MS`` after the pause
  returned, nor is one claimed after it, until the resume is asked, jobs claimed ahead included.
  A claim's time is the one it writes, which a limited claim caps at its worker's claim bound
  (``AttemptBook.claim_clock``): a worker whose renewals a stall held up may write a time before
  the resume for a claim made after it, so such a claim is judged by its start alone. A worker
  stopped (``SIGSTOP``) in the middle of a limited claim writes the bound it read before the stop,
  though its claim's statements ran after it resumed: a time written inside a stop counts as
  the stop's end, the earliest the claim can have been made.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from functools import partial

from .driver import Action
from .history import CLOCK_TOLERANCE_MS, HEARTBEAT_MS, LEASE_MS, History, SpanRow, Violation

# How long after a pause returns a job a worker had claimed ahead may still start: a heartbeat
# (the workers' renewals, which can carry the news) and a quarter of a second more. Match it to
# the bound docs/flow-control.md states.
PAUSE_LATENCY_MS = HEARTBEAT_MS + 250
# How much later than the rate allows a burst's last job may be claimed (wake-up, stalls, load).
DELIVERY_SLACK_MS = 2_000


def check_limits(history: History) -> list[Violation]:
    by_key: dict[str, list[SpanRow]] = defaultdict(list)
    by_queue: dict[str, list[SpanRow]] = defaultdict(list)
    for span in history.spans:
        if span.key and span.limit_running:
            by_key[span.key].append(span)
        if history.queue_limits.get(span.queue, (None, None))[0]:
            by_queue[span.queue].append(span)
    found = []
    for key, spans in sorted(by_key.items()):
        found += _crowding(history, "key_limit", f"key {key!r}", spans, lambda span: span.limit_running)
    for queue, spans in sorted(by_queue.items()):
        found += _crowding(history, "queue_limit", f"queue {queue!r}", spans, partial(_queue_limit, history))
    return found


def _queue_limit(history: History, span: SpanRow) -> int | None:
    return history.queue_limits[span.queue][0]


def _crowding(
    history: History, invariant: str, scope: str, spans: list[SpanRow], limit_of: Callable[[SpanRow], int | None]
) -> list[Violation]:
    found = []
    for started in spans:
        limit = limit_of(started)
        if not limit:
            continue
        # A pair is excused when one of them had lost its place (its lease truly lapsed) by the time
        # the other was claimed: the one still running, or a stale one that starts late.
        others = [
            span
            for span in spans
            if span is not started
            and history.running_at(span, started.start)
            and not history.lapsed(span, started.claimed)
            and not history.lapsed(started, span.claimed)
        ]
        if len(others) + 1 > limit:
            crowd = sorted([*others, started], key=lambda span: span.start)
            message = (
                f"{scope} (max_running {limit}): {len(crowd)} handlers ran at once when job {started.job_id} started"
                f" at {history.t(started.start)}, none of them with a lapsed lease"
            )
            found.append(Violation(invariant, message, [span.job_id for span in crowd], crowd))
    return found


def check_rates(history: History) -> list[Violation]:
    found = []
    by_key: dict[str, list[SpanRow]] = defaultdict(list)
    by_queue: dict[str, list[SpanRow]] = defaultdict(list)
    for span in history.spans:
        if span.claim_ms is None:
            continue  # the row moved on before the handler read its claim time
        if span.key and span.limit_rate and span.limit_period_ms:
            by_key[span.key].append(span)
        if history.queue_limits.get(span.queue, (None, None))[1]:
            by_queue[span.queue].append(span)
    for key, spans in sorted(by_key.items()):
        for started in spans:
            count, period = started.limit_rate or 0, started.limit_period_ms or 0
            found += _window(history, f"key {key!r}", spans, started, count, period, same_limit=True)
    for queue, spans in sorted(by_queue.items()):
        count, period = history.queue_limits[queue][1]  # type: ignore[misc]
        for started in spans:
            found += _window(history, f"queue {queue!r}", spans, started, count, period, same_limit=False)
    return found


def _window(
    history: History, scope: str, spans: list[SpanRow], started: SpanRow, count: int, period: int, *, same_limit: bool
) -> list[Violation]:
    """Starts of the scope in the window of ``period`` ending at ``started``'s claim, itself included.

    Starts of the same claim (the same instant) are counted only when they carry the same limit:
    one claim admits its jobs one after another, and the ledger cannot tell their order.
    """
    at = started.claimed
    earlier = [s for s in spans if at - period + CLOCK_TOLERANCE_MS < s.claimed < at - CLOCK_TOLERANCE_MS]
    same = [
        s
        for s in spans
        if abs(s.claimed - at) <= CLOCK_TOLERANCE_MS
        and (not same_limit or (s.limit_rate, s.limit_period_ms) == (started.limit_rate, started.limit_period_ms))
    ]
    if len(earlier) + len(same) <= count:
        return []
    window = sorted([*earlier, *same], key=lambda s: s.claimed)
    message = (
        f"{scope} (rate {count} per {period} ms): job {started.job_id} was claimed at {history.t(at)} after"
        f" {len(window) - 1} other starts in the window of {period} ms before it"
    )
    return [Violation("rate", message, [s.job_id for s in window], window)]


def check_delivery(history: History) -> list[Violation]:
    found = []
    for batch in history.scenario.batches:
        queues = {job.queue for job in batch.jobs}
        if len(queues) != 1 or any(job.key for job in batch.jobs):
            continue
        queue = queues.pop()
        rate = history.queue_limits.get(queue, (None, None))[1]
        if rate is None:
            continue
        count, period = rate
        ids = [history.record.ids[job.tag] for job in batch.jobs if job.tag in history.record.ids]
        first_claims = {job_id: min(s.claimed for s in history.by_job[job_id]) for job_id in ids if job_id in history.by_job}
        if not ids or len(first_claims) < len(ids):
            continue  # a job never ran: the stuck check says so
        queued = max(history.record.enqueued_ms[job_id] for job_id in ids)
        last_id, last = max(first_claims.items(), key=lambda item: item[1])
        allowed = _allowed(history, queue, queued + (math.ceil(len(ids) / count) - 1) * period, period)
        if last > allowed + DELIVERY_SLACK_MS:
            slowest = sorted(history.by_job[last_id], key=lambda s: s.start)[:1]
            message = (
                f"queue {queue!r} (rate {count} per {period} ms): {len(ids)} jobs queued at {history.t(queued)} could all"
                f" start by {history.t(allowed)} (pauses and faults counted), but the last was claimed at {history.t(last)}"
            )
            found.append(Violation("rate_delivered", message, [last_id], slowest))
    return found


def _allowed(history: History, queue: str, ideal: float, period: int) -> float:
    """When a burst that the rate alone would let finish at ``ideal`` may rightly finish, pauses and faults counted.

    Each pause of ``queue`` that begins before the burst is done (or within the slack a burst may
    take beyond that, as load may make it) delays it by its length; each
    fault that could touch the queue's claims (a worker serving it killed or stopped, a stall of
    one that holds its jobs, any stall on SQLite) by its length (a stopped or stalled worker may
    hold the queue's turn), plus a lease (the jobs it had claimed wait for their leases to expire)
    plus a period (those claims spent the rate).
    """
    serving = {pid for pid, slot in history.record.slots.items() if queue in dict(history.scenario.workers[slot].queues)}
    done = ideal
    for action in sorted(history.record.actions, key=lambda a: a.began_ms):
        kind, lasted = action.op.kind, action.op.seconds * 1000
        if action.began_ms > done + DELIVERY_SLACK_MS:
            break
        if kind == "pause" and action.op.target == queue:
            done += lasted
        elif _touches(history, action, queue, serving):
            done += lasted + LEASE_MS + period
    return done


def _touches(history: History, action: Action, queue: str, serving: set[int]) -> bool:
    """Whether a fault could hold back the claims of ``queue``: it hit a worker that serves it, or one
    that makes limited claims, whose turn for the limit keys every limited claim takes
    (``db/gates.py``): a claimer stopped while it holds that turn holds up the others' limited claims."""
    if action.op.kind in ("kill", "stop"):
        served = dict(history.scenario.workers[int(action.op.target)].queues)
        return queue in served or any(_claims_limited(history, other) for other in served)
    return action.op.kind == "stall" and action.result.get("locked") is not None and bool(serving & set(action.result["pids"]))


def _claims_limited(history: History, queue: str) -> bool:
    """Whether the workers' claims of ``queue`` are limited claims: it has limits, or jobs with a key."""
    limits = history.queue_limits.get(queue, (None, None))
    if limits != (None, None):
        return True
    return any(job.queue == queue and job.key for batch in history.scenario.batches for job in batch.jobs)


def check_pause(history: History) -> list[Violation]:
    found = []
    actions = sorted(history.record.actions, key=lambda a: a.began_ms)
    for index, pause in enumerate(actions):
        if pause.op.kind != "pause" or not pause.result.get("paused"):
            continue
        queue = pause.op.target
        resume = next((a for a in actions[index + 1 :] if a.op.kind == "resume" and a.op.target == queue), None)
        until = resume.began_ms if resume is not None else history.record.quiet_ms
        # A claim's time is read before its statement runs, which may wait (for SQLite's write
        # lock, a stall, an injected delay): the claim was made between that time and the job's
        # start. It was made during the pause only if both lie inside it.
        late = [
            span
            for span in history.spans
            if span.queue == queue
            and (
                pause.ended_ms + PAUSE_LATENCY_MS < span.start < until
                or (
                    pause.ended_ms + CLOCK_TOLERANCE_MS < _earliest_claim(history, span)
                    and span.start < until - CLOCK_TOLERANCE_MS
                )
            )
        ]
        if late:
            late.sort(key=lambda span: span.start)
            message = (
                f"queue {queue!r} paused at {history.t(pause.ended_ms)} (returned), resumed at {history.t(until)}:"
                f" {len(late)} jobs started more than {PAUSE_LATENCY_MS} ms after the pause or were claimed during it,"
                f" the last at {history.t(late[-1].start)}"
            )
            found.append(Violation("pause", message, [span.job_id for span in late], late))
    return found


def _earliest_claim(history: History, span: SpanRow) -> float:
    """The earliest moment ``span``'s claim can have been made, judged by the time it wrote.

    A time written inside a stall of its worker may be capped (its renewals were held up), so it
    tells nothing: the claim is judged by its start alone (-inf). One written inside a stop was
    capped too, but a stopped process makes no claim: it was made at the stop's end or later.
    """
    if span.claim_ms is None:
        return -math.inf
    around = [b for b in history.blackouts.get(span.pid, []) if b.began_ms <= span.claim_ms <= b.ended_ms]
    if any(blackout.cause == "stall" for blackout in around):
        return -math.inf
    return next((blackout.ended_ms for blackout in around if blackout.cause == "stop"), float(span.claim_ms))
