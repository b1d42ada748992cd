"""The one thing every benchmark job does: append (job number, wall-clock time) to a file.

A handler writes 16 bytes with one ``os.write`` on a file opened ``O_APPEND`` (about a
microsecond), so every system pays the same for it and the harness learns, without asking any
queue, when each job started and how many ran, duplicates included.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

RECORD = struct.Struct("<qd")


def read(path: Path) -> list[tuple[int, float]]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    usable = len(data) - len(data) % RECORD.size
    return [RECORD.unpack_from(data, offset) for offset in range(0, usable, RECORD.size)]


def count(path: Path) -> int:
    try:
        return os.stat(path).st_size // RECORD.size
    except FileNotFoundError:
        return 0


def wait_for(path: Path, expected: int, timeout_s: float, alive: Callable[[], bool], poll_s: float = 0.01) -> bool:
    """Wait until ``expected`` records are in the file; False on timeout or when the workers died."""
    deadline = time.monotonic() + timeout_s
    checks = 0
    while time.monotonic() < deadline:
        if count(path) >= expected:
            return True
        checks += 1
        if checks % 50 == 0 and not alive():
            return count(path) >= expected
        time.sleep(poll_s)
    return False
