"""``DURQ["QUEUES"]``: each named queue's pool size, retention, prefetch and limits, parsed.

``conf/__init__.py`` parses the rest of ``DURQ`` and re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..handlers.limits import QueueLimits, Rate, check_max_running

if TYPE_CHECKING:
    from . import _Parser

DEFAULT_QUEUE = "default"


@dataclass(frozen=True)
class QueueSettings:
    concurrency: int = 4
    keep_finished_ms: int | None = None  # None: use the global setting
    keep_dead_ms: int | None = None
    prefetch_ms: int | None = None  # None: use the global setting
    # Across every worker: at most this many running, at most this rate of starts (limits.py).
    limits: QueueLimits = field(default_factory=QueueLimits)


def parse_queues(p: _Parser, raw: Any) -> dict[str, QueueSettings]:
    if raw is None:
        return {DEFAULT_QUEUE: QueueSettings()}
    if not isinstance(raw, dict) or not raw:
        p.problem(
            "durq.E008",
            'DURQ["QUEUES"] must be a non-empty dict of queue name -> options',
            'Write {"default": {"concurrency": 4}}.',
        )
        return {DEFAULT_QUEUE: QueueSettings()}
    queues: dict[str, QueueSettings] = {}
    for name, options in raw.items():
        if not isinstance(name, str) or not name or ":" in name or len(name) > 100:
            p.problem(
                "durq.E008", f"queue name {name!r} is not valid", "Use a non-empty name without ':' of at most 100 characters."
            )
            continue
        if options is None:
            options = {}
        if not isinstance(options, dict):
            p.problem("durq.E008", f'DURQ["QUEUES"]["{name}"] must be a dict', 'Write {"concurrency": 4}.')
            continue
        unknown = set(options) - {"concurrency", "keep_finished", "keep_dead", "prefetch", "max_running", "rate"}
        if unknown:
            p.problem(
                "durq.E008",
                f'DURQ["QUEUES"]["{name}"] has unknown keys {sorted(unknown)}',
                "Known: concurrency, keep_finished, keep_dead, prefetch, max_running, rate.",
            )
        limits = _parse_limits(p, name, options)
        concurrency = p.positive_int(options, "concurrency", 4, f'DURQ["QUEUES"]["{name}"]["concurrency"]')
        sub = type(p)(options)  # a parser of the same kind, for this queue's own options
        keep_finished = sub.duration_ms("keep_finished", None, allow_none=True, minimum_ms=0)
        keep_dead = sub.duration_ms("keep_dead", None, allow_none=True, minimum_ms=0)
        prefetch = sub.duration_ms("prefetch", None, allow_none=True, minimum_ms=0)
        p.problems.extend(sub.problems)
        queues[name] = QueueSettings(
            concurrency=concurrency,
            keep_finished_ms=keep_finished,
            keep_dead_ms=keep_dead,
            prefetch_ms=prefetch,
            limits=limits,
        )
    return queues or {DEFAULT_QUEUE: QueueSettings()}


def _parse_limits(p: _Parser, name: str, options: dict[str, Any]) -> QueueLimits:
    """A queue's ``max_running`` and ``rate``, enforced across every worker (limits.py)."""
    max_running: int | None = None
    rate: Rate | None = None
    label = f'DURQ["QUEUES"]["{name}"]'
    if options.get("max_running") is not None:
        try:
            max_running = check_max_running(options["max_running"], f'{label}["max_running"]')
        except (TypeError, ValueError) as error:
            p.problem("durq.E008", str(error), 'Write a whole number of at least 1, e.g. {"max_running": 3}.')
    if options.get("rate") is not None:
        try:
            rate = Rate.parse(options["rate"], f'{label}["rate"]')
        except (TypeError, ValueError) as error:
            p.problem("durq.E008", str(error), 'Write "<count>/<period>", e.g. {"rate": "50/m"} for 50 starts a minute.')
    return QueueLimits(max_running, rate)
