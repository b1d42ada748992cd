"""Processes that enqueue the same dedupe key at the same instant (T32a), released by a barrier."""

from __future__ import annotations

import os
from typing import Any


def race(index: int, rounds: int, racers: int, barrier: Any, results: Any) -> None:
    """Each round, wait at the barrier; the first ``2 + round % (racers - 1)`` processes enqueue."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from django.db import connections

    from tests.ledger import jobs

    outcomes: list[tuple[int, int | None, bool, str]] = []
    for round_number in range(rounds):
        barrier.wait()
        if index >= 2 + round_number % (racers - 1):
            continue
        try:
            job = jobs.noop.using(unique=f"race-{round_number}").enqueue(round=round_number)
            outcomes.append((round_number, job.pk, job.deduplicated, ""))
        except Exception as error:  # noqa: BLE001 - reported to the test
            outcomes.append((round_number, None, False, f"{type(error).__name__}: {error}"))
    connections.close_all()
    results.put(outcomes)
