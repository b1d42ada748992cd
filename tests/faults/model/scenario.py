"""Random scenarios for the model-based chaos test: a seed gives one schedule of work, operator actions and faults.

The same seed always gives the same :class:`~.spec.Scenario` (``generate`` draws from one
``random.Random(seed)``); what the workers then do with it depends on timing, which is the point.
A heavy scenario is several rounds of a short one's mix, one after another.

Every scenario mixes the promises of flow control and workflows, so that each run puts most of
them at risk at once:

- per-key limits whose keys are shared by two job types and three queues (``solo``/``solo_too``
  ``max_running=1``, ``pair`` ``max_running=2``), a timed-out handler that ignores
  ``should_stop()`` among jobs of its key, and the queue ``video`` (``max_running`` 3);
- rates: a key rate (``metered`` 3/s), the queue ``webhooks`` (10/s) fed by a burst and nothing
  else, and in long scenarios a ``2/h`` key shared with a ``10/s`` type;
- workflows: chains whose blocked members hold a dedupe key that a ``replace``/``reschedule``
  enqueue targets, fan-ins whose members fail until an operator retries them, graphs, a
  dependency on a job queued before, and sometimes a workflow of more than 500 members
  cancelled while its root runs;
- operator actions: cancel a workflow or a member, retry a member or a workflow's failed
  members, pause a queue (while a stream of short jobs runs in it) and resume it;
- faults: ``kill -9`` of a worker (restarted after a while), ``SIGSTOP`` past the lease then
  ``SIGCONT``, a row lock held on a running job past the lease (the holder's renewals hang; on
  SQLite the write lock, which stalls every worker), job timeouts, and random stalls at the race
  points (``DURQ_TEST_CHAOS``).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from .spec import BatchSpec, FlowSpec, JobSpec, Member, Op, Scenario, WorkerSpec

LEASE_S = 2.0
ROUND_S = 20.0  # how long each round of a heavy scenario lasts, about


def generate(seed: int, heavy: bool = False) -> Scenario:
    """The scenario of ``seed``: ``heavy`` ones last longer, hold more workflows and more faults."""
    return _Generator(seed, heavy).scenario


class _Generator:
    def __init__(self, seed: int, heavy: bool) -> None:
        self.rng = random.Random(seed)
        self.heavy = heavy
        rng = self.rng
        hourly = heavy and rng.random() < 0.5
        self.duration = 85.0 if hourly else (_u(rng, 30, 60) if heavy else 14.0)
        self.scenario = Scenario(seed, heavy, duration=self.duration)
        self.solo_fast = False
        self.origin, self.span, self.prefix = 0.0, self.duration, ""
        self._workers()
        if hourly:
            self._hourly()
        # A heavy scenario is several rounds of a short one's mix, one after another.
        rounds = round(self.duration / ROUND_S) if heavy else 1
        self.span = self.duration / rounds
        for index in range(rounds):
            self.origin = index * self.span
            self.prefix = f"r{index}." if heavy else ""
            self._round()

    def _round(self) -> None:
        rng = self.rng
        self._keyed()
        self._timeouts()
        self._video()
        self._rates()
        self._stream_and_pause()
        builders = [self._chain, self._fan_in, self._graph, self._external]
        flows = rng.randint(3, 4) if self.heavy else 3
        for index in range(flows):
            build = builders[index] if index < len(builders) else rng.choice(builders)
            build(f"{self.prefix}w{index}")
        if rng.random() < (0.3 if self.heavy else 0.4):
            self._wide(f"{self.prefix}w{flows}")
        self._faults()
        if self.solo_fast:
            self._lapse_on_worker_0()

    def _t(self, low: float, high: float) -> float:
        """A time in this round: ``low`` to ``high`` seconds after its start."""
        return self.origin + _u(self.rng, low, high)

    # --- workers ------------------------------------------------------------------------------

    def _workers(self) -> None:
        rng = self.rng
        count = rng.choice([2, 3])
        served: list[list[tuple[str, int]]] = [[("default", rng.randint(2, 4))] for _ in range(count)]
        # "fast" only on worker 0 sometimes: a job lapsed there (a stall, a stop) is claimed again
        # by the process that still runs its earlier attempt.
        self.solo_fast = rng.random() < 0.4
        for queue in ("fast", "video", "webhooks"):
            slots = [0] if queue == "fast" and self.solo_fast else rng.sample(range(count), rng.randint(1, count))
            for slot in sorted(slots):
                # Worker 0 has room to claim again while two long jobs of "fast" lapse.
                served[slot].append((queue, 4 if queue == "fast" and self.solo_fast else rng.randint(2, 4)))
        self.scenario.workers = [WorkerSpec(tuple(queues)) for queues in served]
        env = self.scenario.env
        # A long poll shows whether held jobs wait for it (a rate window opens, a place frees).
        env["DURQ_TEST_POLL"] = rng.choice(["0.25", "4"])
        if rng.random() < 0.4:
            env["DURQ_TEST_PREFETCH"] = "1.5"  # claims ahead up to 1.5 s of short jobs
        if rng.random() < 0.5:
            env["DURQ_TEST_CHAOS"] = "150:0.3"

    # --- plain jobs -----------------------------------------------------------------------------

    def _batch(self, name: str, at: float, jobs: list[JobSpec]) -> None:
        self.scenario.batches.append(BatchSpec(name, round(at, 2), tuple(jobs)))

    def _queue(self, *choices: str) -> str:
        return self.rng.choice(choices or ("default", "fast", "video"))

    def _limited_queue(self) -> str:
        """A queue for a job with a limit: never "fast" when worker 0 serves it alone, so that its
        claims stay the fast claim (which skips a locked row) while a stall holds a row there."""
        return self._queue("default", "video") if self.solo_fast else self._queue()

    def _keyed(self) -> None:
        """Jobs of two types sharing keys across three queues (max_running 1), and a max_running 2 key."""
        rng = self.rng
        keys = [f"k{n}" for n in range(rng.randint(3, 4) if self.heavy else 2)]
        for round_, at in enumerate((self.origin, self._t(2, self.span / 2))):
            name = f"{self.prefix}keyed{round_}"
            jobs = [
                JobSpec(
                    f"{name}.{key}.{n}",
                    rng.choice(["model.solo", "model.solo_too"]),
                    self._limited_queue(),
                    key,
                    _u(rng, 0.3, 0.7),
                )
                for key in keys
                for n in range(rng.randint(3, 5))
            ]
            jobs += [JobSpec(f"{name}.p.{n}", "model.pair", self._limited_queue(), "p1", _u(rng, 0.4, 0.8)) for n in range(4)]
            self._batch(name, at, jobs)

    def _timeouts(self) -> None:
        """A stubborn handler of key ``kt`` times out and keeps running; others of its key and queue wait."""
        rng = self.rng
        at = self._t(0.5, self.span / 2)
        name = f"{self.prefix}timeout"
        first = JobSpec(f"{name}.kt", "model.solo", self._limited_queue(), "kt", 0.1, 3.5, True, max_attempts=2, timeout=1.0)
        jobs = [first] + [
            JobSpec(f"{name}.kt.{n}", rng.choice(["model.solo", "model.solo_too"]), self._limited_queue(), "kt", 0.2)
            for n in range(3)
        ]
        jobs.append(JobSpec(f"{name}.video", "model.work", "video", "", 0.1, 3.5, True, max_attempts=2, timeout=1.0))
        self._batch(name, at, jobs)

    def _video(self) -> None:
        rng = self.rng
        jobs = [JobSpec(f"{self.prefix}video.{n}", queue="video", hold=_u(rng, 0.3, 0.8)) for n in range(rng.randint(6, 10))]
        self._batch(f"{self.prefix}video", self._t(0, 2), jobs)

    def _rates(self) -> None:
        rng = self.rng
        name = f"{self.prefix}webhooks"
        burst = [JobSpec(f"{name}.{n}", queue="webhooks", hold=rng.choice([0.0, 0.01])) for n in range(rng.randint(25, 40))]
        self._batch(name, self._t(1, self.span / 2), burst)
        name = f"{self.prefix}metered"
        metered = [JobSpec(f"{name}.{n}", "model.metered", self._limited_queue(), "m1") for n in range(8)]
        self._batch(name, self._t(0, self.span / 2), metered)

    def _hourly(self) -> None:
        """Two of three ``2/h`` jobs start; the third waits an hour, whatever the ``10/s`` jobs of its key do."""
        rng = self.rng
        self._batch("hourly", 0.0, [JobSpec(f"hourly.{n}", "model.seldom", "default", "h1") for n in range(3)])
        for round_, at in enumerate((0.5, _u(rng, 66, 72))):
            often = [JobSpec(f"often{round_}.{n}", "model.often", self._limited_queue(), "h1") for n in range(6)]
            self._batch(f"often{round_}", at, often)

    def _stream_and_pause(self) -> None:
        """Many short jobs in one queue, paused while they run; sometimes another pause elsewhere."""
        rng = self.rng
        queue = rng.choice(["default", "fast"])
        at = self._t(1, self.span / 2)
        name = f"{self.prefix}stream"
        jobs = [JobSpec(f"{name}.{n}", queue=queue, hold=_u(rng, 0.005, 0.03)) for n in range(rng.randint(80, 150))]
        self._batch(name, at, jobs)
        self._op(at + _u(rng, 0.2, 0.6), "pause", queue, seconds=_u(rng, 1.5, 3.0))
        if rng.random() < 0.5:
            self._op(self._t(1, self.span - 4), "pause", self._queue("default", "fast", "video"), seconds=_u(rng, 1, 3))

    # --- workflows ------------------------------------------------------------------------------

    def _member_job(self, tag: str, **overrides: Any) -> JobSpec:
        rng = self.rng
        kind = rng.random()
        if kind < 0.6:
            spec = JobSpec(tag, queue=self._queue(), hold=_u(rng, 0.05, 0.5))
        elif kind < 0.85:
            spec = JobSpec(
                tag,
                rng.choice(["model.solo", "model.solo_too"]),
                self._limited_queue(),
                rng.choice(["k0", "k1"]),
                _u(rng, 0.1, 0.4),
            )
        else:
            spec = JobSpec(tag, "model.pair", self._limited_queue(), "p1", _u(rng, 0.1, 0.4))
        failure = rng.random()
        if failure < 0.12:
            spec = _with(spec, fail="first")
        elif failure < 0.17:
            spec = _with(spec, fail="until_retry", max_attempts=1)
        return _with(spec, **overrides)

    def _flow(self, name: str, at: float, members: list[Member], on_failure: str | None = None) -> FlowSpec:
        flow = FlowSpec(name, round(at, 2), tuple(members), on_failure or self.rng.choice(["cancel", "cancel", "run"]))
        self.scenario.flows.append(flow)
        return flow

    def _chain(self, name: str) -> None:
        """A chain whose first step holds long while a later step, blocked, holds a dedupe key that an enqueue targets."""
        rng = self.rng
        at = self._t(0, self.span / 3)
        length = rng.randint(3, 4)
        members = [Member(self._member_job(f"{name}.m0", hold=_u(rng, 1.0, 2.0), fail=""))]
        for index in range(1, length):
            job = self._member_job(f"{name}.m{index}", unique=f"{name}-u{index}", type="model.work", key="")
            members.append(Member(job, (index - 1,)))
        self._flow(name, at, members)
        target = rng.randint(1, length - 1)
        replaced = at + _u(rng, 0.2, 0.8)
        self._op(replaced, "replace", f"{name}.m{target}", mode=rng.choice(["replace", "reschedule"]))
        if rng.random() < 0.25:
            other = rng.choice([index for index in range(length) if index != target])
            self._op(replaced + _u(rng, 0.1, 2), "cancel_job", f"{name}.m{other}")

    def _fan_in(self, name: str) -> None:
        """root → k members → callback; two members fail until retried, and one of them is retried."""
        rng = self.rng
        at = self._t(0, self.span / 3)
        width = rng.randint(3, 5)
        root = Member(self._member_job(f"{name}.root", hold=_u(rng, 0.2, 0.8), fail=""))
        members = [root]
        failing = rng.sample(range(width), 2) if rng.random() < 0.7 else []
        slow = next((index for index in range(width) if index not in failing), None)
        for index in range(width):
            job = self._member_job(f"{name}.m{index}", hold=_u(rng, 0.1, 0.6))
            if index in failing:
                job = _with(job, fail="until_retry", max_attempts=1)
            elif job.fail == "until_retry":
                job = _with(job, fail="")
            if index == slow and failing:
                job = _with(job, type="model.work", key="", hold=_u(rng, 2.0, 4.0))  # still running at the retry
            members.append(Member(job, (0,)))
        callback = JobSpec(f"{name}.callback", queue=self._queue(), hold=_u(rng, 0.0, 0.3))
        members.append(Member(callback, tuple(range(1, width + 1))))
        # Mostly "cancel": the callback then runs only once every member finished, retried or not.
        self._flow(name, at, members, "cancel" if failing and rng.random() < 0.8 else None)
        if failing:
            # The operator retries the member the admin names as the callback's cause, or one of
            # the two; the slow sibling may end at that moment.
            when = at + _u(rng, 2.0, 4.5)
            if rng.random() < 0.6:
                self._op(when, "retry_cause", f"{name}.callback")
            else:
                self._op(when, "retry_job", f"{name}.m{failing[0]}")
            if rng.random() < 0.5:
                self._op(at + _u(rng, 6, 9), "retry_workflow", name)
        elif rng.random() < 0.3:
            self._op(at + _u(rng, 0.3, 1.5), "cancel_workflow", name)

    def _graph(self, name: str) -> None:
        rng = self.rng
        at = self._t(0, self.span / 3)
        members: list[Member] = []
        for index in range(rng.randint(4, 7)):
            after = tuple(sorted(rng.sample(range(index), rng.randint(1, min(3, index))))) if index else ()
            policy = rng.choice([None, None, "run"]) if after else None
            members.append(Member(self._member_job(f"{name}.m{index}"), after, on_failure=policy))
        self._flow(name, at, members)
        failing = [i for i, m in enumerate(members) if m.job.fail == "until_retry"]
        if failing:
            when = at + _u(rng, 3, 6)
            if rng.random() < 0.5:
                self._op(when, "retry_job", f"{name}.m{failing[0]}")
            else:
                self._op(when, "retry_workflow", name)
        if rng.random() < 0.3:
            self._op(at + _u(rng, 0.2, 2), "cancel_workflow", name)

    def _external(self, name: str) -> None:
        """A workflow waiting for a job queued before it, which is still running or already done."""
        rng = self.rng
        at = self._t(0, self.span / 3)
        earlier = JobSpec(f"{name}.before", queue=self._queue(), hold=_u(rng, 0.5, 2.0))
        self._batch(f"{name}.before", at, [earlier])
        first = Member(self._member_job(f"{name}.m0"), external=(earlier.tag,))
        second = Member(self._member_job(f"{name}.m1"), (0,), external=(earlier.tag,))
        self._flow(name, at + _u(rng, 0.1, 2.5), [first, second])

    def _wide(self, name: str) -> None:
        """More than 500 members behind a long root, cancelled while it runs; callbacks that run anyway wait for a few."""
        rng = self.rng
        at = self._t(0, self.span / 3)
        members = [Member(JobSpec(f"{name}.root", hold=3.0))]
        members += [Member(JobSpec(f"{name}.m{n}"), (0,)) for n in range(rng.randint(505, 530))]
        for index in range(2):
            callback = JobSpec(f"{name}.callback{index}", queue=self._queue("default", "fast"))
            members.append(Member(callback, tuple(range(1 + 3 * index, 4 + 3 * index)), on_failure="run"))
        self._flow(name, at, members, on_failure="run")
        self._op(at + _u(rng, 1.0, 2.0), "cancel_workflow", name)

    # --- faults ---------------------------------------------------------------------------------

    def _op(self, at: float, kind: str, target: str, *, seconds: float = 0.0, mode: str = "") -> None:
        self.scenario.ops.append(Op(round(at, 2), kind, target, round(seconds, 2), mode))

    def _faults(self) -> None:
        rng = self.rng
        slots = len(self.scenario.workers)
        last = self.span - 3
        for _ in range(rng.randint(1, 2) if self.heavy else 1):
            self._op(self._t(1, last), "kill", str(rng.randrange(slots)), seconds=_u(rng, 0.5, 2.0))
        for _ in range(int(rng.random() < 0.7)):
            slot = 0 if self.solo_fast and rng.random() < 0.6 else rng.randrange(slots)
            self._op(self._t(1, last), "stop", str(slot), seconds=LEASE_S + _u(rng, 0.5, 2.0))
        for _ in range(int(rng.random() < 0.5)):
            self._op(self._t(1, last), "stall", "any", seconds=LEASE_S + _u(rng, 0.5, 1.5))

    def _lapse_on_worker_0(self) -> None:
        """Stubborn long jobs on worker 0, the only one serving "fast", whose leases lapse in a stall or a stop.

        The same process then claims them again while their earlier handlers still run: its
        renewals must keep the new attempts and never mistake them for the old ones.
        """
        rng = self.rng
        at = self._t(1, self.span / 2)
        name = f"{self.prefix}long"
        jobs = [JobSpec(f"{name}.{n}", queue="fast", hold=4.0, stubborn=True, max_attempts=5) for n in range(2)]
        self._batch(name, at, jobs)
        kind = rng.choice(["stall", "stop"])
        self._op(at + _u(rng, 0.3, 0.8), kind, f"{name}." if kind == "stall" else "0", seconds=LEASE_S + _u(rng, 0.5, 1.5))


def _with(spec: JobSpec, **changes: Any) -> JobSpec:
    return dataclasses.replace(spec, **changes)


def _u(rng: random.Random, low: float, high: float) -> float:
    """A uniform draw rounded to 10 ms, so that a scenario reads well when printed."""
    return round(rng.uniform(low, high), 2)
