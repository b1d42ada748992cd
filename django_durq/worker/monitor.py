"""The worker's background duties that keep leases alive: heartbeats, timeouts, memory, counters.

One thread per process renews every running job's lease in one statement, so a handler never
has to call ``heartbeat()`` to keep its job; the lease then only guards against a dead process.
"""

from __future__ import annotations

import logging
import os
import resource
import threading
from typing import TYPE_CHECKING

from django.db import connections

from .. import hooks
from ..models import WorkerProcess

if TYPE_CHECKING:
    from .pool import Pool
    from .runtime import Runtime

logger = logging.getLogger("django_durq")

TICK_S = 0.2


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
        self._last_beat = 0
        self._recorded_done = 0  # registering wrote the row with no jobs done

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        runtime = self.runtime
        try:
            while not self.stopped.wait(TICK_S):
                now = runtime.clock.now_ms()
                for pool in self.pools:
                    pool.reap_timeouts(now)
                if now - self._last_beat >= runtime.settings.heartbeat_interval_ms:
                    self._last_beat = now
                    self.beat(now)
                over_memory = self.max_memory_mb is not None and rss_mb() > self.max_memory_mb
                if over_memory and not runtime.stop_claiming.is_set():
                    runtime.request_stop(f"memory above --max-memory {self.max_memory_mb:g} MB")
        except BaseException:
            logger.exception("durq: the monitor thread stopped on an unexpected error")
            runtime.request_stop("monitor failure")
        finally:
            connections.close_all()

    def beat(self, now: int) -> None:
        """Renew every running and buffered lease, record this process as alive, flush the counters."""
        runtime = self.runtime
        running = [entry for pool in self.pools for entry in pool.running() if not entry.abandoned]
        for entry in running:
            hooks.reach("in_heartbeat", entry.job.id)
        # Claimed-ahead jobs waiting in a pool's buffer are leased too, and renewed with the rest.
        buffered = {pool: pool.buffered_leases() for pool in self.pools}
        leases = [entry.ctx.lease for entry in running] + [lease for pool_leases in buffered.values() for lease in pool_leases]
        if leases:
            held = runtime.store.renew(leases, now)
            for entry in running:
                entry.ctx.apply_renewal(held)
                if entry.ctx.lease_lost and not entry.ctx.settled:
                    logger.warning("durq: job %s lost its lease (taken over or deleted)", entry.job.id)
            for pool, pool_leases in buffered.items():
                if pool_leases:
                    pool.apply_buffer_renewal({job_id for job_id, _ in pool_leases}, held)
        self.flush(now)

    def flush(self, now: int) -> None:
        runtime = self.runtime
        stats = runtime.take_stats()
        if stats:
            runtime.store.retrying("stats", lambda d: d.add_stats(stats))
        if runtime.presence is not None and runtime.jobs_done == self._recorded_done:
            return  # the presence lock says this worker is alive: an idle worker writes nothing
        done = runtime.jobs_done
        runtime.store.retrying(
            "worker heartbeat",
            lambda d: (
                WorkerProcess.objects.using(runtime.settings.database)
                .filter(worker_id=runtime.worker_id)
                .update(last_seen_ms=now, jobs_done=done)
            ),
        )
        self._recorded_done = done
