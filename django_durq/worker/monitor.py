"""The worker's housekeeping thread: timeouts, lost last attempts, memory, counters, its own row.

Leases are not kept here (see ``keeper.py``): whatever this thread does — record a timeout,
bury a job whose worker died — can take as long as the database makes it, and no lease waits
for it.

A job whose worker died on its last attempt cannot be claimed again, so it would stay
``running`` (holding its dedupe key) until someone buries it: every worker looks for such jobs
in its own queues once per ``POLL_INTERVAL``, busy or not. An idle pool's own probe says when
the first lease of its queue runs out (``FlowGate.lost_possible``): until then there is nothing
to look for, and an idle worker reads nothing for it.
"""

from __future__ import annotations

import logging
import os
import resource
import threading
import time
from typing import TYPE_CHECKING

from django.db import connections

from ..models import WorkerProcess
from .slots import TIMEOUT_GRACE_MS

if TYPE_CHECKING:
    from .pool import Pool
    from .runtime import Runtime

logger = logging.getLogger("django_durq")

TICK_S = 0.2
# While the worker writes, its writes are checkpointed this often (SQLite: the dispatcher's own
# commits never checkpoint, so that no claim waits for one; see db/sqlite.py).
CHECKPOINT_S = 1.0
# An idle worker's monitor wakes at most this often: a timeout is reaped only TIMEOUT_GRACE_MS
# after it passes, so a job claimed meanwhile is looked at in time all the same.
IDLE_TICK_S = TIMEOUT_GRACE_MS / 1000


def rss_mb() -> float:
    """Resident set size of this process now (peak where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 1_048_576
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Monitor:
    def __init__(self, runtime: Runtime, pools: list[Pool], max_memory_mb: float | None) -> None:
        self.runtime = runtime
        self.pools = pools
        self.max_memory_mb = max_memory_mb
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="durq-monitor", daemon=True)
        self._last_beat = 0.0
        self._last_bury = 0.0
        self._last_checkpoint = 0.0
        self._checkpointed_done = 0
        self._recorded_done = 0  # registering wrote the row with no jobs done

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        runtime = self.runtime
        try:
            while not self.stopped.wait(self._pause_s()):
                for pool in self.pools:
                    pool.reap_timeouts()
                mono = time.monotonic()
                if mono - self._last_bury >= runtime.poll_s:
                    self._last_bury = mono
                    now = runtime.clock.now_ms()
                    for pool in self.pools:
                        pool.bury_expired(now)
                if mono - self._last_checkpoint >= CHECKPOINT_S:
                    self.checkpoint()
                if (mono - self._last_beat) * 1000 >= runtime.settings.heartbeat_interval_ms:
                    self._last_beat = mono
                    self.flush(runtime.clock.now_ms())
                over_memory = self.max_memory_mb is not None and rss_mb() > self.max_memory_mb
                if over_memory and not runtime.stop_claiming.is_set():
                    runtime.request_stop(f"memory above --max-memory {self.max_memory_mb:g} MB")
        except BaseException as error:
            logger.exception("durq: the monitor thread stopped on an unexpected error")
            runtime.fail("monitor failure", error)
        finally:
            connections.close_all()

    def _pause_s(self) -> float:
        """TICK_S while this process holds attempts; idle, until the next scan for lost last attempts."""
        if len(self.runtime.book):
            return TICK_S
        until_bury_s = self.runtime.poll_s - (time.monotonic() - self._last_bury)
        return min(max(until_bury_s, TICK_S), IDLE_TICK_S)

    def checkpoint(self) -> None:
        """Checkpoint what the worker wrote since the last time: while it holds attempts, and once after."""
        runtime = self.runtime
        done = runtime.jobs_done
        if not len(runtime.book) and done == self._checkpointed_done:
            return  # idle, and checkpointed since it last finished a job
        self._last_checkpoint = time.monotonic()
        self._checkpointed_done = done
        runtime.store.retrying("checkpoint", lambda d: d.checkpoint())

    def flush(self, now: int) -> None:
        """Write the counters and record this process as alive."""
        runtime = self.runtime
        stats = runtime.take_stats()
        if stats:
            runtime.store.retrying("stats", lambda d: d.add_stats(stats))
        renewed = runtime.presence is not None and runtime.presence.renewed()
        if runtime.presence is not None and not renewed and runtime.jobs_done == self._recorded_done:
            return  # the presence lock says this worker is alive: an idle worker writes nothing
        done = runtime.jobs_done
        updated = runtime.store.retrying(
            "worker heartbeat",
            lambda d: (
                WorkerProcess.objects.using(runtime.settings.database)
                .filter(worker_id=runtime.worker_id)
                .update(last_seen_ms=now, jobs_done=done)
            ),
        )
        if not updated:
            # Another worker judged this one gone (a long stall, a clock that was off) and
            # removed its row: write it again, so this live worker is listed.
            logger.warning("durq: this worker's row was removed while it lived; writing it again")
            runtime.store.retrying("register worker", lambda d: runtime.register(now, done))
        self._recorded_done = done
