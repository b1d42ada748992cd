"""Flow control in one process, on every database, with a manual clock: what the limited claim admits.

Real worker processes racing for the same limits are in tests/worker/test_limits.py.
"""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.db import connection
from django.test import override_settings

from django_durq import Limit, job
from django_durq.clock import ManualClock, use_clock
from django_durq.conf import get_settings
from django_durq.db import dialect_for, places
from django_durq.db.flow import claim_limited, has_limited_jobs, next_start
from django_durq.db.store import Store
from django_durq.execution.executor import Executor
from django_durq.handlers.limits import QueueLimits, Rate
from django_durq.handlers.registry import registry
from django_durq.models import Job, JobStart, LimitPlace, QueueControl, WorkerProcess
from django_durq.testing import drain
from tests.ledger import jobs

pytestmark = pytest.mark.django_db

START = 1_800_000_000_000
NONE = QueueLimits()


@pytest.fixture
def clock():
    manual = ManualClock(start_ms=START)
    with use_clock(manual):
        yield manual


def claim(clock: ManualClock, limit: int = 10, queue: str = "default", limits: QueueLimits = NONE, worker: str = "w1"):
    return claim_limited(dialect_for(connection), queue, limit, clock.now_ms(), worker, limits)


def keyed(key: str, **kwargs: object) -> Job:
    return jobs.one_per_key.enqueue(key=key, log="/dev/null", **kwargs)


def end(*leases: tuple[int, int]) -> None:
    """What a worker does when handlers return: complete their jobs and free their places."""
    dialect = Store("default").dialect
    assert dialect.complete(list(leases))
    places.free(dialect, list(leases))


# --- declaring limits -------------------------------------------------------------------------


def test_rates_parse_to_a_count_per_window():
    assert Rate.parse("50/m") == Rate(50, 60_000)
    assert Rate.parse("3/s") == Rate(3, 1_000)
    assert Rate.parse(" 10 / 5m ") == Rate(10, 300_000)
    assert Rate.parse("1/d") == Rate(1, 86_400_000)
    assert str(Rate.parse("10/5m")) == "10/5m" and str(Rate.parse("7/h")) == "7/h"


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        ("50 per minute", ValueError, "is not a rate"),
        ("0/s", ValueError, "at least 1 start"),
        ("5/0s", ValueError, "at least 1 start"),
        ("5/2d", ValueError, "over a day"),
        (50, TypeError, 'like "50/m"'),
    ],
)
def test_a_bad_rate_is_refused_with_what_to_write(value, error, words):
    with pytest.raises(error, match=words):
        Rate.parse(value)


def test_a_limit_needs_a_number_and_a_callable_key():
    with pytest.raises(ValueError, match="needs max_running, rate or both"):
        Limit()
    with pytest.raises(ValueError, match="at least 1"):
        Limit(max_running=0)
    with pytest.raises(TypeError, match="whole number"):
        Limit(max_running=True)
    with pytest.raises(TypeError, match="function of the job's arguments"):
        Limit(max_running=1, key="video")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"must be a django_durq\.Limit"):
        job(name="tests.limit_typo", limit={"max_running": 1})(lambda ctx: None)  # type: ignore[call-overload]
    assert registry.get("tests.limit_typo") is None


def test_the_key_and_the_numbers_are_stored_on_the_row(clock):
    queued = keyed("video-7")
    row = Job.objects.get(pk=queued.pk)
    assert (row.limit_key, row.limit_running, row.limit_rate, row.limit_period_ms) == ("video-7", 1, None, None)
    rated = Job.objects.get(pk=jobs.rated_per_key.enqueue(key=42, log="/dev/null").pk)
    assert (rated.limit_key, rated.limit_running, rated.limit_rate, rated.limit_period_ms) == ("42", None, 4, 1_000)
    plain = Job.objects.get(pk=jobs.noop.enqueue().pk)
    assert plain.limit_key is None


def test_without_a_key_the_limit_is_per_job_type(clock):
    @job(name="tests.one_at_a_time", limit=Limit(max_running=1))
    def one_at_a_time(ctx):
        return None

    try:
        row = Job.objects.get(pk=one_at_a_time.enqueue().pk)
        assert row.limit_key == "tests.one_at_a_time"
    finally:
        registry.remove("tests.one_at_a_time")


def test_a_key_that_is_not_a_str_or_int_is_refused_before_any_sql(clock, django_assert_num_queries):
    @job(name="tests.bad_key", limit=Limit(max_running=1, key=lambda item: item))
    def bad_key(ctx, item):
        return None

    try:
        with django_assert_num_queries(0), pytest.raises(TypeError, match="must be a str or int, not list"):
            bad_key.enqueue(item=[1, 2])
        with django_assert_num_queries(0), pytest.raises(ValueError, match="1 to 255 characters"):
            bad_key.enqueue(item="x" * 256)
    finally:
        registry.remove("tests.bad_key")


def test_queue_limits_in_settings_are_checked():
    queues = {"video": {"concurrency": 2, "max_running": 0, "rate": "fast"}}
    with override_settings(DURQ={**get_settings_raw(), "QUEUES": queues}):
        errors = [message for message in run_checks() if message.id == "durq.E008"]
    texts = " ".join(message.msg for message in errors)
    assert "max_running" in texts and "is 0" in texts
    assert "'fast' is not a rate" in texts
    with override_settings(DURQ={**get_settings_raw(), "QUEUES": {"video": {"max_running": 3, "rate": "2/s"}}}):
        assert get_settings().queue("video").limits == QueueLimits(3, Rate(2, 1_000))
        assert not [message for message in run_checks() if message.id == "durq.E008"]


def get_settings_raw() -> dict[str, object]:
    from django.conf import settings

    return dict(settings.DURQ)


# --- per key: at most N running, no head-of-line blocking ---------------------------------------


def test_a_key_at_its_limit_is_skipped_and_other_keys_start(clock):
    hot = [keyed("hot") for _ in range(50)]  # queued first: a claim in plain order would take only these
    cold = [keyed(f"cold-{n}") for n in range(3)]
    claimed = claim(clock)
    assert [job.id for job in claimed] == [hot[0].id] + [job.id for job in cold]
    # While those run, nothing more of any of those keys starts, and the held-back jobs keep their attempts.
    assert claim(clock) == []
    assert Job.objects.filter(pk=hot[1].pk, status="waiting", attempts=0).exists()


# Keys and results travel to PostgreSQL as the text of an array literal, and a kept batch's
# results to MariaDB inside a JSON text: none may change on the way.
ODD_TEXTS = [
    'with "quotes"',
    "back\\slash",
    "end\\",
    "a,b",
    "{braces}",
    "NULL",
    " spaced ",
    "it's",
    "ünï 键",
    "line\nbreak\ttab",
    "\\u00e9 as written",
    "four bytes 🎉",
]


def test_keys_and_results_of_any_content_are_claimed_and_kept_as_written(clock):
    queued = [keyed(key) for key in ODD_TEXTS]
    claimed = claim(clock, limit=len(ODD_TEXTS))
    assert sorted(job.id for job in claimed) == sorted(job.id for job in queued)  # each under the key it was counted with
    assert claim(clock) == []  # and each key's place is held
    dialect = Store("default").dialect
    results = [f'"{text}"' if n % 2 else None for n, text in enumerate(ODD_TEXTS)]
    kept = [((job.id, job.claim_token), clock.now_ms(), result) for job, result in zip(claimed, results, strict=True)]
    assert dialect.finish_many(kept) == {lease for lease, _, _ in kept}
    stored = dict(Job.objects.filter(pk__in=[job.id for job in claimed]).values_list("pk", "result"))
    assert [stored[job.id] for job in claimed] == results


def test_keys_whose_jobs_come_in_blocks_fill_one_claim(clock):
    """A batch enqueued key by key (30 jobs of each of 20 keys): one claim still starts every key."""
    for block in range(20):
        for _ in range(30):
            keyed(f"block-{block}")
    claimed = claim(clock, limit=20)
    assert len(claimed) == 20
    assert {job.id for job in claimed} == {
        Job.objects.filter(limit_key=f"block-{block}").order_by("id").values_list("id", flat=True)[0] for block in range(20)
    }


def test_a_fast_claim_leaves_limited_jobs_alone(clock):
    limited = keyed("a")
    plain = jobs.noop.enqueue()
    claimed = Store("default").claim("default", 10, clock.now_ms(), "fast-worker")
    assert [job.id for job in claimed] == [plain.id]
    assert Job.objects.get(pk=limited.pk).status == "waiting"
    assert has_limited_jobs(dialect_for(connection), "default")
    assert not has_limited_jobs(dialect_for(connection), "fast")


def test_a_finished_holder_frees_its_key(clock):
    first, second = keyed("k"), keyed("k")
    (held,) = claim(clock)
    assert held.id == first.id and claim(clock) == []
    end((held.id, held.claim_token))
    assert [job.id for job in claim(clock)] == [second.id]


def test_a_crashed_holder_frees_its_key_once_its_worker_is_known_gone_not_when_its_lease_expires(clock):
    WorkerProcess.objects.create(worker_id="crashed", host="h", pid=1, queues="{}", started_ms=START, last_seen_ms=START)
    first, second = keyed("k"), keyed("k")
    assert [job.id for job in claim(clock, worker="crashed")] == [first.id]
    clock.advance(Job.objects.get(pk=first.pk).lease_ms)
    # The lease has expired, but the handler may still run (a paused process resumes): the place holds.
    assert claim(clock, worker="w2") == []
    WorkerProcess.objects.filter(worker_id="crashed").delete()  # the maintenance duty found it ended
    # The expired attempt is run again first, then the next job waits for it.
    retaken = claim(clock, worker="w2")
    assert [(job.id, job.reclaimed_from) for job in retaken] == [(first.id, "crashed")]
    assert Job.objects.get(pk=second.pk).status == "waiting"


@pytest.fixture
def two_per_key():
    @job(name="tests.two_per_key", limit=Limit(max_running=2, key=lambda key: key))
    def two_per_key(ctx, key):
        return None

    yield two_per_key
    registry.remove("tests.two_per_key")


def alive(*workers: str) -> None:
    for worker_id in workers:
        WorkerProcess.objects.create(worker_id=worker_id, host="h", pid=1, queues="{}", started_ms=START, last_seen_ms=START)


def bury(lease: tuple[int, int], clock: ManualClock, queue: str = "default") -> str:
    """What a worker's sweep does with a last attempt whose lease ran out."""
    executor = Executor(Store("default"), get_settings(), clock, "sweeper", count=lambda *args: None)
    return executor.bury_lost(queue, lease, "tests.job", 1, "[]", "slow")


def held_places() -> list[tuple]:
    return sorted(LimitPlace.objects.values_list("job_id", "claim_token", "queue", "limit_key", "limit_running", "worker_id"))


def test_a_claim_writes_no_place_row_its_running_rows_are_what_a_limit_counts(clock):
    alive("w1")
    first, _ = keyed("k"), keyed("k")
    (held,) = claim(clock)
    assert held.id == first.id and held.placed and held_places() == []
    assert places.counts(dialect_for(connection), "default", clock.now_ms()) == (1, {"k": 1})
    assert claim(clock, worker="w2") == []  # the row counts for every claimer


def test_a_handler_whose_attempt_is_taken_over_keeps_a_place_until_its_worker_frees_it(clock, two_per_key):
    alive("slow", "w2")
    first, second, third = (two_per_key.enqueue(key="k") for _ in range(3))
    assert [job.id for job in claim(clock, limit=1, worker="slow")] == [first.id]
    clock.advance(Job.objects.get(pk=first.pk).lease_ms)
    # "slow" still has its row, so its handler may still run: the attempt taken over keeps a place.
    (retaken,) = claim(clock, worker="w2")
    assert (retaken.id, retaken.reclaimed_from, retaken.claim_token) == (first.id, "slow", 2)
    assert held_places() == [(first.id, 1, "default", "k", 2, "slow")]
    assert claim(clock, worker="w2") == []  # two handlers of "k" may run: its old one and its new one
    assert places.free(dialect_for(connection), [(first.id, 1)]) == 1  # the old handler returned at last
    assert [job.id for job in claim(clock, worker="w2")] == [second.id]
    assert Job.objects.get(pk=third.pk).status == "waiting"


def test_an_attempt_taken_over_from_a_worker_without_a_row_keeps_no_place(clock, two_per_key):
    first = two_per_key.enqueue(key="k")
    claim(clock, worker="gone")
    clock.advance(Job.objects.get(pk=first.pk).lease_ms)
    assert [job.reclaimed_from for job in claim(clock, worker="w2")] == ["gone"]
    assert held_places() == []


def test_a_place_kept_for_an_ended_worker_is_freed_with_its_row(clock, two_per_key):
    alive("slow")
    first = two_per_key.enqueue(key="k")
    claim(clock, worker="slow")
    clock.advance(Job.objects.get(pk=first.pk).lease_ms)
    claim(clock, worker="w2")
    dialect = dialect_for(connection)
    assert places.free_ended(dialect) == []  # its worker's row is there: alive as far as anyone knows
    WorkerProcess.objects.filter(worker_id="slow").delete()  # the maintenance duty found it ended
    assert places.free_ended(dialect) == ["default"] and held_places() == []


def test_a_buried_attempt_whose_worker_has_a_row_keeps_its_place(clock):
    alive("slow")
    first = jobs.one_per_key.using(max_attempts=1).enqueue(key="k", log="/dev/null")
    second = keyed("k")
    claim(clock, worker="slow")
    clock.advance(Job.objects.get(pk=first.pk).lease_ms)
    assert bury((first.id, 1), clock) == "dead"
    assert held_places() == [(first.id, 1, "default", "k", 1, "slow")]
    assert claim(clock, worker="w2") == []  # its handler may still run
    places.free(dialect_for(connection), [(first.id, 1)])
    assert [job.id for job in claim(clock, worker="w2")] == [second.id]


def test_a_buried_attempt_of_a_capped_queue_keeps_its_place_and_an_unlimited_one_none(clock):
    alive("slow")
    capped, plain = jobs.noop.enqueue(), jobs.noop.enqueue()
    for queued in (capped, plain):
        Job.objects.filter(pk=queued.pk).update(max_attempts=1)
    claim(clock, worker="slow", limits=QueueLimits(max_running=5))
    clock.advance(Job.objects.get(pk=capped.pk).lease_ms)
    with override_settings(DURQ={**get_settings_raw(), "QUEUES": {"capped": {"max_running": 5}}}):
        Job.objects.filter(pk=capped.pk).update(queue="capped")
        assert bury((capped.id, 1), clock, "capped") == bury((plain.id, 1), clock) == "dead"
    assert held_places() == [(capped.id, 1, "capped", None, None, "slow")]


def test_a_handler_past_its_timeout_keeps_one_place_however_many_write_it(clock):
    first, second = keyed("k"), keyed("k")
    (held,) = claim(clock)
    dialect = dialect_for(connection)
    for _ in range(2):
        places.hold_abandoned(dialect, "w1", clock.now_ms(), (held.id, held.claim_token))
    assert held_places() == [(first.id, 1, "default", "k", 1, "w1")]
    # The attempt fails at its timeout, to be retried later (as the worker records it).
    Job.objects.filter(pk=first.pk).update(status="waiting", lease_expires_ms=None, run_at_ms=START + 10**9)
    assert claim(clock, worker="w2") == []  # the attempt is settled; its handler still runs
    places.free(dialect, [(held.id, held.claim_token)])
    assert [job.id for job in claim(clock, worker="w2")] == [second.id]


def test_a_limit_of_n_admits_n_in_one_claim_and_counts_what_runs(clock):
    @job(name="tests.two_per_key", limit=Limit(max_running=2, key=lambda key: key))
    def two_per_key(ctx, key):
        return None

    try:
        queued = [two_per_key.enqueue(key="k") for _ in range(5)]
        assert [job.id for job in claim(clock)] == [queued[0].id, queued[1].id]
        assert claim(clock) == []
        end((queued[0].id, 1))
        assert [job.id for job in claim(clock)] == [queued[2].id]
    finally:
        registry.remove("tests.two_per_key")


def test_priority_order_holds_among_the_jobs_admitted(clock):
    low = jobs.one_per_key.using(priority=0).enqueue(key="a", log="/dev/null")
    high = jobs.one_per_key.using(priority=5).enqueue(key="a", log="/dev/null")
    other = jobs.noop.using(priority=3).enqueue()
    assert [job.id for job in claim(clock)] == [high.id, other.id]
    assert Job.objects.get(pk=low.pk).status == "waiting"


# --- per queue: at most N running across every worker -------------------------------------------


def test_a_queue_limit_counts_every_running_job_of_the_queue(clock):
    queued = [jobs.capped.enqueue(log="/dev/null") for _ in range(5)]
    limits = get_settings().queue("video").limits
    assert limits == QueueLimits(max_running=3)
    first = claim(clock, limit=2, queue="video", limits=limits, worker="w1")
    second = claim(clock, limit=4, queue="video", limits=limits, worker="w2")
    assert (len(first), len(second)) == (2, 1)
    assert claim(clock, queue="video", limits=limits, worker="w3") == []
    end((first[0].id, first[0].claim_token))
    assert [job.id for job in claim(clock, queue="video", limits=limits)] == [queued[3].id]


# --- rates: a sliding window on the database's clock ---------------------------------------------


def test_a_queue_rate_is_a_sliding_window_with_no_burst_at_its_edges(clock):
    queued = [jobs.metered.enqueue(log="/dev/null") for _ in range(30)]
    limits = get_settings().queue("webhooks").limits  # 10 a second
    started = [len(claim(clock, limit=6, queue="webhooks", limits=limits, worker=f"w{n}")) for n in range(3)]
    assert started == [6, 4, 0]
    clock.advance(999)
    assert claim(clock, queue="webhooks", limits=limits) == []  # a fixed window would let 10 more in here
    assert next_start(dialect_for(connection), "webhooks", clock.now_ms(), limits) == START + 1_000
    clock.advance(1)
    assert len(claim(clock, limit=20, queue="webhooks", limits=limits)) == 10
    assert Job.objects.filter(pk__in=[job.pk for job in queued], status="waiting", attempts=0).count() == 10
    # Starts are forgotten a minute after their window passed, as new ones are logged.
    assert sorted(JobStart.objects.filter(scope="q:webhooks").values_list("starts", flat=True)) == [4, 6, 10]
    clock.advance(61_000)
    assert len(claim(clock, limit=20, queue="webhooks", limits=limits)) == 10
    assert list(JobStart.objects.filter(scope="q:webhooks").values_list("starts", flat=True)) == [10]


def test_a_key_rate_holds_back_that_key_only(clock):
    fast = [jobs.rated_per_key.enqueue(key="api", log="/dev/null") for _ in range(6)]
    other = jobs.rated_per_key.enqueue(key="other", log="/dev/null")
    claimed = [job.id for job in claim(clock)]
    assert claimed == [job.id for job in fast[:4]] + [other.id]
    assert claim(clock) == []
    clock.advance(1_000)
    assert [job.id for job in claim(clock)] == [job.id for job in fast[4:]]


def test_drain_honours_limits_like_a_worker(clock):
    for _ in range(12):
        jobs.metered.enqueue(log="/dev/null")
    assert drain(queue="webhooks", clock=clock)["finished"] == 10
    clock.advance(1_000)
    assert drain(queue="webhooks", clock=clock)["finished"] == 2


# --- pause (the row the limited claim locks) and the idle probe ---------------------------------


def test_a_paused_queue_admits_nothing_and_its_probe_says_so(clock):
    keyed("a")
    QueueControl.objects.create(queue="default", paused=True, updated_ms=START)
    assert claim(clock) == []
    assert next_start(dialect_for(connection), "default", clock.now_ms(), NONE) is None


def test_the_probe_says_when_held_back_jobs_may_start(clock):
    dialect = dialect_for(connection)
    assert next_start(dialect, "default", clock.now_ms(), NONE) is None  # nothing waits
    first, _ = keyed("k"), keyed("k")
    assert next_start(dialect, "default", clock.now_ms(), NONE) == clock.now_ms()
    claim(clock)
    # Held back until the holder ends (its pool claims next) or its lease expires.
    lease_expires = Job.objects.get(pk=first.pk).lease_expires_ms
    assert next_start(dialect, "default", clock.now_ms(), NONE) == lease_expires
    later = jobs.noop.using(run_in=5).enqueue()
    assert next_start(dialect, "default", clock.now_ms(), NONE) == Job.objects.get(pk=later.pk).run_at_ms


# --- what operators see ------------------------------------------------------------------------


def test_limit_usage_shows_full_keys_held_back_jobs_and_rate_windows(clock):
    from django_durq import ops

    for key in ("a", "a", "a", "b"):
        keyed(key)
    for _ in range(3):
        jobs.rated_per_key.enqueue(key="api", log="/dev/null")
    claim(clock)  # a, b and api ×3 start (api's rate is 4 a second)
    jobs.rated_per_key.enqueue(key="api", log="/dev/null")
    claim(clock)  # the 4th api start fills its window
    jobs.rated_per_key.enqueue(key="api", log="/dev/null")
    (default,) = ops.limit_usage(queue="default", now_ms=clock.now_ms())
    assert (default.max_running, default.rate, default.running) == (None, None, 6)
    assert {key.key: (key.running, key.max_running) for key in default.keys} == {"a": (1, 1), "b": (1, 1), "api": (4, None)}
    api = next(key for key in default.keys if key.key == "api")
    assert (api.started_in_window, api.rate, api.period_ms) == (4, 4, 1_000)
    assert default.keys_at_limit == 3 and default.held_back == 3  # a ×2, api ×1
    metered = [jobs.metered.enqueue(log="/dev/null") for _ in range(12)]
    claim(clock, limit=20, queue="webhooks", limits=get_settings().queue("webhooks").limits)
    usage = {row.queue: row for row in ops.limit_usage(now_ms=clock.now_ms())}
    assert set(usage) >= {"default", "video", "webhooks"}
    webhooks = usage["webhooks"]
    assert (webhooks.rate, webhooks.started_in_window, webhooks.held_back) == ("10/s", 10, len(metered) - 10)
    assert webhooks.as_dict()["keys"] == []


@pytest.mark.django_db(transaction=True)
def test_a_limited_claim_skips_a_job_another_transaction_holds_instead_of_waiting(clock):
    import threading

    from django.db import connections, transaction

    if connection.vendor == "sqlite":
        pytest.skip("SQLite has one writer: a transaction holding a row holds the whole database")
    held, free = keyed("held"), keyed("free")
    locked, release = threading.Event(), threading.Event()

    def hold_row() -> None:
        try:
            with transaction.atomic():
                list(Job.objects.select_for_update().filter(pk=held.pk))  # as an enqueue replacing its arguments does
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold_row)
    thread.start()
    try:
        assert locked.wait(10)
        # Waiting would block here (and every other limited claim of the queue behind this one's turn).
        assert [job.id for job in claim(clock)] == [free.id]
    finally:
        release.set()
        thread.join()
    assert [job.id for job in claim(clock)] == [held.id]


@pytest.mark.urls("tests.admin.test_admin")
def test_durq_limits_and_the_metrics_show_limits_at_work(clock, settings):
    import json
    from io import StringIO

    from django.core.management import call_command
    from django.test import Client

    keyed("a"), keyed("a")
    claim(clock)
    out = StringIO()
    call_command("durq", "limits", stdout=out)
    text = out.getvalue()
    assert text.splitlines()[0].split() == ["QUEUE", "RUNNING", "STARTED/WINDOW", "KEYS", "AT", "LIMIT", "HELD", "BACK"]
    assert "default: key 'a' at its limit (1/1 running)" in text
    assert [line.split() for line in text.splitlines() if line.startswith("video")] == [["video", "0/3", "-", "0", "0"]]
    out = StringIO()
    call_command("durq", "limits", "--queue", "default", "--json", stdout=out)
    (row,) = json.loads(out.getvalue())
    assert (row["queue"], row["keys_at_limit"], row["held_back"], row["keys"][0]["key"]) == ("default", 1, 1, "a")
    settings.DURQ = {**settings.DURQ, "MONITORING": {"PUBLIC": True}}
    body = Client().get("/durq/metrics/").content.decode()
    assert 'durq_limit_keys_at_limit{queue="default"} 1' in body
    assert 'durq_limit_held_back{queue="default"} 1' in body
    assert 'durq_limit_max_running{queue="video"} 3' in body
    assert 'durq_limit_max_running{queue="default"}' not in body  # no limit of its own


@pytest.mark.urls("tests.admin.test_admin")
def test_the_queues_page_shows_limits_at_work(clock, admin_client):
    keyed("a"), keyed("a")
    claim(clock)
    page = admin_client.get("/admin/django_durq/queue/").content.decode()
    table = page[page.index('id="durq-limits"') :]
    table = table[: table.index("</table>")]
    assert "<code>a</code> (1/1 running)" in table
    assert '<th scope="row">video</th>' in table and "0 / 3" in table
