"""Processes the harness starts, and what /proc says about them (RSS, CPU time, load).

Each system's worker is started in a session of its own, so that it and every child it forks
(Celery's prefork pool, several ``db_worker`` processes) can be measured and stopped together
by process group, and nothing else on the machine is touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 1_048_576


def loadavg() -> list[float]:
    with open("/proc/loadavg") as handle:
        return [float(part) for part in handle.read().split()[:3]]


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after the last ')'.
    return text[text.rindex(")") + 2 :].split()


def group_members(pgids: Sequence[int]) -> list[int]:
    """Every live process whose process group is one of ``pgids``."""
    wanted = set(pgids)
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        # fields[0] is the state, [2] the process group; zombies are gone in all but name.
        if fields is not None and int(fields[2]) in wanted and fields[0] != "Z":
            members.append(int(entry))
    return members


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and of the children it has waited for."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    # After the state (index 0): utime, stime, cutime, cstime are at 11..14.
    return sum(int(value) for value in fields[11:15]) / CLOCK_TICKS


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * PAGE_MB
    except OSError:
        return 0.0


def pss_mb(pid: int) -> float:
    """Proportional set size: shared pages (a forked pool's) split between the processes sharing them."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for row in handle:
                if row.startswith("Pss:"):
                    return int(row.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@dataclass
class Sample:
    t: float
    rss_mb: float
    processes: int
    max_process_mb: float
    pss_mb: float = 0.0


@dataclass
class Group:
    """Worker processes started together, each leading its own process group."""

    popens: list[subprocess.Popen[bytes]]
    started: float
    logs: list[Path]
    samples: list[Sample] = field(default_factory=list)
    _sampler: threading.Thread | None = None
    _stop_sampling: threading.Event = field(default_factory=threading.Event)
    _cpu_seen: dict[int, float] = field(default_factory=dict)

    @property
    def pgids(self) -> list[int]:
        return [popen.pid for popen in self.popens]

    def members(self) -> list[int]:
        return group_members(self.pgids)

    def alive(self) -> bool:
        return any(popen.poll() is None for popen in self.popens)

    def cpu_seconds(self) -> float:
        """CPU used by every process of the group so far (processes that exited count as last seen)."""
        for pid in self.members():
            self._cpu_seen[pid] = max(self._cpu_seen.get(pid, 0.0), cpu_seconds(pid))
        return sum(self._cpu_seen.values())

    def rss(self) -> Sample:
        sizes = [rss_mb(pid) for pid in self.members()]
        return Sample(time.time(), sum(sizes), len(sizes), max(sizes, default=0.0))

    def start_sampling(self, interval_s: float = 0.1) -> None:
        def loop() -> None:
            members: list[int] = []
            last_scan = 0.0
            while not self._stop_sampling.wait(interval_s):
                now = time.time()
                if now - last_scan > 1.0 or not members:
                    members = self.members()
                    last_scan = now
                sizes = [rss_mb(pid) for pid in members]
                pss = sum(pss_mb(pid) for pid in members)
                self.samples.append(Sample(now, sum(sizes), len(sizes), max(sizes, default=0.0), pss))
                for pid in members:
                    self._cpu_seen[pid] = max(self._cpu_seen.get(pid, 0.0), cpu_seconds(pid))

        self._sampler = threading.Thread(target=loop, name="bench-sampler", daemon=True)
        self._sampler.start()

    def stop_sampling(self) -> None:
        self._stop_sampling.set()
        if self._sampler is not None:
            self._sampler.join()

    def peak_rss_mb(self) -> float:
        return max((sample.rss_mb for sample in self.samples), default=0.0)

    def peak_pss_mb(self) -> float:
        return max((sample.pss_mb for sample in self.samples), default=0.0)

    def peak_process_mb(self) -> float:
        return max((sample.max_process_mb for sample in self.samples), default=0.0)

    def stop(self, timeout_s: float = 20.0) -> list[int | None]:
        """SIGTERM each process group, then SIGKILL what is left after ``timeout_s``."""
        self.stop_sampling()
        for popen in self.popens:
            if popen.poll() is None:
                _signal_group(popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for popen in self.popens:
            try:
                popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for popen in self.popens:
            # Children outlive a leader that exited (a prefork pool): clear the whole group.
            _signal_group(popen.pid, signal.SIGKILL)
            if popen.poll() is None:
                popen.wait()
        return [popen.returncode for popen in self.popens]

    def log_tail(self, chars: int = 2000) -> str:
        text = ""
        for log in self.logs:
            try:
                text += log.read_text(errors="replace")[-chars:]
            except OSError:
                pass
        return text


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def start_group(commands: Sequence[Sequence[str]], env: dict[str, str], cwd: Path, log_dir: Path, tag: str) -> Group:
    """Start each command as the leader of a new session, output to a log file."""
    log_dir.mkdir(parents=True, exist_ok=True)
    popens = []
    logs = []
    started = time.time()
    for index, command in enumerate(commands):
        log = log_dir / f"{tag}-{index}.log"
        with log.open("wb") as sink:
            popens.append(
                subprocess.Popen(list(command), cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
            )
        logs.append(log)
    return Group(popens=popens, started=started, logs=logs)


def run(command: Sequence[str], env: dict[str, str], cwd: Path, timeout_s: float = 900) -> str:
    """Run to completion; stdout as text, or RuntimeError with the output's tail."""
    done = subprocess.run(list(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise RuntimeError(f"{' '.join(command[:6])} exited {done.returncode}:\n{tail}")
    return done.stdout
