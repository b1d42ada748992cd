"""The compressed day's job types, release by release (``DURQ_DAY_RELEASE``).

Every release has ``day.work(ctx, ms, t)``. Release *r* adds, for each *v* from 1 to *r*, a job
type ``day.added@v`` and a new version of the work job, ``day.work@v(ctx, ms, t, note)``, whose
signature changed (a new required argument): a job whose arguments change gets a new name, and
each release keeps the former versions until their jobs are done (docs/rolling-deploys.md).

Each run appends one line to a ledger file of its process as it starts: job id, claim token,
attempt, start (epoch ms), the producer's time before the enqueue call, pid. Then it sleeps ``ms``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from django_durq import JobContext, job

RELEASE = int(os.environ.get("DURQ_DAY_RELEASE", "0"))
_ledger: dict[str, int] = {}


def record(ctx: JobContext, t: int) -> None:
    folder = os.environ.get("DURQ_DAY_LEDGER")
    if not folder:
        return
    fd = _ledger.get("fd")
    if fd is None:
        path = os.path.join(folder, f"runs-{os.getpid()}.txt")
        fd = _ledger["fd"] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    line = f"{ctx.job_id} {ctx.claim_token} {ctx.attempt} {time.time_ns() // 1_000_000} {t} {os.getpid()}\n"
    os.write(fd, line.encode())


@job(name="day.work")
def work(ctx: JobContext, ms: int, t: int) -> None:
    record(ctx, t)
    time.sleep(ms / 1000)


def _register(version: int) -> None:
    def work_version(ctx: JobContext, ms: int, t: int, note: str) -> None:
        record(ctx, t)
        time.sleep(ms / 1000)

    def added(ctx: JobContext, ms: int, t: int) -> None:
        record(ctx, t)
        time.sleep(ms / 1000)

    for function, name in ((work_version, f"day.work@{version}"), (added, f"day.added@{version}")):
        function.__name__ = function.__qualname__ = name.replace(".", "_").replace("@", "_v")
        job(name=name)(function)


for _version in range(1, RELEASE + 1):
    _register(_version)


def items(release: int, count: int, rng: Any, t: int) -> list[tuple[str, dict[str, Any]]]:
    """What a web server of ``release`` queues: mostly the current version of the work job, some of the newest type."""
    chosen = []
    for _ in range(count):
        ms = rng.randint(1, 50)
        if release == 0:
            chosen.append(("day.work", {"ms": ms, "t": t}))
        elif rng.random() < 0.2:
            chosen.append((f"day.added@{release}", {"ms": ms, "t": t}))
        else:
            chosen.append((f"day.work@{release}", {"ms": ms, "t": t, "note": f"r{release}"}))
    return chosen
