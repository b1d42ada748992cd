"""Deterministic race points for tests: off unless ``DURQ["TEST_HOOKS_DIR"]`` names a folder.

At a point, the worker checks for a file ``<dir>/<point>``. When it exists, the worker writes
``<dir>/<point>.reached.<job id>`` and waits until ``<dir>/<point>`` is removed. A test thus
holds a worker at an exact place (after a claim, before a completion, inside a heartbeat),
does something to it (kill -9, a second claim, a purge) and lets it go.
"""

from __future__ import annotations

import os
import time

POINTS = ("after_claim", "before_complete", "in_heartbeat")


def reach(point: str, job_id: int | str) -> None:
    from .conf import get_settings

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
