"""A demo queue for the admin's browser tests and the screenshots in docs/admin.md: every state a page can show.

Jobs get their states through the product's own paths: handlers that fail every attempt (dead
letters), a workflow whose first step ran (blocked callbacks), claims taken and not run (running
jobs, and a queue at its ``max_running``), ``ops.pause`` with a reason. Only what a handler or a
worker process would write is written directly: live worker rows, a job's progress, the per-minute
counts of the last hour, and a worker that has ended without finishing its job (orphaned).

``DEMO_SETTINGS`` must be in force while it runs and while the pages are read: its heartbeat
interval keeps the demo's worker rows live for the length of a test.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings

from django_durq import Workflow, ops, schedules
from django_durq.clock import ManualClock, now_ms, use_clock
from django_durq.models import Job, QueueStat, WorkerProcess
from django_durq.testing import drain
from tests.admin.helpers import claim
from tests.ledger import jobs

# Worker rows count as live for three heartbeat intervals since they last wrote (ops.LIVE_HEARTBEATS).
HEARTBEAT_S = 600
# A daily run half a day from now: the schedules are declared two hours back (``_schedules``), and
# one whose time fell in those two hours has run (a fixed "0 3 * * *" did, from 03:00 to 05:00 UTC).
NIGHTLY_CRON = f"0 {(datetime.now(UTC).hour + 12) % 24} * * *"
SCHEDULES = {
    "nightly-report": {"cron": NIGHTLY_CRON, "job": "billing.charge_card", "kwargs": {"invoice_id": "daily", "amount_cents": 0}},
    "feed-refresh": {"cron": "*/30 * * * *", "job": "tests.effect", "kwargs": {"tag": "feed"}},
    "card-sweep": {"cron": "15 * * * *", "job": "tests.fail", "kwargs": {"message": "card processor answered 502"}},
}
LIVE = {"web-1:4101:a1b2c1": {"default": 4, "video": 3, "fast": 2}, "web-2:4102:a1b2c2": {"default": 4, "slow": 1}}
GONE = "web-3:4103:9f8e7d"
LOG = "/srv/media/runs.log"  # the handlers that take it never run in the demo
PAUSE_REASON = "encoder disk full on web-2, see OPS-1432"


def demo_settings() -> dict[str, Any]:
    # Finished jobs kept, as the product keeps them by default, for their results and outcomes.
    return {**settings.DURQ, "HEARTBEAT_INTERVAL": HEARTBEAT_S, "SCHEDULES": SCHEDULES, "KEEP_FINISHED": 86_400}


@dataclass
class Demo:
    """The ids a test looks for."""

    dead: list[int] = field(default_factory=list)
    long_error: int = 0
    orphaned: int = 0
    held_by_queue: list[int] = field(default_factory=list)
    held_by_key: int = 0
    blocked: int = 0
    paused: int = 0
    running: int = 0
    workflow: int = 0
    failed_workflow: int = 0


def seed() -> Demo:
    """Fill the database with the demo; call with ``demo_settings()`` in force.

    In this order, as each claim takes the only due jobs of its queue, and each drain runs every due job.
    """
    demo = Demo()
    now = now_ms()
    _workers(now)
    demo.dead = _dead_letters(now)
    demo.long_error = _long_error(now)
    _schedules(now)
    _history(now)
    demo.failed_workflow = _failed_workflow()
    demo.workflow, demo.blocked = _workflow("publish video 42")
    # Running jobs: claimed by a worker and not run, as a worker's handlers hold them.
    demo.orphaned = jobs.sleeper.using(queue="fast").enqueue(seconds=600).pk
    claim("fast", 1, GONE)
    WorkerProcess.objects.create(
        worker_id=GONE, host="web-3", pid=4103, queues=json.dumps({"default": 4, "fast": 2}),
        started_ms=now - 5 * 3_600_000, last_seen_ms=now - 3 * HEARTBEAT_S * 1000 - 420_000, jobs_done=5_210,
    )  # fmt: skip
    keyed = [jobs.one_per_key.using(queue="fast").enqueue(key="customer-7", log=LOG) for _ in range(2)]
    claim("fast", 1, "web-1:4101:a1b2c1")
    demo.held_by_key = keyed[1].pk
    video = [jobs.capped.enqueue(log=LOG) for _ in range(5)]
    claimed = claim("video", 3, "web-1:4101:a1b2c1")
    demo.held_by_queue = [job.pk for job in video if job.pk not in claimed]
    demo.running = jobs.progress.using(queue="slow").enqueue(steps=40).pk
    claim("slow", 1, "web-2:4102:a1b2c2")
    Job.objects.filter(pk=demo.running).update(progress_done=27, progress_total=40)
    demo.paused = jobs.encode_video.enqueue(video_id=9000, preset="720p").pk
    jobs.encode_video.enqueue(video_id=9001, preset="720p")
    ops.pause("slow", reason=PAUSE_REASON, by="ada")
    for order in range(4):
        jobs.send_receipt.using(run_in=timedelta(minutes=45 + order)).enqueue(
            order_id=7100 + order, to=f"customer{order}@example.com"
        )
    for invoice in range(3):
        jobs.charge_card.enqueue(invoice_id=f"INV-{3100 + invoice}", amount_cents=2_500 + invoice)
    return demo


def _workers(now: int) -> None:
    for index, (worker_id, queues) in enumerate(LIVE.items()):
        host, pid, _ = worker_id.split(":")
        WorkerProcess.objects.create(
            worker_id=worker_id, host=host, pid=int(pid), queues=json.dumps(queues),
            started_ms=now - (3 + index) * 3_600_000, last_seen_ms=now - 2_000, jobs_done=18_611 + 4_000 * index,
        )  # fmt: skip


def _dead_letters(now: int) -> list[int]:
    """Handlers that fail every attempt, run through their retries ten minutes ago."""
    clock = ManualClock(now - 600_000)
    with use_clock(clock):
        queued = [
            jobs.encode_video.enqueue(video_id=8812, preset="4k"),
            jobs.charge_card.enqueue(invoice_id="INV-2041", amount_cents=129_00),
            jobs.send_receipt.enqueue(order_id=5531, to="ada@example"),
            jobs.charge_card.enqueue(invoice_id="INV-2042", amount_cents=49_00),
            jobs.encode_video.enqueue(video_id=8815),
        ]
        for _ in range(3):
            clock.advance(30_000)
            drain(clock=clock)
    return [job.pk for job in queued]


def _long_error(now: int) -> int:
    token = "https://storage.example/videos/" + "a1b2c3d4" * 12
    clock = ManualClock(now - 300_000)
    with use_clock(clock):
        job = jobs.fail.enqueue(message=f"upload to {token} failed: " + "the server answered 503 Service Unavailable " * 4)
        for _ in range(3):
            clock.advance(60_000)
            drain(clock=clock)
    return job.pk


def _schedules(now: int) -> None:
    """Each schedule declared two hours ago; the cron duty's pass five minutes ago ran the ones that had come due."""
    clock = ManualClock(now - 300_000)
    schedules.sync(schedules.schedules(clock.now_ms()), now - 2 * 3_600_000)
    schedules.tick(clock.now_ms())
    with use_clock(clock):
        for _ in range(3):
            drain(clock=clock)
            clock.advance(60_000)


def _history(now: int) -> None:
    """The last hour's per-minute counts, as the workers' outcomes write them."""
    minute = now // 60_000 * 60_000
    rng = random.Random(4)
    QueueStat.objects.bulk_create(
        [
            QueueStat(
                queue=queue,
                minute_ms=minute - i * 60_000,
                finished=rng.randint(18, 42) * scale + (25 if 20 <= i <= 26 else 0),
                failed=rng.choice([0, 0, 0, 1, 2]) + (9 if 20 <= i <= 23 and queue == "default" else 0),
            )
            for queue, scale in (("default", 1), ("fast", 2))
            for i in range(1, 60)
        ]
    )


def _workflow(name: str) -> tuple[int, int]:
    """Scan, three transcodes at once, package, publish, notify: the scan ran, one transcode runs, the rest wait."""
    flow = Workflow(name)
    scan = flow.add(jobs.step, tag="scan upload 42")
    encodes = [flow.add(jobs.step, tag=f"transcode video 42 to {p}", after=[scan]) for p in ("1080p", "720p", "480p")]
    package = flow.add(jobs.summary, after=encodes)
    publish = flow.add(jobs.step, tag="publish video 42", after=[package])
    flow.add(jobs.step, tag="notify 1,204 followers", after=[publish])
    flow.enqueue()
    drain(max_jobs=1)
    claim("default", 1, "web-1:4101:a1b2c1")
    return flow.row.pk, package.job.pk


def _failed_workflow() -> int:
    """A workflow whose first step failed: its dependents were cancelled, so it has failed members to retry."""
    flow = Workflow("nightly export 2024-06-01")
    scan = flow.add(jobs.step, tag="export", fail=True)
    flow.add(jobs.summary, after=[flow.add(jobs.step, tag="compress", after=[scan])])
    flow.enqueue()
    drain()
    return flow.row.pk
