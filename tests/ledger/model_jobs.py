"""Handlers of the model-based chaos test (``tests/faults/test_model_chaos.py``): one body, several limits.

Each handler writes a :class:`~tests.ledger.models.Span` row as it starts and completes it as it
returns, so the checker sees every execution, how long it ran and how it ended. What a handler
does comes from its arguments, which the scenario generator picks:

- ``tag``: the scenario's name for the job (``w2.m3``: member 3 of workflow 2), kept on the span;
- ``key``: the limit key of the types that have a ``Limit``;
- ``hold``: seconds of work; ``hold_first`` instead on an attempt 1, when given;
- ``stubborn``: ignores ``should_stop()``, as a handler blocked in a call would, so a timed-out
  one keeps running; a cooperative handler returns once asked to stop (outcome ``stopped``);
- ``fail``: ``"first"`` fails attempt 1; ``"until_retry"`` fails every attempt until an operator
  retried the job (its error history then holds ``max_attempts`` of these failures);
  ``"always"`` aborts (dead at once, no retry).

The job types differ only in their limits; ``solo`` and ``solo_too`` share keys, ``often`` and
``seldom`` share keys (a fast and a slow rate on one key).
"""

import json
import os
import time

from django_durq import Abort, Limit, job

from .models import Span

FAILURE = "fails as asked"


def _limit_key(key, **_):
    return key


def _run(ctx, tag, key="", hold=0.0, hold_first=0.0, stubborn=False, fail=""):
    from django_durq.models import Job

    start_us = time.time_ns() // 1000
    row = (
        Job.objects.filter(pk=ctx.job_id, claim_token=ctx.claim_token)
        .values_list("started_ms", "limit_key", "limit_running", "limit_rate", "limit_period_ms", "errors")
        .first()
    )
    claim_ms, limit_key, running, rate, period_ms, errors = row or (None, key or None, None, None, None, "[]")
    seen: dict[float, str] = {}  # confirmed_until (monotonic) -> "seen:until" on the wall clock
    _note_confirmed(ctx, None, seen)
    span = Span.objects.create(
        job_id=ctx.job_id,
        token=ctx.claim_token,
        attempt=ctx.attempt,
        pid=os.getpid(),
        queue=ctx.queue,
        key=limit_key or "",
        limit_running=running,
        limit_rate=rate,
        limit_period_ms=period_ms,
        claim_ms=claim_ms,
        start_us=start_us,
        tag=tag,
        confirmed=",".join(seen.values()),
    )
    seconds = hold_first if ctx.attempt == 1 and hold_first else hold
    outcome = "done"
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if not stubborn and ctx.should_stop():
            outcome = "stopped"
            break
        time.sleep(min(left, 0.02))
        _note_confirmed(ctx, span, seen)
    failed_before = sum(1 for entry in json.loads(errors or "[]") if FAILURE in str(entry.get("message", "")))
    failing = (
        fail == "always" or (fail == "first" and ctx.attempt == 1) or (fail == "until_retry" and failed_before < ctx.max_attempts)
    )
    if outcome == "done" and failing:
        outcome = "failed"
    Span.objects.filter(pk=span.pk).update(end_us=time.time_ns() // 1000, outcome=outcome)
    if outcome == "failed":
        if fail == "always":
            raise Abort(f"{tag} {FAILURE}")
        raise RuntimeError(f"{tag} {FAILURE} (attempt {ctx.attempt})")
    return tag


def _note_confirmed(ctx, span, seen):
    """Write on the span until when the lease is confirmed, each time a renewal moves it.

    The checker judges a takeover by when the old attempt's lease truly ran out; what the handler
    saw tells it when the last renewal before a stop came, where a keeper running late (a loaded
    host) would otherwise be taken for one that stopped renewing.
    """
    if ctx.confirmed_until in seen:
        return
    wall_ms = time.time() * 1000
    seen[ctx.confirmed_until] = f"{round(wall_ms)}:{round(wall_ms + (ctx.confirmed_until - time.monotonic()) * 1000)}"
    if span is not None:  # else written as the span is made
        Span.objects.filter(pk=span.pk).update(confirmed=",".join(seen.values()))


@job(name="model.work")
def work(ctx, tag, **behaviour):
    return _run(ctx, tag, **behaviour)


@job(name="model.solo", limit=Limit(max_running=1, key=_limit_key))
def solo(ctx, tag, **behaviour):
    return _run(ctx, tag, **behaviour)


@job(name="model.solo_too", limit=Limit(max_running=1, key=_limit_key))
def solo_too(ctx, tag, **behaviour):
    return _run(ctx, tag, **behaviour)


@job(name="model.pair", limit=Limit(max_running=2, key=_limit_key))
def pair(ctx, tag, **behaviour):
    return _run(ctx, tag, **behaviour)


@job(name="model.metered", limit=Limit(rate="3/s", key=_limit_key))
def metered(ctx, tag, **behaviour):
    return _run(ctx, tag, **behaviour)


@job(name="model.often", limit=Limit(rate="10/s", key=_limit_key))
def often(ctx, tag, **behaviour):
    return _run(ctx, tag, **behaviour)


@job(name="model.seldom", limit=Limit(rate="2/h", key=_limit_key))
def seldom(ctx, tag, **behaviour):
    return _run(ctx, tag, **behaviour)


TYPES = {definition.name: definition for definition in (work, solo, solo_too, pair, metered, often, seldom)}
