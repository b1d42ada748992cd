"""Deterministic race points for tests: off unless ``DURQ["TEST_HOOKS_DIR"]`` names a folder.

At a point, the worker checks for a file ``<dir>/<point>``. When it exists, the worker writes
``<dir>/<point>.reached.<job id>`` and waits until ``<dir>/<point>`` is removed. A test thus
holds a worker at an exact place (after a claim, before a completion, inside a heartbeat or
the renewal's transaction),
does something to it (kill -9, a second claim, a purge) and lets it go.

A fault point works the same way: while ``<dir>/fail.<operation>`` holds a number above zero,
the next store operation of that name (``complete``, ``finish``, ``heartbeat``, ``claim``, …)
counts it down and raises ``OperationalError``, as a dropped connection would.
"""

from __future__ import annotations

import os
import random
import time

from . import get_settings

POINTS = ("after_claim", "before_complete", "in_heartbeat", "in_renewal", "in_claim")


def reach(point: str, job_id: int | str) -> None:
    folder = get_settings().test_hooks_dir
    if not folder:
        return
    gate = os.path.join(folder, point)
    if not os.path.exists(gate):
        return
    with open(f"{gate}.reached.{job_id}", "w") as marker:
        marker.write(str(os.getpid()))
    while os.path.exists(gate):
        time.sleep(0.01)


def fail(operation: str) -> None:
    """Raise ``OperationalError`` when the fault file of ``operation`` still counts above zero."""
    folder = get_settings().test_hooks_dir
    if not folder:
        return
    path = os.path.join(folder, f"fail.{operation}")
    try:
        with open(path) as counter:
            remaining = int(counter.read().strip() or 0)
    except (FileNotFoundError, ValueError):
        return
    if remaining <= 0:
        return
    with open(path, "w") as counter:
        counter.write(str(remaining - 1))
    from django.db import OperationalError

    raise OperationalError(f"injected fault in {operation} (test hook)")


# Timing chaos: DURQ_TEST_CHAOS="<max ms>[:<probability>]" makes every race point below sleep a
# random time up to <max ms> (with <probability>, 0.3 by default). Read once per process, so
# worker processes started with it in their environment stall at random where threads meet.
CHAOS_POINTS = ("claim", "admit", "renew", "dispatch", "complete", "release", "bury", "reap", "receiver", "outcome", "settle")


def _chaos() -> tuple[float, float]:
    raw = os.environ.get("DURQ_TEST_CHAOS", "")
    if not raw:
        return 0.0, 0.0
    most, _, chance = raw.partition(":")
    return float(most) / 1000, float(chance or 0.3)


_CHAOS_MAX_S, _CHAOS_CHANCE = _chaos()
_chaos_random = random.Random()


def jitter(point: str) -> None:
    """Sleep a random while at race point ``point`` when timing chaos is on; nothing otherwise."""
    if _CHAOS_MAX_S and _chaos_random.random() < _CHAOS_CHANCE:
        time.sleep(_chaos_random.uniform(0, _CHAOS_MAX_S))
