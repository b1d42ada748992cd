"""What a caller hands to enqueue() is refused where it is given, before any SQL, on every database.

A refused option or argument raises ``ValueError`` or ``TypeError`` naming what is wrong, writes
nothing, and leaves the caller's open transaction usable.
"""

from __future__ import annotations

import inspect
import random
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import transaction

import django_durq
from django_durq import job
from django_durq.handlers.registry import JobDefinition, registry, unknown_job_message
from django_durq.models import Job
from tests.ledger import jobs
from tests.ledger.models import Order

pytestmark = pytest.mark.django_db


@pytest.fixture
def transcode() -> Iterator[JobDefinition]:
    @job(name="tests.validation.transcode")
    def transcode(ctx, video_id, quality="720p"):
        return None

    yield transcode
    registry.remove(transcode.name)


# (option, value, exception, message): one message whether @job or using() is given the value.
BAD_OPTIONS = [
    ("queue", "a:b", ValueError, "queue name 'a:b' is not valid: 1 to 100 characters, no ':'"),
    ("queue", "q" * 101, ValueError, "is not valid: 1 to 100 characters"),
    ("queue", "", ValueError, "queue name '' is not valid"),
    ("queue", 7, TypeError, "queue must be a queue name (str), not int"),
    ("priority", 40_000, ValueError, "priority 40000 is out of range (-32768 to 32767)"),
    ("priority", "high", TypeError, "priority must be a whole number from -32768 to 32767, not str"),
    ("priority", True, TypeError, "not bool"),
    ("max_attempts", 0, ValueError, "max_attempts is 0; it must be at least 1"),
    ("max_attempts", -3, ValueError, "max_attempts is -3; it must be at least 1"),
    ("max_attempts", 2.5, TypeError, "max_attempts must be a whole number of at least 1, not float"),
    ("lease", 0, ValueError, "lease is 0; it must be at least a millisecond"),
    ("lease", -30, ValueError, "lease is -30; it must be at least a millisecond"),
    ("lease", timedelta(seconds=-1), ValueError, "lease is datetime.timedelta(days=-1, seconds=86399)"),
    ("lease", float("nan"), ValueError, "lease is nan; it must be a finite duration"),
    ("lease", "60", TypeError, "lease must be a timedelta or a number of seconds, not str"),
    ("timeout", 0, ValueError, "timeout is 0; it must be at least a millisecond"),
    ("timeout", -1.5, ValueError, "timeout is -1.5; it must be at least a millisecond"),
    ("timeout", float("inf"), ValueError, "timeout is inf; it must be a finite duration"),
]

# Options only an enqueue has.
BAD_ENQUEUE_OPTIONS = [
    ("unique", "", ValueError, "unique must be a non-empty string of at most 255 characters"),
    ("unique", "k" * 256, ValueError, "unique must be a non-empty string of at most 255 characters"),
    ("unique", 42, TypeError, "unique must be a string (the dedupe key), not int"),
    ("run_at", datetime(2030, 1, 1), ValueError, "run_at must be an aware datetime"),
    ("run_at", "2030-01-01T00:00:00Z", TypeError, "run_at must be an aware datetime, not str"),
    ("run_in", -5, ValueError, "run_in is -5; it must be zero or more"),
    ("run_in", "soon", TypeError, "run_in must be a timedelta or a number of seconds, not str"),
]


@pytest.mark.parametrize(("option", "value", "error", "message"), BAD_OPTIONS)
def test_job_refuses_a_bad_option_at_decoration(option, value, error, message):
    with pytest.raises(error, match=re.escape(message)):

        @job(name="tests.validation.never", **{option: value})
        def never(ctx):
            return None

    assert registry.get("tests.validation.never") is None


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"name": ""}, ValueError, "job name '' is not valid: a string of 1 to 200 characters"),
        ({"name": "n" * 201}, ValueError, "a string of 1 to 200 characters"),
        ({"backoff": {"base": 1}}, TypeError, "backoff must be a django_durq.handlers.backoff.Backoff, not dict"),
        ({"cron": 5}, TypeError, "cron must be a cron expression (str), not int"),
    ],
)
def test_job_refuses_a_bad_name_backoff_or_cron(options, error, message):
    with pytest.raises(error, match=re.escape(message)):
        job(**options)(lambda ctx: None)


@pytest.mark.parametrize(("option", "value", "error", "message"), BAD_OPTIONS + BAD_ENQUEUE_OPTIONS)
def test_using_refuses_a_bad_option_with_the_message_job_gives(option, value, error, message):
    with pytest.raises(error, match=re.escape(message)):
        jobs.noop.using(**{option: value})
    assert Job.objects.count() == 0


def test_run_at_and_run_in_together_are_refused_but_a_later_using_replaces_an_earlier_due_time():
    with pytest.raises(ValueError, match="pass run_at or run_in, not both"):
        jobs.noop.using(run_at=datetime(2030, 1, 1, tzinfo=UTC), run_in=5)
    queued = jobs.noop.using(run_at=datetime(2030, 1, 1, tzinfo=UTC)).using(run_in=0).enqueue()
    assert queued.run_at_ms == queued.created_ms


def test_a_lease_shorter_than_a_second_is_refused_at_enqueue_and_by_job(settings):
    # The lease keeper renews a lease three times per lease whatever HEARTBEAT_INTERVAL is, so
    # a lease shorter than two heartbeats is kept; one shorter than a second is refused.
    settings.DURQ = {**settings.DURQ, "LEASE": 30, "HEARTBEAT_INTERVAL": 5}
    with pytest.raises(ValueError, match=r"lease is 0.5; it must be at least 1 second"):
        jobs.noop.using(lease=0.5).enqueue()
    with pytest.raises(ValueError, match=r"lease is 0.5; it must be at least 1 second"):
        job(name="tests.short-lease", lease=0.5)(lambda ctx: None)
    assert jobs.noop.using(lease=9).enqueue().lease_ms == 9_000
    assert Job.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "bad_enqueue",
    [
        lambda: jobs.noop.using(lease=-1).enqueue(),
        lambda: jobs.noop.using(max_attempts=-1).enqueue(),
        lambda: jobs.noop.using(timeout=-1).enqueue(),
        lambda: jobs.noop.using(lease=0.001).enqueue(),
        lambda: jobs.effect.enqueue(tga="x"),
        lambda: django_durq.enqueue("tests.read_order"),
        lambda: jobs.effect.enqueue_many([{"tag": "a"}, {"tga": "b"}]),
    ],
    ids=["lease", "max_attempts", "timeout", "short-lease", "misspelt", "missing", "many"],
)
def test_a_refused_enqueue_leaves_the_callers_transaction_usable(bad_enqueue):
    with transaction.atomic():
        Order.objects.create(label="before")
        with pytest.raises((ValueError, TypeError)):
            bad_enqueue()
        Order.objects.create(label="after")
        jobs.noop.enqueue()
    assert sorted(Order.objects.values_list("label", flat=True)) == ["after", "before"]
    assert Job.objects.count() == 1


# --- the handler's signature -------------------------------------------------------------------


@pytest.mark.parametrize(
    "define",
    [
        lambda: lambda: None,
        lambda: lambda *, video_id: None,
        lambda: lambda **kwargs: None,
    ],
    ids=["no-parameters", "keyword-only", "only-kwargs"],
)
def test_job_refuses_a_handler_that_cannot_take_the_context_first(define):
    handler = define()
    with pytest.raises(TypeError, match=r"job handler .*<lambda>.* its first parameter receives the JobContext"):
        job(name="tests.validation.no_ctx")(handler)
    assert registry.get("tests.validation.no_ctx") is None


def test_a_handler_taking_anything_after_the_context_is_accepted():
    @job(name="tests.validation.anything")
    def anything(*args, **kwargs):
        return args, kwargs

    try:
        assert anything.enqueue(1, two=2).args == [1]
    finally:
        registry.remove(anything.name)


def test_a_misspelt_keyword_is_refused_naming_handler_argument_and_the_close_name(transcode):
    with pytest.raises(TypeError) as raised:
        transcode.enqueue(video_id=7, qualty="1080p")
    message = str(raised.value)
    assert message.startswith("cannot enqueue 'tests.validation.transcode': got an unexpected keyword argument 'qualty'")
    assert "did you mean 'quality'?" in message
    assert "test_validation.transcode.<locals>.transcode takes (video_id, quality='720p') after the JobContext" in message
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda t: t.enqueue(), "missing a required argument: 'video_id'"),
        (lambda t: t.enqueue(7, "1080p", "extra"), "too many positional arguments"),
        (lambda t: t.enqueue(7, video_id=8), "multiple values for argument 'video_id'"),
        (lambda t: t.using(priority=3).enqueue(quality="480p"), "missing a required argument: 'video_id'"),
        (lambda t: django_durq.enqueue(t.name, vidoe_id=7), "unexpected keyword argument 'vidoe_id' (did you mean 'video_id'?)"),
        (lambda t: t.using(unique="k").enqueue(), "missing a required argument: 'video_id'"),
    ],
    ids=["missing", "too-many", "twice", "using", "by-name", "unique"],
)
def test_arguments_the_handler_cannot_take_are_refused_before_any_sql(transcode, call, fragment):
    with pytest.raises(TypeError, match=re.escape(fragment)):
        call(transcode)
    assert Job.objects.count() == 0


def test_enqueue_many_names_the_item_the_handler_cannot_take(transcode):
    with pytest.raises(TypeError, match=r"^items\[1\]: cannot enqueue .*missing a required argument: 'video_id'"):
        transcode.enqueue_many([{"video_id": 1}, {"quality": "480p"}])
    assert Job.objects.count() == 0


def test_a_handler_missing_its_context_parameter_gets_a_hint_at_enqueue():
    @job(name="tests.validation.forgot_ctx")
    def forgot_ctx(video_id, quality="720p"):
        return None

    try:
        with pytest.raises(TypeError, match=r"which its first parameter, 'video_id', receives"):
            forgot_ctx.enqueue(video_id=7)
    finally:
        registry.remove(forgot_ctx.name)


def test_arguments_the_handler_takes_are_queued(transcode):
    assert transcode.enqueue(7).args == [7]
    assert transcode.enqueue(video_id=8, quality="1080p").kwargs == {"video_id": 8, "quality": "1080p"}
    assert len(transcode.enqueue_many([{"video_id": 9}, {"video_id": 10, "quality": "480p"}])) == 2


# --- where handlers must live ------------------------------------------------------------------


def test_the_unknown_job_message_says_where_handlers_must_live():
    message = unknown_job_message("shop.send_receipt")
    assert message.startswith("unknown job type 'shop.send_receipt': no handler is registered under this name")
    assert "an installed app's jobs.py" in message
    assert 'DURQ["MODULES"]' in message


def test_enqueue_by_an_unknown_name_says_where_handlers_must_live():
    with pytest.raises(django_durq.UnknownJobType) as raised:
        django_durq.enqueue("shop.send_receipt", order_id=1)
    assert "an installed app's jobs.py" in str(raised.value)
    assert 'DURQ["MODULES"]' in str(raised.value)
    assert Job.objects.count() == 0


def _h1(ctx, a, b=1): ...
def _h2(ctx, a, /, b=1, **kw): ...
def _h3(ctx, *args, c): ...
def _h4(ctx, a=1, *, b, **kw): ...
def _h5(ctx, **kw): ...
def _h6(ctx): ...
def _h7(ctx, a, b, /, c, *args, d=1, **kw): ...
def _h8(ctx, a, b=2, *, c=3): ...


@pytest.mark.parametrize("handler", [_h1, _h2, _h3, _h4, _h5, _h6, _h7, _h8])
@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {}),
        ((), {"a": 1}),
        ((), {"a": 1, "b": 2}),
        ((), {"b": 2}),
        ((), {"c": 3}),
        ((), {"kw": 1}),
        ((1,), {}),
        ((1,), {"a": 2}),
        ((1,), {"b": 2}),
        ((1,), {"kw": 2}),
        ((1, 2), {}),
        ((1, 2), {"b": 3}),
        ((1, 2), {"c": 3}),
        ((1, 2), {"a": 3, "c": 3}),
        ((1, 2, 3), {}),
        ((1, 2, 3), {"d": 4, "e": 5}),
        ((1, 2, 3, 4, 5), {}),
        ((1, 2, 3, 4, 5), {"c": 1}),
    ],
)
def test_the_quick_argument_check_agrees_with_the_handlers_signature(handler, args, kwargs):

    from django_durq.handlers.arguments import HandlerArguments

    arguments = HandlerArguments.of(handler)
    assert arguments is not None
    try:
        handler(None, *args, **kwargs)  # what Python itself accepts
    except TypeError:
        with pytest.raises(TypeError, match="cannot enqueue 'x'"):
            arguments.check("x", args, kwargs)
    else:
        arguments.check("x", args, kwargs)


def _random_signature(draw: random.Random) -> inspect.Signature:
    """A signature Python allows: positional-only, then positional-or-keyword (defaults trailing), maybe
    ``*args``, keyword-only, maybe ``**kw``."""
    names = iter("abcdefgh")
    parameters = []
    defaulted = False
    for kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        for _ in range(draw.randint(0, 2)):
            defaulted = defaulted or draw.random() < 0.4
            default = 0 if defaulted else inspect.Parameter.empty
            parameters.append(inspect.Parameter(next(names), kind, default=default))
    if draw.random() < 0.4:
        parameters.append(inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL))
    for _ in range(draw.randint(0, 2)):
        default = 0 if draw.random() < 0.5 else inspect.Parameter.empty
        parameters.append(inspect.Parameter(next(names), inspect.Parameter.KEYWORD_ONLY, default=default))
    if draw.random() < 0.4:
        parameters.append(inspect.Parameter("kw", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(parameters)


def test_the_argument_check_agrees_with_python_for_random_signatures_and_calls():
    from django_durq.handlers.arguments import HandlerArguments

    draw = random.Random(20261206)
    accepted = refused = 0
    for _ in range(400):
        signature = _random_signature(draw)
        arguments = HandlerArguments(_h6, signature)
        scope: dict[str, Any] = {}
        exec(f"def handler{signature}: pass", scope)  # a function of that signature, to call
        for _ in range(25):
            args = tuple(range(draw.randint(0, 4)))
            kwargs = dict.fromkeys(draw.sample("abcdefgh", draw.randint(0, 3)) + (["kw"] if draw.random() < 0.1 else []), 1)
            try:
                scope["handler"](*args, **kwargs)  # what Python itself accepts
            except TypeError:
                refused += 1
                with pytest.raises(TypeError, match="cannot enqueue 'x'"):
                    arguments.check("x", args, kwargs)
            else:
                accepted += 1
                arguments.check("x", args, kwargs)
    assert accepted > 1_000 and refused > 1_000  # both sides of the check were exercised
