"""A stand-in for the web app sharing the queue's database: app-table inserts at a steady rate.

``python -m tests.faults.webapp --seconds 5 --rate 50`` inserts ``Order`` rows, each in its own
transaction, with Django's SQLite ``timeout`` set as a web app would (5 s), and prints one JSON
line: inserts, "database is locked" errors, other errors and latency percentiles in ms. SIGTERM
ends it early with the same report.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def run(seconds: float, rate: float, timeout: float) -> dict[str, Any]:
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    # First of all: a SIGTERM that comes while Django starts (a loaded machine) still gets its report.
    signal.signal(signal.SIGTERM, stop)
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from django.db import OperationalError, connections, transaction

    from tests.ledger.models import Order

    connections["default"].settings_dict["OPTIONS"]["timeout"] = timeout
    report: dict[str, Any] = {"inserts": 0, "locked": 0, "errors": 0}
    latencies: list[float] = []
    interval = 1 / rate
    next_at = time.monotonic()
    deadline = next_at + seconds
    while not stopping and time.monotonic() < deadline:
        started = time.perf_counter()
        try:
            with transaction.atomic():
                Order.objects.create(label="web")
            report["inserts"] += 1
        except OperationalError as error:
            report["locked" if "locked" in str(error) else "errors"] += 1
            connections["default"].close()
        latencies.append((time.perf_counter() - started) * 1000)
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    report.update(
        p50_ms=round(percentile(latencies, 0.5), 2),
        p99_ms=round(percentile(latencies, 0.99), 2),
        max_ms=round(max(latencies, default=0.0), 2),
    )
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=50.0, help="inserts per second")
    parser.add_argument("--timeout", type=float, default=5.0, help="Django's SQLite busy timeout, seconds")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.seconds, args.rate, args.timeout)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
