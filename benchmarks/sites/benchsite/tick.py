"""Append (job number, start time) to $BENCH_TICKS: 16 bytes, one write, the same for every system."""

import os
import struct
import time

_RECORD = struct.Struct("<qd")
_PATH = os.environ.get("BENCH_TICKS")
_fd = None
_pid = None


def tick(number):
    global _fd, _pid
    if not _PATH:
        return
    now = time.time()
    pid = os.getpid()
    if _fd is None or _pid != pid:  # a forked pool child opens its own descriptor
        _fd = os.open(_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _pid = pid
    os.write(_fd, _RECORD.pack(number, now))
