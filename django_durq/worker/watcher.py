"""Cross-process wake-up: other processes' enqueues kick this process's idle pools at once.

PostgreSQL: a dedicated connection LISTENs; enqueue sends NOTIFY in its transaction, so the
notification arrives only after commit. It connects to ``DURQ["LISTEN_DATABASE"]`` (the queue's
own database unless set), and only where that keeps its server session: a transaction pooler
would lend the session holding the LISTEN to other clients (the supervisor asks, see
``db/pooler.py``). With no such alias there is no LISTEN, and idle workers find new jobs at their
poll interval. At stop, a byte on a socket pair ends the wait on the LISTEN connection at once.

SQLite, and MariaDB for enqueues on the worker's own host: the watcher waits on the process's
bell (``db/doorbell.py``), which an enqueue rings after its commit; a ring this process has no free
slot for is passed on to another worker. Where no bell can be bound it falls back to polling.

With a bell, a SQLite watcher reads nothing: every process that writes to the file runs on its
host, and a commit that rang no bell (raw SQL, a process that may not write to the bells) is found
by the dispatchers' idle probe at the poll interval. Without one it reads ``PRAGMA data_version``
every ``SQLITE_CHECK_S`` (it changes when another connection commits to the file; reading it
takes no lock). MariaDB has no notifications from other hosts: a connection of
the watcher's own reads the newest job ids, every ``MYSQL_CHECK_S`` after a job was seen and
less and less often, down to every ``MYSQL_IDLE_CHECK_S`` (a second), while none comes: that
interval is how late a job enqueued on another host after a quiet spell may be noticed. Ids are
handed out when a transaction inserts, not when it commits, so a transaction that commits after a
later one leaves a gap below the highest id seen; the watcher keeps such gaps in view (for
``GAP_S``) and wakes the pools when one fills. It also reads which of its pools' queues have a
job due, as a job handed back or retried becomes due without a new id (not for a queue whose
pool's claims come back full: it claims again anyway). On any trouble the watcher
kicks every pool, so a lost notification costs at most one probe, never a job; the poll interval
is the last safety net.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from typing import Any

from django.db import connections

from ..clock import now_ms
from ..db import dialect_for, wakeup
from ..db.base import own_connection
from ..db.doorbell import Bell
from ..db.mysql import NEWEST_JOB, watcher_look
from ..db.mysql_claims import claiming
from ..db.postgresql import NOTIFY_CHANNEL

logger = logging.getLogger("django_durq")

# A LISTEN connection that is closed wakes the watcher at once (its socket turns readable); one cut
# off without a word is noticed by a statement this often. Meanwhile the poll interval covers.
LISTEN_CHECK_S = 10.0
SQLITE_CHECK_S = 0.01  # without a bell: 100 cheap reads a second, ~5 ms of added latency on average
# A read on the database server from every worker process: 40 a second each while jobs come (a
# job from another host is seen ~12 ms late on average); the interval doubles after each second
# without one, up to the idle interval: one read a second, so a job from another host after a
# quiet spell is seen up to a second late. Each read wakes the worker, and at 5 a second these
# reads were most of an idle worker's CPU; jobs from the enqueuing host ring its bell at once.
MYSQL_CHECK_S = 0.025
MYSQL_IDLE_CHECK_S = 1.0
MYSQL_SLOW_DOWN_S = 1.0
# How long the watcher waits for a gap in the ids to fill (a transaction still open, or one that
# rolled back), and how many gaps it keeps in view at most; past either, the poll interval covers.
GAP_S = 30.0
MAX_GAPS = 100


class Watcher:
    def __init__(self, alias: str, listen_alias: str | None, worker_id: str | None = None) -> None:
        self.alias = alias
        # PostgreSQL only: where to LISTEN, None for nowhere. The supervisor sets it to an alias
        # whose connections keep their server session (not through a transaction pooler).
        self.listen_alias = listen_alias
        self.worker_id = worker_id  # names the bell; None for none
        self.stopped = threading.Event()
        self.vendor = connections[alias].vendor
        self.bell: Bell | None = None
        # Written to at stop: a wait on the LISTEN connection's socket wakes at once, not at its timeout.
        self._stop_pair: tuple[socket.socket, socket.socket] | None = None
        self._thread = threading.Thread(target=self._run, name="durq-watcher", daemon=True)

    @property
    def active(self) -> bool:
        if self.vendor == "postgresql":
            return self.listen_alias is not None
        return self.vendor in ("sqlite", "mysql")

    def start(self) -> None:
        if self.active:
            if self.worker_id is not None:
                self.bell = Bell.open(self.alias, self.worker_id)
            self._stop_pair = socket.socketpair()
            self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self.bell is not None:
            self.bell.interrupt()
        if self._stop_pair is not None:
            with contextlib.suppress(OSError):  # a LISTEN wait ends at once (see _wait_readable)
                self._stop_pair[1].send(b"\0")
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        if self.bell is not None:
            self.bell.close()
            self.bell = None
        if self._stop_pair is not None:
            for end in self._stop_pair:
                end.close()
            self._stop_pair = None

    def _run(self) -> None:
        delay = 0.1
        while not self.stopped.is_set():
            try:
                if self.vendor == "postgresql":
                    self._listen_postgresql()
                elif self.vendor == "mysql":
                    self._watch_mysql()
                else:
                    self._watch_sqlite()
                delay = 0.1
            except Exception as error:  # noqa: BLE001 - reconnect; polling covers the gap
                logger.warning("durq: wake-up watcher lost its connection (%s); reconnecting", type(error).__name__)
                wakeup.notify_all()
                self.stopped.wait(delay)
                delay = min(delay * 2, 5.0)
            finally:
                connections[self.alias].close()

    def _wait(self, seconds: float) -> bool:
        """Wait up to ``seconds``, answering the rings that come meanwhile; True once stopped."""
        if self.bell is None:
            return self.stopped.wait(seconds)
        deadline = time.monotonic() + seconds
        while not self.stopped.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if select.select([self.bell], [], [], left)[0]:
                self._answer(self.bell)
        return True

    def _answer(self, bell: Bell) -> None:
        for queue, tried in bell.take():
            if wakeup.offer(queue):
                logger.debug("durq: a job of queue %r rang this worker's bell: claiming it here", queue)
            else:  # no free slot here: another worker may have one
                outcome = "passed on" if bell.pass_on(queue, tried) else "no other worker to ask"
                logger.debug("durq: a job of queue %r rang this worker's bell: %s", queue, outcome)

    def _watch_sqlite(self) -> None:
        if self.bell is not None:
            while not self._wait(3600.0):
                pass
            return
        read_version = dialect_for(connections[self.alias]).data_version_reader()  # type: ignore[attr-defined]
        last = read_version()
        while not self.stopped.wait(SQLITE_CHECK_S):
            version = read_version()
            if version != last:
                last = version
                wakeup.notify_all()

    def _watch_mysql(self) -> None:
        raw = own_connection(connections[self.alias])
        try:
            raw.autocommit(True)  # every read starts a fresh snapshot
            cursor = raw.cursor()
            cursor.execute(NEWEST_JOB)
            last = cursor.fetchone()[0] or 0
            gaps = IdGaps(last)
            due: set[str] = set()
            wakeup.notify_all()  # anything enqueued before we looked
            pace = Pace()
            while not self._wait(pace.interval()):
                open_gaps = gaps.open()
                queues = due_reads(self.alias)
                now = now_ms()
                params = [gaps.last, *open_gaps, *(value for queue in queues for value in (queue, now, queue))]
                cursor.execute(watcher_look(len(open_gaps), len(queues)), params)
                rows = cursor.fetchall()
                if gaps.saw(sorted(row[0] for row in rows if row[0] is not None), time.monotonic()):
                    pace.busy()
                    wakeup.notify_all()
                # A queue that had nothing due and now has: a hand-back, a retry, an operator's
                # retry or a resume made an existing job due (a queue that stays busy needs no wake-up).
                now_due = {row[1] for row in rows if row[1] is not None}
                if now_due - due:
                    pace.busy()
                    wakeup.notify(now_due - due)
                due = now_due
        finally:
            raw.close()

    def _listen_postgresql(self) -> None:
        assert self.listen_alias is not None  # else not active
        raw = own_connection(connections[self.listen_alias])  # it stays in LISTEN for good
        try:
            raw.autocommit = True
            cursor = raw.cursor()
            cursor.execute(f"LISTEN {NOTIFY_CHANNEL}")
            wakeup.notify_all()  # anything enqueued while we were not listening
            if hasattr(raw, "notifies") and callable(raw.notifies):
                self._pump_psycopg3(raw)
            else:
                self._pump_psycopg2(raw)
        finally:
            raw.close()

    def _wait_readable(self, raw: Any, seconds: float) -> bool:
        """Wait until the LISTEN connection has something to read, or ``stop()``; True when it has."""
        assert self._stop_pair is not None  # made by start()
        ready, _, _ = select.select([raw, self._stop_pair[0]], [], [], seconds)
        return raw in ready and not self.stopped.is_set()

    def _pump_psycopg3(self, raw: Any) -> None:
        # Notifications are read through notifies() alone: psycopg (3.2.4 and later) keeps one that
        # arrives while a statement runs (the idle check below) for the next notifies(). A notify
        # handler besides would take such notifications from it, and psycopg warns against the mix.
        checked = time.monotonic()
        while not self.stopped.is_set():
            if self._wait_readable(raw, max(LISTEN_CHECK_S - (time.monotonic() - checked), 0.0)):
                queues = {notice.payload for notice in raw.notifies(timeout=0, stop_after=1000)}
                if queues:
                    wakeup.notify(queues)
            elif not self.stopped.is_set() and time.monotonic() - checked >= LISTEN_CHECK_S:
                checked = time.monotonic()
                raw.execute("SELECT 1")  # notices a connection that died without a word
                queues = {notice.payload for notice in raw.notifies(timeout=0, stop_after=1000)}
                if queues:  # arrived during the check
                    wakeup.notify(queues)

    def _pump_psycopg2(self, raw: Any) -> None:
        while not self.stopped.is_set():
            self._wait_readable(raw, LISTEN_CHECK_S)
            raw.poll()
            if raw.notifies:
                queues = {notice.payload for notice in raw.notifies}
                raw.notifies.clear()
                wakeup.notify(queues)


def due_reads(alias: str) -> list[str]:
    """The queues of this process whose due jobs the MariaDB watcher reads: those not being claimed in full.

    A pool whose last claim took all it asked for claims again on its own; for its queue, the
    read would only walk the rows its claims are moving (with many workers, most of the watcher's
    cost), to wake a pool that needs no waking.
    """
    return [queue for queue in wakeup.subscribed() if not claiming(alias, queue)]


class Pace:
    """How often the MariaDB watcher reads: often while jobs come, less and less while none does."""

    def __init__(self) -> None:
        self._seen = time.monotonic()

    def busy(self) -> None:
        self._seen = time.monotonic()

    def interval(self) -> float:
        quiet_s = time.monotonic() - self._seen
        if quiet_s < MYSQL_SLOW_DOWN_S:
            return MYSQL_CHECK_S
        return min(MYSQL_CHECK_S * 2 ** int(quiet_s / MYSQL_SLOW_DOWN_S), MYSQL_IDLE_CHECK_S)


class IdGaps:
    """Which job ids the MariaDB watcher has yet to see: those above the highest seen, and the gaps below it."""

    def __init__(self, last: int) -> None:
        self.last = last
        self._gaps: dict[int, float] = {}  # id -> when it was first missed (monotonic)

    def open(self) -> list[int]:
        """Ids below the highest seen that were not there yet: still open, rolled back, or deleted."""
        return sorted(self._gaps)

    def saw(self, ids: list[int], now: float) -> bool:
        """Take in the ids read (above ``last``, and among ``open()``); True when one is new (a job was queued)."""
        present = set(ids)
        new = False
        for gap in [gap for gap in self._gaps if gap in present]:
            del self._gaps[gap]
            new = True
        above = [job_id for job_id in ids if job_id > self.last]
        if above:
            new = True
            top = above[-1]
            # The ids just below the newest are the ones a transaction still open may commit.
            for missing in set(range(max(self.last + 1, top - MAX_GAPS), top)) - present:
                self._gaps[missing] = now
            self.last = top
        for gap, since in list(self._gaps.items()):
            if now - since > GAP_S:
                del self._gaps[gap]
        if len(self._gaps) > MAX_GAPS:
            for gap in sorted(self._gaps)[: len(self._gaps) - MAX_GAPS]:
                del self._gaps[gap]
        return new
