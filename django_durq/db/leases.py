"""The statements on a lease: the fence over held rows, the renewal, what a running attempt writes (part of ``base.Dialect``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .rows import JOB, Lease, Renewal, _fence, integer_pairs
from .statements import Statements


class LeaseStatements(Statements):
    """Rows held under a lease: matched, renewed, written while the attempt runs."""

    greatest: str  # set by Dialect

    def held_many(self, leases: Sequence[Lease]) -> tuple[str, list[Any]]:
        """A condition matching the running rows still held under these (id, claim token) pairs.

        One row-value ``IN`` list of integers written into the text (``integer_pairs``): MariaDB
        plans it as ranges of the primary key, where an ``OR`` of as many ``id = … AND
        claim_token = …`` (``_fence``) cost its optimizer a quarter of the kept batch's
        ``UPDATE``. Dialects that can pass the pairs as one array parameter override this, so the
        SQL text stays the same for every batch size and the driver's statement cache can keep
        it (SQLite's ``IN`` takes no list of row values).

        A single pair is written as two equalities: MariaDB finds no key in a one-element
        row-value ``IN`` of a ``DELETE`` or an ``UPDATE`` and reads the whole table.

        A row is running exactly while its ``lease_expires_ms`` is set, and that is what is
        tested: no index starts with it. ``status = 'running'`` let MariaDB read the running rows
        through the status index whenever it counted fewer of them than pairs in the batch (a
        batch with attempts already ended, the end of a drain); a locking statement locks every
        row it reads, so a completion then waited for every other worker's transaction that held
        a running row, and the workers' completions queued up behind one another.
        """
        return f"lease_expires_ms IS NOT NULL AND {_pairs_in('id', leases)}", []

    def attempt_pairs(self, leases: Sequence[Lease]) -> tuple[str, list[Any]]:
        """A condition matching the rows of a table keyed by attempt (``job_id``, ``claim_token``): the
        places under limits (db/places.py). Dialects that can pass the pairs as arrays override it.
        """
        return _pairs_in("job_id", leases), []

    def renew(self, leases: Sequence[Lease], now_ms: int, bound_ms: int | None = None) -> Renewal:
        """Extend leases to at least ``now_ms`` + their length, each matched by its own (id, token).

        A lease only ever moves forward: a renewal that arrives late (its ``now`` read before a
        stall) cannot shorten a lease that a later renewal or claim set. ``bound_ms`` bounds how
        long the renewal may wait for a lock (None: as long as the connection waits); a renewal
        that reaches it fails like one the database refused.
        """
        if not leases:
            return Renewal({})
        held, params = self.held_many(leases)
        self.execute(
            f"UPDATE {JOB} SET lease_expires_ms = {self.greatest}(lease_expires_ms, %s + lease_ms) WHERE {held}",
            [now_ms, *params],
        )
        rows = self.fetchall(f"SELECT id, claim_token, stop_requested FROM {JOB} WHERE {held}", params)
        return Renewal({(row[0], row[1]): bool(row[2]) for row in rows})

    def record_errors(self, lease: Lease, errors: str) -> bool:
        fence, params = _fence([lease])
        return self.execute(f"UPDATE {JOB} SET errors = %s WHERE status = 'running' AND {fence}", [errors, *params]) == 1

    def report_progress(self, lease: Lease, done: int, total: int | None) -> bool:
        fence, params = _fence([lease])
        return (
            self.execute(
                f"UPDATE {JOB} SET progress_done = %s, progress_total = %s WHERE status = 'running' AND {fence}",
                [done, total, *params],
            )
            == 1
        )


def _pairs_in(column: str, leases: Sequence[Lease]) -> str:
    """``column`` and ``claim_token`` among the pairs of ``leases``, written so that a key lookup finds them."""
    if len(leases) == 1:
        ((job_id, token),) = leases
        return f"{column} = {int(job_id)} AND claim_token = {int(token)}"
    return f"({column}, claim_token) IN ({integer_pairs(leases)})"
