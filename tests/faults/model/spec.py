"""What a scenario of the model-based chaos test is made of: workers, jobs, workflows and a timeline.

Plain, frozen data (``scenario.generate`` builds it from a seed): the workers (which queues each
serves, with which settings), the jobs and workflows to queue and when, and a timeline of
operator actions and faults, each at a time in seconds from the scenario's start.
:meth:`Scenario.describe` prints it, as failure messages show it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class JobSpec:
    """One job: its type and options, and what its handler does (see tests/ledger/model_jobs.py)."""

    tag: str
    type: str = "model.work"
    queue: str = "default"
    key: str = ""
    hold: float = 0.0
    hold_first: float = 0.0
    stubborn: bool = False
    fail: str = ""
    max_attempts: int = 3
    timeout: float | None = None
    unique: str | None = None

    def kwargs(self) -> dict[str, Any]:
        """The handler's arguments: the tag, and only what differs from the defaults."""
        found: dict[str, Any] = {"tag": self.tag}
        if self.key:
            found["key"] = self.key
        for name, default in (("hold", 0.0), ("hold_first", 0.0), ("stubborn", False), ("fail", "")):
            if getattr(self, name) != default:
                found[name] = getattr(self, name)
        return found

    def short(self) -> str:
        parts = [self.type.removeprefix("model."), self.queue]
        if self.key:
            parts.append(f"key={self.key}")
        if self.hold or self.hold_first:
            parts.append(f"hold={self.hold_first or self.hold:g}")
        parts += [word for word, on in (("stubborn", self.stubborn), (f"fail={self.fail}", self.fail)) if on]
        if self.timeout:
            parts.append(f"timeout={self.timeout:g}")
        if self.unique:
            parts.append(f"unique={self.unique}")
        return " ".join(parts)


@dataclass(frozen=True)
class Member:
    job: JobSpec
    after: tuple[int, ...] = ()  # indexes of earlier members
    external: tuple[str, ...] = ()  # tags of plain jobs queued before the workflow
    on_failure: str | None = None


@dataclass(frozen=True)
class FlowSpec:
    name: str
    at: float
    members: tuple[Member, ...]
    on_failure: str = "cancel"


@dataclass(frozen=True)
class BatchSpec:
    name: str
    at: float
    jobs: tuple[JobSpec, ...]


@dataclass(frozen=True)
class Op:
    """An operator action or a fault at ``at`` seconds; ``target`` names a workflow, a job tag, a queue or a worker slot."""

    at: float
    # cancel_workflow, cancel_job, retry_job, retry_cause (the job that cancelled this one),
    # retry_workflow, pause, replace, kill, stop, stall (target: "any", or the prefix of the tags
    # of the jobs to lock one of once they all run)
    kind: str
    target: str
    seconds: float = 0.0  # pause, stop, stall: how long; kill: how long until the slot's worker restarts
    mode: str = ""  # replace: "replace" or "reschedule"

    def __str__(self) -> str:
        extra = f" {self.mode}" if self.mode else ""
        extra += f" for {self.seconds:.1f} s" if self.seconds else ""
        return f"t={self.at:5.2f} {self.kind} {self.target}{extra}"


@dataclass(frozen=True)
class WorkerSpec:
    queues: tuple[tuple[str, int], ...]

    def args(self) -> list[str]:
        return [arg for queue, concurrency in self.queues for arg in ("--queue", f"{queue}:{concurrency}")]


@dataclass
class Scenario:
    seed: int
    heavy: bool
    workers: list[WorkerSpec] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    flows: list[FlowSpec] = field(default_factory=list)
    batches: list[BatchSpec] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    duration: float = 0.0

    def jobs_by_tag(self) -> dict[str, JobSpec]:
        found = {job.tag: job for batch in self.batches for job in batch.jobs}
        found.update({member.job.tag: member.job for flow in self.flows for member in flow.members})
        return found

    def describe(self) -> str:
        lines = [f"scenario seed {self.seed} ({'heavy' if self.heavy else 'short'}, {self.duration:.0f} s)"]
        lines.append("  workers: " + "; ".join(" ".join(w.args()[1::2]) for w in self.workers) + f"; env {self.env}")
        for batch in self.batches:
            lines.append(f"  t={batch.at:5.2f} batch {batch.name}: {len(batch.jobs)} jobs")
            lines += [f"      {job.tag}: {job.short()}" for job in batch.jobs[:12]]
            if len(batch.jobs) > 12:
                lines.append(f"      … and {len(batch.jobs) - 12} more like {batch.jobs[-1].short()}")
        for flow in self.flows:
            lines.append(f"  t={flow.at:5.2f} workflow {flow.name} (on_failure {flow.on_failure}): {len(flow.members)} members")
            for member in flow.members[:12]:
                after = [flow.members[i].job.tag for i in member.after] + list(member.external)
                policy = f" on_failure={member.on_failure}" if member.on_failure else ""
                lines.append(f"      {member.job.tag}: {member.job.short()} after {after}{policy}")
            if len(flow.members) > 12:
                lines.append(f"      … and {len(flow.members) - 12} more")
        lines += [f"  {op}" for op in sorted(self.ops, key=lambda op: op.at)]
        return "\n".join(lines)
