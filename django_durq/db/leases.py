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
        """
        return f"status = 'running' AND (id, claim_token) IN ({integer_pairs(leases)})", []

    def attempt_pairs(self, leases: Sequence[Lease]) -> tuple[str, list[Any]]:
        """A condition matching the rows of a table keyed by attempt (``job_id``, ``claim_token``): the
        places under limits (db/places.py). Dialects that can pass the pairs as arrays override it.
        """
        return f"(job_id, claim_token) IN ({integer_pairs(leases)})", []

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
