"""Every system the benchmarks know, by the name ``--systems`` takes.

To add a peer: write an adapter module here (its worker command and databases), a Django app
under ``benchmarks/sites/`` with the no-op job and ``ops.py`` (``enqueue_one``, ``enqueue_bulk``,
``BULK_METHOD``), a branch in ``benchsite/settings.py`` and its pinned requirements in
``core/envs.py``; then list it below.
"""

from __future__ import annotations

from .base import Adapter
from .celery import ADAPTER as CELERY
from .durq import ADAPTER as DURQ
from .huey import HUEY_POSTGRES, HUEY_SQLITE
from .procrastinate import ADAPTER as PROCRASTINATE
from .tasks_db import ADAPTER as TASKS_DB

SYSTEMS: dict[str, Adapter] = {
    adapter.name: adapter for adapter in (DURQ, TASKS_DB, PROCRASTINATE, HUEY_SQLITE, HUEY_POSTGRES, CELERY)
}

__all__ = ["SYSTEMS", "Adapter"]
