"""A web server of the compressed day: queues jobs at a steady rate and notes every acknowledged id.

It runs the release named in a file the harness writes (a web deploy), queues one batch every
20 ms through ``enqueue_many`` (one transaction per job type in the batch), and appends the ids
of each committed call to its file. A call that fails may still have committed: its tag is
written as ``?<seed>:<batch>:<type>:<jobs>``, and the verdict counts up to that many runs of
jobs it never saw acknowledged as committed before the error, not as unexpected.

    python -m benchmarks.day.producer OUT RELEASE_FILE SECONDS RATE SEED
"""

from __future__ import annotations

import random
import sys
import time
from collections import defaultdict
from pathlib import Path

BATCH_S = 0.02


def release_of(path: Path, fallback: int) -> int:
    try:
        return int(path.read_text().strip() or fallback)
    except (OSError, ValueError):
        return fallback


def main(out: Path, release_file: Path, seconds: float, rate: float, seed: int) -> int:
    import django

    django.setup()
    from django.db import DatabaseError, connections

    from benchmarks.day import jobs
    from django_durq.handlers.registry import registry

    rng = random.Random(seed)
    per_batch = max(1, round(rate * BATCH_S))
    release, read_at = 0, 0.0
    started = time.monotonic()
    deadline, due = started + seconds, started
    late_s = 0.0
    with out.open("a") as acked:
        batch = 0
        while time.monotonic() < deadline:
            if time.monotonic() - read_at > 1:
                release, read_at = release_of(release_file, release), time.monotonic()
            t = time.time_ns() // 1_000_000
            by_name: dict[str, list[dict[str, object]]] = defaultdict(list)
            for name, kwargs in jobs.items(release, per_batch, rng, t):
                by_name[name].append(kwargs)
            batch += 1
            for name, items in by_name.items():
                try:
                    created = registry.require(name).enqueue_many(items)
                except DatabaseError as error:
                    acked.write(f"?{seed}:{batch}:{name}:{len(items)}\n")
                    print(f"enqueue failed: {type(error).__name__}: {str(error).strip()[:160]}", file=sys.stderr, flush=True)
                    connections.close_all()  # as a web request ends: the next call reconnects
                    continue
                acked.write("".join(f"{job.pk}\n" for job in created))
            acked.flush()
            due += BATCH_S
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                late_s = max(late_s, -pause)
    print(f"producer {seed}: {batch} batches of {per_batch}; at most {late_s:.2f} s behind its pace", flush=True)
    return 0


if __name__ == "__main__":
    out, release_file, seconds, rate, seed = sys.argv[1:6]
    sys.exit(main(Path(out), Path(release_file), float(seconds), float(rate), int(seed)))
