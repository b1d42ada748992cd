"""The workloads, in the order a full run takes them. Each module has ``NAME`` and either
``run(session, adapter, database)`` with ``applies(adapter, database)``, or, for measurements
of the machine itself, ``GLOBAL = True`` and ``run_global(session, databases)``. A workload
with ``INTERLEAVED = True`` takes ``run(session, adapter, database, repeat)`` and is run one
repeat at a time across every system: see ``run.py``.
"""

from __future__ import annotations

from types import ModuleType

from . import (
    anatomy,
    bloat,
    ceiling,
    coexist,
    drain,
    enqueue,
    hosts,
    latency,
    limits,
    memory,
    pausing,
    profile,
    scale,
    scaling,
    wakeup,
    workflows,
)

ALL: dict[str, ModuleType] = {
    module.NAME: module
    for module in (
        enqueue,
        drain,
        latency,
        hosts,
        memory,
        coexist,
        ceiling,
        scale,
        scaling,
        bloat,
        limits,
        pausing,
        workflows,
        profile,
        anatomy,
        wakeup,
    )
}
# A plain full run leaves out the profiler and the anatomy, which slow the worker they watch.
DEFAULT = [
    "enqueue",
    "drain",
    "latency",
    "hosts",
    "memory",
    "coexist",
    "ceiling",
    "scale",
    "scaling",
    "bloat",
    "limits",
    "pausing",
    "workflows",
]

__all__ = ["ALL", "DEFAULT"]
