"""What a MariaDB worker's claims of each queue found: when to look for expired leases, whether to take turns.

Kept per process, beside the dialect (``mysql.py``), which asks it before each claim.
"""

from __future__ import annotations

import threading
import time

# How often a claim that keeps coming back full also looks for jobs whose lease ran out (the
# expired pick). MariaDB has no partial lease index: the pick walks every running row of the
# queue, every worker's claimed-ahead batch, locking or passing over each, so with many worker
# processes it cost most of each claim and held up their completions (16 processes drained at a
# sixth of 4 processes' rate). A claim that came back short looks every time, as does the first
# claim after this long (in the claims' own time); a busy worker thus still takes a lost worker's
# jobs within this of their expiry, well inside the bound of lease + ``POLL_INTERVAL`` + 1 s.
# A busy worker's look reads first, without locking, whether any lease ran out: locking each
# running row as it passed, the pick made every other worker's completion of that row wait. And
# only one busy worker of all looks in each such span of the database's clock (a named lock per
# queue and span, kept by the session that took it until it takes the next): each look
# walks every process's running rows, so one per process made the looks' cost grow with the square
# of the processes (with 16, a quarter of the pages the drain read).
EXPIRED_LOOK_MS = 500


# Claimers of one queue take turns: a named lock per database and queue, waited for in GET_LOCK,
# which holds no read view and no row lock of its own. Claiming side by side, each claim walked the
# head of the claim index past the others' locked batches, and so many sessions at work starved
# purge of the entries claims had moved out of the waiting range: with 16 processes every claim
# walked thousands of them, and the drain fell to a third of 2 processes'. The turn orders claims;
# it guards nothing. A claim that waited ``CLAIM_TURN_WAIT_S`` goes ahead without it. When the same
# session held the turn through two such waits in a row, it is stalled in its claim (a paused
# process, whose session keeps its locks), and this process's claims of that queue go side by side
# for ``CLAIM_TURN_STALL_S`` before they ask again: a stalled holder costs each other process two
# seconds per ``CLAIM_TURN_STALL_S`` and stops none of them. A turn that only moves slowly (many
# processes on a loaded machine) passes from session to session and is still waited for.
CLAIM_TURN_WAIT_S = 1.0
CLAIM_TURN_STALL_S = 10.0


class ClaimMemory:
    """What this process's last claims of each queue found: when to look for expired leases again, whether to take turns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._looked: dict[tuple[str, str, str], int] = {}  # (alias, queue, worker) -> time of the last expired pick
        self._full: dict[tuple[str, str, str], bool] = {}  # the last claim took all it asked for
        self._full_queues: set[tuple[str, str]] = set()  # (alias, queue) whose last claim came back full
        self._turn_missed: dict[tuple[str, str], int] = {}  # (alias, queue) -> who held the turn last waited for in vain
        self._look_span: dict[tuple[str, str, str], int] = {}  # (alias, queue, worker) -> the span of its last ask
        self._turn_stalled: dict[tuple[str, str], float] = {}  # (alias, queue) -> when that session was seen holding it twice

    def take_turns(self, key: tuple[str, str]) -> bool:
        """Whether claims of this (alias, queue) wait for their turn: not for a while after its holder stalled."""
        with self._lock:
            stalled = self._turn_stalled.get(key)
            return stalled is None or time.monotonic() - stalled >= CLAIM_TURN_STALL_S

    def turn_missed(self, key: tuple[str, str], holder: int | None) -> None:
        """The turn did not come: ``holder`` (a session's id, None once free) held it at the end of the wait."""
        with self._lock:
            if holder is not None and self._turn_missed.pop(key, None) == holder:
                self._turn_stalled[key] = time.monotonic()
            elif holder is not None:
                self._turn_missed[key] = holder

    def turn_came(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._turn_missed.pop(key, None)
            self._turn_stalled.pop(key, None)

    def look_expired(self, key: tuple[str, str, str], now_ms: int) -> str | None:
        """None: no look this claim; ``"read first"``: a busy worker's look; ``"pick"``: pick at once."""
        with self._lock:
            looked = self._looked.get(key)
            full = self._full.get(key)
            if full and looked is not None and looked <= now_ms < looked + EXPIRED_LOOK_MS:
                return None
            self._looked[key] = now_ms
            return "read first" if full else "pick"

    def look_span(self, key: tuple[str, str, str], span: int) -> int | None:
        """Note that this worker's session asks for ``span``'s look of the queue; the span it asked for before."""
        with self._lock:
            before = self._look_span.get(key)
            self._look_span[key] = span
            return before

    def full(self, key: tuple[str, str, str]) -> bool:
        """Whether this worker's last claim of the queue took all it asked for."""
        with self._lock:
            return self._full.get(key, False)

    def took(self, key: tuple[str, str, str], full: bool) -> None:
        with self._lock:
            self._full[key] = full
            if full:
                self._full_queues.add(key[:2])
            else:
                self._full_queues.discard(key[:2])

    def claiming(self, alias: str, queue: str) -> bool:
        with self._lock:
            return (alias, queue) in self._full_queues


claims = ClaimMemory()


def claiming(alias: str, queue: str) -> bool:
    """Whether the last claim of ``queue`` in this process took all it asked for.

    Such a pool claims again without waiting for a wake-up or probing first, until a claim comes
    back short: the watcher need not read whether a job of that queue is due. (A time window
    instead would let a queue whose claims are slow drop in and out of the watcher's reads, each
    return reading as a job newly due: a wake-up, and the watcher back at its fastest pace.)
    """
    return claims.claiming(alias, queue)
