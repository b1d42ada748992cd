"""What a database server on this machine spends on a workload, read from ``/proc``.

- The sessions of one database: the backend processes (PostgreSQL, ``pg_stat_activity``) or
  connection threads (MariaDB, ``information_schema.PROCESSLIST.TID``) serving it. Another
  engineer's tests on other databases of the same server do not count here.
- The whole server: the postmaster and its children, or every thread of ``mariadbd``;
  background work (WAL writer, checkpointer, InnoDB purge and flushing) included, and so is
  anything else the server does meanwhile.
- The machine: the share of all its CPUs that was busy, from ``/proc/stat``.

A server on another host gives no figures (None): its processes are not in this ``/proc``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import procs
from .databases import Database

_LOCAL = ("127.0.0.1", "localhost", "::1")


def _cpu_ns(task: Path) -> int | None:
    """Time on a CPU of one process's main thread or of one thread (``/proc/…/task/TID``), in ns.

    ``schedstat`` counts nanoseconds; ``stat`` (the fallback) counts clock ticks of 10 ms, too
    coarse for a backend that works a few seconds.
    """
    try:
        return int((task / "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        text = (task / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // procs.CLOCK_TICKS


def _comm_pids(names: tuple[str, ...]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                comm = Path(f"/proc/{entry}/comm").read_text().strip()
            except OSError:
                continue
            if comm in names:
                found.append(int(entry))
    return found


def _parent(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2 :].split()[1])


def _mariadbd() -> int | None:
    pids = _comm_pids(("mariadbd", "mysqld"))
    return pids[0] if len(pids) == 1 else None


class ServerCPU:
    """CPU counters of one database's sessions, of the whole server and of the machine, read together."""

    def __init__(self, db: Database, host: str) -> None:
        self.sessions: list[Path] = []
        self.server: list[Path] = []
        if host not in _LOCAL:
            return
        if db.kind == "postgres":
            rows = db.query("SELECT pid, pg_backend_pid() FROM pg_stat_activity WHERE datname = current_database()")
            mine = int(rows[0][1]) if rows else 0
            self.sessions = [Path(f"/proc/{row[0]}") for row in rows if int(row[0]) != mine]
            postmaster = _parent(int(rows[0][0])) if self.sessions else None
            if postmaster is not None:
                children = [pid for pid in _comm_pids(("postgres",)) if _parent(pid) == postmaster]
                self.server = [Path(f"/proc/{pid}") for pid in (postmaster, *children)]
        elif db.kind == "mysql":
            server = _mariadbd()
            if server is None:
                return
            rows = db.query("SELECT TID FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID()")
            self.sessions = [Path(f"/proc/{server}/task/{row[0]}") for row in rows]
            self.server = [Path(f"/proc/{server}/task/{tid}") for tid in os.listdir(f"/proc/{server}/task")]

    def read(self) -> Reading:
        """CPU time so far of each session and server task (ns), and the machine's (busy, total) jiffies."""
        return Reading(
            {path: _cpu_ns(path) for path in self.sessions} if self.sessions else None,
            {path: _cpu_ns(path) for path in self.server} if self.server else None,
            _machine(),
        )


@dataclass(frozen=True)
class Reading:
    sessions: dict[Path, int | None] | None
    server: dict[Path, int | None] | None
    machine: tuple[float, float]


def _machine() -> tuple[float, float]:
    with open("/proc/stat") as handle:
        fields = [float(value) for value in handle.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def _seconds(before: dict[Path, int | None] | None, after: dict[Path, int | None] | None) -> float | None:
    """CPU seconds between two reads of the tasks alive at both (one that ended or began in between is left out)."""
    if before is None or after is None:
        return None
    spent_ns = 0
    for path, first in before.items():
        last = after.get(path)
        if first is not None and last is not None:
            spent_ns += last - first
    return spent_ns / 1e9


def spent(before: Reading, after: Reading) -> dict[str, float | None]:
    """CPU seconds of the database's sessions and of the server between two reads; the machine's busy %."""
    busy = after.machine[0] - before.machine[0]
    total = after.machine[1] - before.machine[1]
    return {
        "sessions_cpu_s": _seconds(before.sessions, after.sessions),
        "server_cpu_s": _seconds(before.server, after.server),
        "machine_busy_percent": 100 * busy / total if total else None,
    }
