"""The claims a django-durq worker made, as ``sites/bench_durq/claim_log.py`` recorded them.

Each record is (jobs claimed, wall-clock start, seconds) of one call of the dialect's claim.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import stats

RECORD = struct.Struct("<idd")


@dataclass(frozen=True)
class Claim:
    jobs: int
    start: float
    seconds: float


def read(path: Path) -> list[Claim]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    usable = len(data) - len(data) % RECORD.size
    return [Claim(*RECORD.unpack_from(data, offset)) for offset in range(0, usable, RECORD.size)]


def summarize(path: Path, start: float, end: float) -> dict[str, Any]:
    """Claim statements that began in [start, end]: how many, their p50 / p99 / max, jobs per claim."""
    window = [claim for claim in read(path) if start <= claim.start <= end]
    taking = [claim for claim in window if claim.jobs > 0]
    durations = stats.distribution_ms([claim.seconds for claim in window])
    return {
        "claims": len(window),
        "empty_claims": len(window) - len(taking),
        "claim_p50_ms": durations["p50_ms"],
        "claim_p99_ms": durations["p99_ms"],
        "claim_max_ms": durations["max_ms"],
        "jobs_per_claim": sum(claim.jobs for claim in taking) / len(taking) if taking else None,
    }
