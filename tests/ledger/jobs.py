"""Handlers used by the tests; discovered like any app's jobs.py."""

import os
import time
from datetime import timedelta

from django.db import transaction

from django_durq import Abort, Limit, Retry, job
from django_durq.clock import now_ms

from .models import Effect, Order


def record(ctx, tag=""):
    Effect.objects.create(job_id=ctx.job_id, token=ctx.claim_token, pid=os.getpid(), started_ms=ctx.started_ms, tag=tag)


@job(name="tests.noop")
def noop(ctx, **kwargs):
    return None


@job(name="tests.nap")
def nap(ctx, seconds=0.002, log=""):
    """A short job that writes nothing to the database: its completion is the only write it causes.

    With ``log``, appends "<job id> <epoch ms>" to that file as it returns.
    """
    time.sleep(seconds)
    if log:
        with open(log, "a") as ended:
            ended.write(f"{ctx.job_id} {time.time_ns() // 1_000_000}\n")


@job(name="tests.effect")
def effect(ctx, tag="", sleep=0.0, sleep_first=0.0):
    # sleep_first holds only the first attempt: a test that kills its worker can wait as long as a
    # loaded machine needs without the takeover's attempt waiting again.
    if sleep or (sleep_first and ctx.attempt == 1):
        time.sleep(sleep or sleep_first)
    with transaction.atomic():
        record(ctx, tag)


@job(name="tests.traced")
def traced(ctx):
    """Records the OpenTelemetry trace and span it runs in as its effect's tag: "<trace id>:<span id>"."""
    from opentelemetry import trace

    span = trace.get_current_span().get_span_context()
    record(ctx, f"{span.trace_id:032x}:{span.span_id:016x}")


@job(name="tests.effect_fast", queue="fast")
def effect_fast(ctx, tag=""):
    record(ctx, tag)


@job(name="tests.slow", queue="slow")
def slow(ctx, seconds=5.0, tag="slow", began=""):
    """Sleeps through any stop request; with ``began``, creates that file once the handler is running."""
    if began:
        open(began, "w").close()
    time.sleep(seconds)
    record(ctx, tag)


@job(name="tests.fail", max_attempts=3)
def fail(ctx, message="boom"):
    record(ctx, "fail")
    raise ValueError(message)


@job(name="tests.fail_until")
def fail_until(ctx, succeed_on=3):
    record(ctx, f"attempt{ctx.attempt}:{ctx.is_last_attempt()}")
    if ctx.attempt < succeed_on:
        raise RuntimeError(f"attempt {ctx.attempt} fails")
    return {"attempt": ctx.attempt}


@job(name="tests.raise_base")
def raise_base(ctx, kind="SystemExit"):
    import sys

    if kind == "SystemExit":
        raise SystemExit(3)
    if kind == "KeyboardInterrupt":
        raise KeyboardInterrupt
    if kind == "GeneratorExit":
        raise GeneratorExit
    if kind == "MemoryError":
        raise MemoryError("pretend")
    if kind == "RecursionError":

        def deep(n):
            return deep(n + 1) + 1

        deep(0)
    if kind == "BadStr":

        class BadStr(Exception):
            def __str__(self):
                raise RuntimeError("no str for you")

        raise BadStr()
    sys.exit(0)


@job(name="tests.retry_explicit")
def retry_explicit(ctx, seconds=30):
    if ctx.attempt == 1:
        raise Retry(after=timedelta(seconds=seconds), reason="not yet")
    record(ctx, "retried")


@job(name="tests.abort")
def abort(ctx):
    raise Abort("never going to work")


@job(name="tests.read_order")
def read_order(ctx, order_id):
    Order.objects.get(pk=order_id)
    record(ctx, "order")


@job(name="tests.until_stopped", lease=timedelta(seconds=30))
def until_stopped(ctx, seconds=30.0, tag="stopper", began=""):
    """Runs until asked to stop; with ``began``, creates that file once the handler is running.

    A claimed job is ``running`` in the table before a slot starts its handler, so tests that must
    signal a worker mid-handler wait for this file rather than for the status.
    """
    if began:
        open(began, "w").close()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx.should_stop():
            record(ctx, f"{tag}:stopped")
            return
        time.sleep(0.05)
    record(ctx, tag)


@job(name="tests.hang", timeout=timedelta(seconds=2))
def hang(ctx, seconds=60.0):
    time.sleep(seconds)
    record(ctx, "hang-returned")


@job(name="tests.die")
def die(ctx, code=137):
    record(ctx, "die")
    os._exit(code)


@job(name="tests.stamp")
def stamp(ctx, tag=""):
    Effect.objects.create(job_id=ctx.job_id, token=ctx.claim_token, pid=os.getpid(), started_ms=now_ms(), tag=tag)


@job(name="tests.progress")
def progress(ctx, steps=3):
    for step in range(steps):
        ctx.progress(step + 1, steps)
    record(ctx, "progress")


@job(name="tests.async_effect")
async def async_effect(ctx, tag="async"):
    from asgiref.sync import sync_to_async

    await sync_to_async(record)(ctx, tag)
    return tag


@job(name="tests.heartbeat")
def heartbeat(ctx):
    return ctx.heartbeat()


# --- handlers of the fault suite (tests/faults) ---------------------------------------------------

_leaked: list[bytes] = []


@job(name="tests.crash", max_attempts=3)
def crash(ctx, mode="exit"):
    """Takes its whole worker process down: os._exit, SIGKILL to itself, or a segfault."""
    import ctypes
    import signal

    record(ctx, "crash")
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "segv":
        ctypes.string_at(0)
    os._exit(137)


@job(name="tests.stop_aware")
def stop_aware(ctx, seconds=30.0, marker_dir=""):
    """First claim: polls should_stop() every 100 ms and notes when it turned true. Later claims finish."""
    if ctx.claim_token == 1:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if ctx.should_stop():
                with open(os.path.join(marker_dir, f"stopped.{ctx.job_id}"), "w") as marker:
                    marker.write(str(now_ms()))
                return
            time.sleep(0.1)
    record(ctx, "stop_aware")


@job(name="tests.cancels_itself")
def cancels_itself(ctx, tag="cancelled-while-running"):
    """Asks for its own cancel, as an operator would while it runs, and returns before any heartbeat."""
    from django_durq.ops.acting import cancel

    cancel([ctx.job_id])
    record(ctx, tag)


@job(name="tests.stubborn")
def stubborn(ctx, seconds=30.0):
    """First claim: sleeps through any stop request. Later claims finish at once."""
    if ctx.claim_token == 1:
        time.sleep(seconds)
    record(ctx, "stubborn")


@job(name="tests.bad_result", max_attempts=1)
def bad_result(ctx):
    return {"when": object()}


@job(name="tests.leak")
def leak(ctx, megabytes=1):
    _leaked.append(b"x" * (megabytes * 1_048_576))
    record(ctx, "leak")


@job(name="tests.digest")
def digest(ctx, text=""):
    import hashlib

    record(ctx, hashlib.sha256(text.encode("utf-8")).hexdigest())


# --- schedules of tests/schedules/test_cron.py: declared only in processes started with DURQ_TEST_CRON ------

if os.environ.get("DURQ_TEST_CRON") == "every-second":
    from django_durq import schedule

    schedule("tests.every-second", "* * * * * *", noop, kwargs={"tag": "cron"})
elif os.environ.get("DURQ_TEST_CRON") == "interval":
    from django_durq import schedule

    schedule("tests.every-second-interval", job=stamp, every=1, args=["every-second"])
elif os.environ.get("DURQ_TEST_CRON") == "bad":
    from django_durq import schedule

    schedule("tests.bad-schedule", "61 * * * *", noop, timezone="Mars/Olympus")


# Handlers with everyday names and failures: the admin's browser tests and its screenshots use them.
@job(name="video.encode", queue="slow", max_attempts=3)
def encode_video(ctx, video_id, preset="1080p"):
    raise RuntimeError(f"ffmpeg exited with status 1 for video {video_id} ({preset}): moov atom not found")


@job(name="billing.charge_card", max_attempts=3)
def charge_card(ctx, invoice_id, amount_cents):
    raise ConnectionError(f"payment gateway timed out after 30 s (invoice {invoice_id})")


@job(name="email.send_receipt", queue="fast", max_attempts=3)
def send_receipt(ctx, order_id, to):
    raise ValueError(f"invalid recipient address {to!r}")


@job(name="tests.cpu")
def cpu(ctx, seconds=6.0):
    """Pure-Python CPU work: the interpreter switches threads, so heartbeats keep going."""
    deadline = time.monotonic() + seconds
    spins = 0
    while time.monotonic() < deadline:
        spins += sum(range(1000))
    record(ctx, "cpu")


@job(name="tests.gil", queue="slow")
def gil(ctx, seconds=4.0):
    """One C call that holds the GIL: no other thread of the process runs until it returns."""
    import ctypes

    ctypes.PyDLL(None).sleep(int(seconds))
    record(ctx, "gil")


# --- handlers of the runtime invariant tests (tests/faults/test_invariants.py, test_chaos.py) -----


@job(name="tests.outlive_timeout", timeout=timedelta(seconds=5), max_attempts=3)
def outlive_timeout(ctx, first=8.0, second=4.0):
    """Attempt 1 ignores its timeout and returns long after it; attempt 2 runs past one lease and finishes."""
    if ctx.attempt == 1:
        time.sleep(first)
        return
    time.sleep(second)
    record(ctx, "outlived")


@job(name="tests.sleeper")
def sleeper(ctx, seconds=30.0):
    """Sleeps through any stop request, every attempt."""
    time.sleep(seconds)
    record(ctx, "slept")


@job(name="tests.overstay", max_attempts=5)
def overstay(ctx, first=15.0, later=4.0):
    """Sleeps through any stop request: ``first`` seconds on the first claim, ``later`` on every other."""
    time.sleep(first if ctx.claim_token == 1 else later)
    record(ctx, "overstay")


@job(name="tests.lease_watch")
def lease_watch(ctx, seconds=8.0):
    """Runs ``seconds`` whatever it hears, and records every reason to stop it saw (``reasons:<sorted,…>``)."""
    seen = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        reason = ctx.stop_reason()
        if reason is not None:
            seen.add(reason)
        time.sleep(0.05)
    record(ctx, "reasons:" + ",".join(sorted(seen)))


@job(name="tests.retry_naive")
def retry_naive(ctx):
    from datetime import datetime

    raise Retry(after=datetime.now())  # naive: the mistake under test


@job(name="tests.autocommit_off")
def autocommit_off(ctx, tag="autocommit-off"):
    """Turns autocommit off on the queue's own connection and returns with the transaction open."""
    transaction.set_autocommit(False)
    record(ctx, tag)


@job(name="tests.span", max_attempts=3)
def span(ctx, sleep=0.0, fail_first=False):
    """Records its start and end (``span:<end ms>``), so overlapping executions of one job show."""
    from django_durq.clock import now_ms as clock_now

    started = clock_now()
    if sleep:
        deadline = time.monotonic() + sleep
        while time.monotonic() < deadline and not ctx.should_stop():
            time.sleep(0.01)
    if fail_first and ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    ended = clock_now()
    Effect.objects.create(job_id=ctx.job_id, token=ctx.claim_token, pid=os.getpid(), started_ms=started, tag=f"span:{ended}")


# Workers started with DURQ_TEST_SLOW_RECEIVERS=<seconds> have job_dead and job_finished receivers
# that take that long, like a webhook would; DURQ_TEST_RECORD_EXC_INFO=1 makes a job_dead receiver
# record which exception sys.exc_info() held when it ran.
if os.environ.get("DURQ_TEST_SLOW_RECEIVERS"):
    from django_durq.signals import job_dead, job_finished

    def _slow_receiver(sender, **kwargs):
        time.sleep(float(os.environ["DURQ_TEST_SLOW_RECEIVERS"]))

    job_dead.connect(_slow_receiver, weak=False)
    job_finished.connect(_slow_receiver, weak=False)

if os.environ.get("DURQ_TEST_RECORD_EXC_INFO"):
    import sys

    from django_durq.signals import job_dead as _job_dead

    def _record_exc_info(sender, job_id, **kwargs):
        kind = sys.exc_info()[0]
        tag = f"dead-exc:{kind.__name__ if kind is not None else None}"
        Effect.objects.create(job_id=job_id, token=0, pid=os.getpid(), started_ms=now_ms(), tag=tag)

    _job_dead.connect(_record_exc_info, weak=False)


def _log_run(ctx, log, key, hold):
    """Append "<key> <job id> <attempt> <claimed at> <started> <ended> <pid>" (epoch ms) to ``log``.

    The claim time is the row's, as the claim wrote it; start and end are the handler's.
    """
    from django_durq.models import Job

    claimed = Job.objects.filter(pk=ctx.job_id).values_list("started_ms", flat=True).first()
    started = time.time_ns() // 1_000_000
    time.sleep(hold)
    ended = time.time_ns() // 1_000_000
    with open(log, "a") as runs:
        runs.write(f"{key} {ctx.job_id} {ctx.attempt} {claimed} {started} {ended} {os.getpid()}\n")


@job(name="tests.one_per_key", limit=Limit(max_running=1, key=lambda key, **_: key))
def one_per_key(ctx, key, log, hold=0.005, hold_first=0.0):
    """At most one job of each ``key`` runs at once, across every worker."""
    _log_run(ctx, log, key, hold_first if ctx.attempt == 1 and hold_first else hold)


@job(name="tests.capped", queue="video")
def capped(ctx, log, hold=0.2):
    """Runs in the queue "video", which DURQ["QUEUES"] limits to 3 running jobs across every worker."""
    _log_run(ctx, log, "capped", hold)


@job(name="tests.metered", queue="webhooks")
def metered(ctx, log, hold=0.0):
    """Runs in the queue "webhooks", which DURQ["QUEUES"] limits to 10 starts a second."""
    _log_run(ctx, log, "metered", hold)


@job(name="tests.rated_per_key", limit=Limit(rate="4/s", key=lambda key, **_: key))
def rated_per_key(ctx, key, log):
    _log_run(ctx, log, key, 0.0)


@job(name="tests.step")
def step(ctx, tag, log="", fail=False, hold=0.0):
    """A workflow step: logs "<tag> <job id> <attempt> <started> <ended> <pid> <upstream tags…>"; returns its tag."""
    upstream = [u.result for u in ctx.dependencies()]
    started = time.time_ns() // 1_000_000
    if hold:
        time.sleep(hold)
    if fail:
        raise Abort(f"{tag} fails as asked")
    if log:
        with open(log, "a") as runs:
            ended = time.time_ns() // 1_000_000
            runs.write(f"{tag} {ctx.job_id} {ctx.attempt} {started} {ended} {os.getpid()} {' '.join(map(str, upstream))}\n")
    return tag


@job(name="tests.summary")
def summary(ctx, log=""):
    """A fan-in callback: logs and returns how the jobs it waited for ended."""
    ended = ctx.dependencies()
    counts = {status: sum(1 for u in ended if u.status == status) for status in ("finished", "dead", "cancelled")}
    if log:
        with open(log, "a") as runs:
            runs.write(
                f"summary {ctx.job_id} {ctx.attempt} {counts['finished']} {counts['dead']} {counts['cancelled']} {os.getpid()}\n"
            )
    return counts


# --- handlers of the flow-control race tests (tests/db/test_flow_races.py) ---------------------------


@job(name="tests.key_mate", queue="fast", limit=Limit(max_running=1, key=lambda key, **_: key))
def key_mate(ctx, key, log, hold=0.005):
    """Another job type in another queue whose limit key is ``one_per_key``'s: the two take turns."""
    _log_run(ctx, log, key, hold)


@job(
    name="tests.keyed_overrun",
    limit=Limit(max_running=1, key=lambda key, **_: key),
    timeout=timedelta(seconds=1),
    max_attempts=1,
)
def keyed_overrun(ctx, key, log, hold=0.0):
    """Ignores its 1 s timeout for ``hold`` seconds: the worker abandons its thread, which runs on."""
    _log_run(ctx, log, key, hold)


@job(name="tests.hourly_per_key", limit=Limit(rate="2/h", key=lambda key, **_: key))
def hourly_per_key(ctx, key, log):
    _log_run(ctx, log, key, 0.0)


@job(name="tests.paced", queue="default")
def paced(ctx, log, hold=0.15):
    """A job of the queue "default" that takes ``hold`` seconds: long enough to be claimed ahead of a slot."""
    _log_run(ctx, log, "paced", hold)


# --- handlers of the rolling-deploy tests (tests/faults/test_deploys.py) ------------------------------
# DURQ_TEST_CODE says which release of the code a process runs: "old" lacks the job type added
# since and still has the handler's former signature; anything else (the test process itself) is
# the new release.
NEW_RELEASE = os.environ.get("DURQ_TEST_CODE", "new") != "old"

if NEW_RELEASE:

    @job(name="tests.added_in_new", max_attempts=2)
    def added_in_new(ctx, tag="added"):
        record(ctx, tag)

    @job(name="tests.reshaped")
    def reshaped(ctx, width, height):
        record(ctx, f"{width}x{height}")

else:

    @job(name="tests.reshaped")
    def reshaped(ctx, size):  # type: ignore[misc]  # the former signature
        record(ctx, f"size:{size}")


@job(name="tests.type_error_inside", max_attempts=2)
def type_error_inside(ctx, tag=""):
    """Takes its arguments, then raises the TypeError a bug inside a handler would."""
    record(ctx, tag)
    raise TypeError("slice indices must be integers or None or have an __index__ method")


@job(name="tests.stop_reason")
def stop_reason(ctx, seconds=30.0, began=""):
    """First claim: runs until told to stop, and records the reason and when (``stopped:<reason>:<epoch ms>``).
    Later claims record ``rerun`` at once.

    With ``began``, creates that file once the handler is running.
    """
    if ctx.claim_token > 1:
        record(ctx, "rerun")  # started_ms: when this later attempt began
        return
    if began:
        open(began, "w").close()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx.should_stop():
            tag = f"stopped:{ctx.stop_reason()}:{now_ms()}"
            Effect.objects.create(job_id=ctx.job_id, token=ctx.claim_token, pid=os.getpid(), started_ms=ctx.started_ms, tag=tag)
            return
        time.sleep(0.02)
    record(ctx, "ran-out")


# --- receivers of tests/worker/test_run_signals.py: connected only in processes started with DURQ_TEST_RUN_SIGNALS ---

if os.environ.get("DURQ_TEST_RUN_SIGNALS") == "raise":
    from django_durq.signals import job_postrun, job_prerun

    def _prerun_records_then_raises(sender, job_id, **kwargs):
        Effect.objects.create(job_id=job_id, token=0, pid=os.getpid(), started_ms=now_ms(), tag="prerun")
        raise RuntimeError("a prerun receiver that fails")

    def _postrun_raises(sender, **kwargs):
        raise RuntimeError("a postrun receiver that fails")

    job_prerun.connect(_prerun_records_then_raises, weak=False)
    job_postrun.connect(_postrun_raises, weak=False)

# The model-based chaos test's handlers live in a module of their own; importing it registers them.
from . import model_jobs  # noqa: E402, F401
