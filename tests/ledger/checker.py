"""The ledger verdict: what became of every acknowledged job, in the categories of a Jepsen analysis.

The test handlers write one ``Effect`` row (job id, claim token, pid, start time) per execution.
After a drain, :func:`judge` compares three things: the ids whose enqueue was acknowledged (the
caller saw the commit), the job rows, and the effect rows.

| category     | meaning                                                                        |
|--------------|--------------------------------------------------------------------------------|
| lost         | acknowledged, but not in a terminal state (or finished without any effect)    |
| duplicated   | more than one effect row                                                       |
| unexpected   | an effect for an id that was never acknowledged                                |
| unexplained  | a duplicate that the job's error history does not account for                  |

A duplicate is *explained* only when every extra execution has its own claim token and the job's
error history records as many interrupted attempts:

- a lost worker: it was killed, paused or cut off, and another worker took the job over (once
  its presence lock was released, ``worker_lost``, or once its lease expired, ``lease_expired``);
- a timeout: a hung handler whose completion was fenced off;
- a failed completion: the attempt failed on a database connection error, so the handler's own
  commit may have landed while the client saw the connection drop (an indeterminate commit).

Anything else is a job run twice that nothing excuses.

:func:`judge` is plain Python over plain data, so the soak script can feed it rows read by raw
SQL; :func:`check` reads them through the ORM for the tests.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

TERMINAL = frozenset({"finished", "dead", "cancelled", "deleted"})
# A finished job with nothing kept is deleted: no row, and the effect says it ran.
GONE = "deleted"
# How a lost worker's attempt is recorded: taken over once its lock was released, or once its lease expired.
WORKER_LOST_KINDS = frozenset({"lease_expired", "worker_lost"})
EXPLAINING_KINDS = WORKER_LOST_KINDS | {"timeout"}
CONNECTION_ERRORS = ("OperationalError", "InterfaceError")


@dataclass(frozen=True)
class JobRecord:
    id: int
    status: str
    attempts: int = 0
    errors: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_row(cls, job_id: int, status: str, attempts: int, errors_text: str | None) -> JobRecord:
        try:
            errors = tuple(json.loads(errors_text or "[]"))
        except ValueError:
            errors = ()
        return cls(job_id, status, attempts, errors)

    def interruptions(self, kinds: Collection[str] = EXPLAINING_KINDS) -> int:
        """Recorded attempts of ``kinds``, plus attempts that failed on a connection error."""
        return sum(1 for entry in self.errors if entry.get("kind") in kinds or _failed_completion(entry))


@dataclass
class Verdict:
    acked: int
    effects: int
    executed: int
    lost: list[int] = field(default_factory=list)
    duplicated: list[int] = field(default_factory=list)
    unexpected: list[int] = field(default_factory=list)
    unexplained: list[int] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    lease_expiries: int = 0

    @property
    def ok(self) -> bool:
        """Nothing lost, nothing unexpected, every duplicate explained."""
        return not (self.lost or self.unexpected or self.unexplained)

    @property
    def exact(self) -> bool:
        """What a run without faults must give: ok, and no job ran twice."""
        return self.ok and not self.duplicated

    def lines(self) -> list[str]:
        def show(ids: list[int]) -> str:
            head = ", ".join(map(str, ids[:10]))
            return f"{len(ids)}" + (f"  (ids {head}{', …' if len(ids) > 10 else ''})" if ids else "")

        return [
            f"acknowledged jobs      {self.acked}",
            f"effect rows            {self.effects}",
            f"jobs executed          {self.executed}",
            f"lost                   {show(self.lost)}",
            f"duplicated             {show(self.duplicated)}",
            f"unexpected             {show(self.unexpected)}",
            f"unexplained duplicates {show(self.unexplained)}",
            f"dead letters           {show(self.dead)}",
            f"lease expiries         {self.lease_expiries}",
            f"verdict                {'PASS' if self.ok else 'FAIL'}",
        ]

    def __str__(self) -> str:
        return "\n".join(self.lines())


def judge(
    acked: Iterable[int],
    jobs: Mapping[int, JobRecord],
    effects: Iterable[tuple[int, int]],
    *,
    needs_effect: bool = True,
    explaining_kinds: Collection[str] = EXPLAINING_KINDS,
    indeterminate: Collection[int] = (),
    history_deleted: bool = False,
) -> Verdict:
    """The verdict over acknowledged ids, job rows by id, and effect rows as (job id, claim token).

    A job id missing from ``jobs`` counts as finished and deleted. With ``needs_effect``, a job
    that finished (kept or deleted) without a single effect row counts as lost too: the test
    handlers write their effect before they return. ``indeterminate`` ids come from enqueue
    calls that failed after they may have committed; their effects are not unexpected.

    With ``history_deleted`` (finished jobs are deleted, the default outside tests) the error
    history is gone with the row. A duplicate then counts as explained when each run carries its
    own claim token: the queue claims a job again only after a lease expiry, a failed attempt or
    a hand-back, never while a lease is valid. Two runs under one token are never explained.
    """
    acked_ids = set(acked)
    tokens: dict[int, list[int]] = defaultdict(list)
    for job_id, token in effects:
        tokens[job_id].append(token)
    verdict = Verdict(acked=len(acked_ids), effects=sum(len(t) for t in tokens.values()), executed=len(tokens))
    verdict.unexpected = sorted(set(tokens) - acked_ids - set(indeterminate))
    for job_id in sorted(acked_ids):
        record = jobs.get(job_id, JobRecord(job_id, GONE))
        ran = tokens.get(job_id, [])
        if record.status not in TERMINAL or (needs_effect and record.status in ("finished", GONE) and not ran):
            verdict.lost.append(job_id)
        if record.status == "dead":
            verdict.dead.append(job_id)
        verdict.lease_expiries += sum(1 for entry in record.errors if entry.get("kind") in WORKER_LOST_KINDS)
        if len(ran) > 1:
            verdict.duplicated.append(job_id)
            distinct = len(set(ran)) == len(ran)
            if history_deleted and record.status == GONE:
                explained = distinct
            else:
                explained = distinct and len(ran) - 1 <= record.interruptions(explaining_kinds)
            if not explained:
                verdict.unexplained.append(job_id)
    return verdict


def _failed_completion(entry: Mapping[str, Any]) -> bool:
    return entry.get("kind") == "exception" and str(entry.get("type", "")).endswith(CONNECTION_ERRORS)


def check(
    acked: Iterable[int],
    *,
    using: str = "default",
    tag: str | None = None,
    needs_effect: bool = True,
    indeterminate: Collection[int] = (),
    history_deleted: bool = False,
) -> Verdict:
    """:func:`judge` over the test database, optionally only over effects with one ``tag``."""
    from django_durq.models import Job
    from tests.ledger.models import Effect

    acked_ids = set(acked)
    rows = Job.objects.using(using).filter(pk__in=acked_ids).values_list("pk", "status", "attempts", "errors")
    jobs = {pk: JobRecord.from_row(pk, status, attempts, errors) for pk, status, attempts, errors in rows}
    effects = Effect.objects.using(using)
    if tag is not None:
        effects = effects.filter(tag=tag)
    return judge(
        acked_ids,
        jobs,
        effects.values_list("job_id", "token"),
        needs_effect=needs_effect,
        indeterminate=indeterminate,
        history_deleted=history_deleted,
    )


def effects_per_job(using: str = "default") -> Counter[int]:
    from tests.ledger.models import Effect

    return Counter(Effect.objects.using(using).values_list("job_id", flat=True))
