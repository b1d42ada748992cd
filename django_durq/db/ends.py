"""The statements that end an attempt: completion, retry, dead letter, cancel, hand-back (a part of ``base.Dialect``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .leases import LeaseStatements
from .rows import JOB, Lease, _fence


class EndStatements(LeaseStatements):
    """Every write that ends an attempt, each fenced by its lease."""

    # A dialect's kept batch as one statement taking one JSON text of [id, claim token, finished
    # at, result] per job, joined to the rows by attempt (SQLite, MariaDB); None: the shared
    # statement, whose lists grow with the batch.
    finish_json_sql: str | None = None

    def complete(self, leases: Sequence[Lease]) -> set[Lease]:
        """Delete finished jobs (the default: nothing kept); returns the leases that were still held."""
        if not leases:
            return set()
        held, params = self.held_many(leases)
        # A job an operator asked to stop is left running for the caller to end cancelled (cancel_running).
        sql = f"DELETE FROM {JOB} WHERE {held} AND NOT stop_requested RETURNING id, claim_token"
        return {(row[0], row[1]) for row in self.fetchall(sql, params)}

    def finished_leases(self, leases: Sequence[Lease]) -> set[Lease]:
        """Which of these leases ended as finished jobs (kept) under their own token."""
        if not leases:
            return set()
        fence, params = _fence(leases)
        rows = self.fetchall(f"SELECT id, claim_token FROM {JOB} WHERE status = 'finished' AND {fence}", params)
        return {(row[0], row[1]) for row in rows}

    def existing_ids(self, ids: Sequence[int]) -> set[int]:
        marks = ", ".join(["%s"] * len(ids))
        return {row[0] for row in self.fetchall(f"SELECT id FROM {JOB} WHERE id IN ({marks})", list(ids))}

    def finish_many(self, kept: Sequence[tuple[Lease, int, str | None]]) -> set[Lease]:
        """Keep a batch of finished jobs (lease, finished at, result text) in one statement.

        Returns the leases that were still held. Finished history is on by default, so this is
        the common completion: one UPDATE per batch, as the delete is one DELETE per batch. A job
        an operator asked to stop, even one whose handler returned before a heartbeat told it,
        is left running for the caller to end cancelled (cancel_running), and to say so.
        """
        if not kept:
            return set()
        leases = [lease for lease, _, _ in kept]
        if self.finish_json_sql is not None:
            batch = json.dumps([[job_id, token, finished_ms, result] for (job_id, token), finished_ms, result in kept])
            updated = self.execute(self.finish_json_sql, [batch])
        else:
            updated = self._finish_listed(kept, leases)
        if updated == len(kept):
            return set(leases)
        return self.finished_leases(leases)  # only this attempt's own token can have finished its row

    def _finish_listed(self, kept: Sequence[tuple[Lease, int, str | None]], leases: list[Lease]) -> int:
        """The shared kept batch: its finish times and results as ``CASE id`` lists, its fence as ``held_many``'s."""
        held, held_params = self.held_many(leases)
        finished_at = " ".join(["WHEN %s THEN %s"] * len(kept))
        params: list[Any] = [value for (job_id, _), finished_ms, _ in kept for value in (job_id, finished_ms)]
        results = [(job_id, result) for (job_id, _), _, result in kept if result is not None]
        result_sql = "NULL"
        if results:
            result_sql = f"CASE id {' '.join(['WHEN %s THEN %s'] * len(results))} ELSE NULL END"
            params.extend(value for pair in results for value in pair)
        return self.execute(
            f"UPDATE {JOB} SET status = 'finished', lease_expires_ms = NULL, finished_ms = CASE id {finished_at} END,"
            f" result = {result_sql} WHERE {held} AND NOT stop_requested",
            params + held_params,
        )

    def retry_later(self, lease: Lease, run_at_ms: int, now_ms: int, errors: str) -> bool:
        """Put a failed job back to wait for its next attempt; False if no longer held or asked to stop.

        The stop request is read by this statement itself, so a cancel that arrives while the
        attempt fails is never lost to the retry: the caller ends that job cancelled (cancel_running).
        """
        fence, params = _fence([lease])
        return (
            self.execute(
                f"UPDATE {JOB} SET status = 'waiting', finished_ms = NULL, run_at_ms = %s, lease_expires_ms = NULL,"
                f" errors = %s WHERE status = 'running' AND NOT stop_requested AND {fence}",
                [run_at_ms, errors, *params],
            )
            == 1
        )

    def bury(self, lease: Lease, now_ms: int, errors: str) -> bool:
        """Make the job a dead letter, keeping its whole error history; False if no longer held or asked to stop."""
        fence, params = _fence([lease])
        return (
            self.execute(
                f"UPDATE {JOB} SET status = 'dead', finished_ms = %s, lease_expires_ms = NULL, errors = %s"
                f" WHERE status = 'running' AND NOT stop_requested AND {fence}",
                [now_ms, errors, *params],
            )
            == 1
        )

    def cancel_running(self, lease: Lease, now_ms: int, errors: str) -> bool:
        fence, params = _fence([lease])
        return (
            self.execute(
                f"UPDATE {JOB} SET status = 'cancelled', finished_ms = %s, lease_expires_ms = NULL, errors = %s"
                f" WHERE status = 'running' AND {fence}",
                [now_ms, errors, *params],
            )
            == 1
        )

    def release(self, leases: Sequence[Lease], *, started: bool, now_ms: int = 0) -> int:
        """Hand jobs back for another worker; the interrupted attempt is not counted.

        A job an operator asked to stop ends cancelled instead. ``started`` counts the hand-back
        (see ``Job.handbacks``); a job that waited in a buffer and never started is not counted.
        The due time stays as it was: the job was already due, so it is claimable at once and
        keeps its place in the order, and a scheduled job keeps the due time it was created for.
        """
        if not leases:
            return 0
        held, params = self.held_many(leases)
        return self.execute(
            f"UPDATE {JOB} SET status = CASE WHEN stop_requested THEN 'cancelled' ELSE 'waiting' END,"
            " finished_ms = CASE WHEN stop_requested THEN %s ELSE NULL END,"
            f" lease_expires_ms = NULL, attempts = attempts - 1, handbacks = handbacks + %s WHERE {held}",
            [now_ms, 1 if started else 0, *params],
        )

    def expired_final_attempts(self, queue: str, now_ms: int) -> list[tuple[int, int, str, int, str, str]]:
        """Running jobs whose lease expired on their last allowed attempt.

        Rows of (id, claim token, name, attempts, errors, lease holder).
        """
        return [
            (row[0], row[1], row[2], row[3], row[4], row[5])
            for row in self.fetchall(
                f"SELECT id, claim_token, name, attempts, errors, claimed_by FROM {JOB} WHERE queue = %s"
                " AND status = 'running' AND lease_expires_ms <= %s AND attempts >= max_attempts",
                (queue, now_ms),
            )
        ]

    def bury_expired(self, lease: Lease, now_ms: int, errors: str) -> str | None:
        """End a job whose worker was lost — only if its lease is still expired; returns how it ended, or None.

        A dead letter, or cancelled when an operator asked it to stop (a cancel is final). Each
        statement re-checks the expiry itself: a lease renewed since the scan is left alone.
        """
        fence, params = _fence([lease])
        for status, asked in (("cancelled", "stop_requested"), ("dead", "NOT stop_requested")):
            if self.execute(
                f"UPDATE {JOB} SET status = '{status}', finished_ms = %s, lease_expires_ms = NULL, errors = %s"
                f" WHERE status = 'running' AND {asked} AND lease_expires_ms <= %s AND {fence}",
                [now_ms, errors, now_ms, *params],
            ):
                return status
        return None
