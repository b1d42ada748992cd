"""Workflows: jobs queued together, some waiting for others to end — chains, fan-out and fan-in, dependencies.

.. code-block:: python

    flow = Workflow("publish video 42")
    scan = flow.add(scan_video, video_id=42)
    encodes = [flow.add(transcode, video_id=42, profile=p, after=[scan]) for p in ("1080p", "720p")]
    flow.add(publish, video_id=42, after=encodes)
    flow.enqueue()  # one transaction: every job, every edge, or nothing

A job that waits is ``blocked``, a status no claim takes, with ``deps_left`` counting what it
still waits for; ``db/dependencies.py`` counts each end exactly once, and the statement that
counts the last one turns it ``waiting``, due at the later of its own due time and that moment.
Every job of a workflow is kept when it finishes (its result is what its dependents read with
``ctx.dependencies()``) until the whole workflow is pruned as a unit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from django.db import IntegrityError, connections, transaction

from ..clock import now_ms
from ..conf import DEFAULT_QUEUE, get_settings
from ..db import counters, dialect_for, wakeup
from ..db.dependencies import ENDED
from ..execution import tracing
from ..handlers.registry import JobDefinition, registry
from . import _jobs, _values

if TYPE_CHECKING:
    from ..db.base import Dialect
    from ..models import Job
    from ..models import Workflow as WorkflowRow

OnFailure = Literal["cancel", "run"]
ON_FAILURE: tuple[OnFailure, ...] = ("cancel", "run")


class WorkflowError(ValueError):
    """A workflow that cannot be queued as given: a dependency on nothing, a step of another workflow."""


class Step:
    """One job of a workflow, before it is queued; ``job`` is its row once ``Workflow.enqueue()`` returned."""

    def __init__(
        self,
        flow: Workflow,
        definition: JobDefinition[..., Any],
        args: list[Any],
        kwargs: dict[str, Any],
        after: list[Step | int],
        on_failure: OnFailure,
    ) -> None:
        self.flow = flow
        self.definition = definition
        self.args = args
        self.kwargs = kwargs
        self.after = after
        self.on_failure = on_failure
        self.job: Job | None = None

    def __repr__(self) -> str:
        return f"<step {self.definition.name}{f' #{self.job.pk}' if self.job is not None else ''}>"


class Workflow:
    """Build a workflow with :meth:`add`, then queue all of it with :meth:`enqueue`.

    ``on_failure`` says what a job does when one it waits for ends dead or cancelled: ``"cancel"``
    (the default: it is cancelled, and so are the jobs waiting for it) or ``"run"`` (it runs
    anyway; ``ctx.dependencies()`` tells it how each ended). Retrying the failed job brings the
    cancelled ones back.
    """

    def __init__(self, name: str, *, on_failure: OnFailure = "cancel") -> None:
        if not isinstance(name, str) or not 0 < len(name) <= 200:
            raise ValueError("a workflow's name is a string of 1 to 200 characters")
        _check_on_failure(on_failure)
        self.name = name
        self.on_failure = on_failure
        self.steps: list[Step] = []
        self.row: WorkflowRow | None = None

    def add(
        self,
        definition: JobDefinition[..., Any],
        /,
        *args: Any,
        after: Iterable[Step | Job | int] = (),
        on_failure: OnFailure | None = None,
        **kwargs: Any,
    ) -> Step:
        """Add a job that starts once every job in ``after`` has ended (steps of this workflow, or jobs already queued).

        Its arguments are checked here, as ``enqueue()`` checks them.
        """
        if self.row is not None:
            raise WorkflowError(f"workflow {self.name!r} is already queued; build a new Workflow")
        if not isinstance(definition, JobDefinition):
            raise TypeError(f"add() takes a @job definition, not {type(definition).__name__}")
        registry.require(definition.name)
        definition.check_arguments(list(args), kwargs)
        if on_failure is not None:
            _check_on_failure(on_failure)
        upstream: list[Step | int] = []
        for item in after:
            if isinstance(item, Step):
                if item.flow is not self:
                    raise WorkflowError(f"{item!r} belongs to another workflow; pass its job (or id) once queued")
                upstream.append(item)
            elif isinstance(item, int) and not isinstance(item, bool):
                upstream.append(item)
            elif getattr(item, "pk", None) is not None:
                upstream.append(int(item.pk))  # type: ignore[union-attr]
            else:
                raise TypeError(f"after= takes steps, jobs or job ids, not {type(item).__name__}")
        step = Step(self, definition, list(args), dict(kwargs), upstream, on_failure or self.on_failure)
        self.steps.append(step)
        return step

    def chain(self, *links: tuple[JobDefinition[..., Any], dict[str, Any]]) -> list[Step]:
        """Add jobs that run one after another: ``chain((a, {"x": 1}), (b, {}))``; returns their steps."""
        steps: list[Step] = []
        for definition, kwargs in links:
            steps.append(self.add(definition, after=steps[-1:], **kwargs))
        return steps

    def enqueue(self) -> WorkflowRow:
        """Queue every job and edge in one transaction (the caller's, if one is open); returns the workflow's row.

        Nothing of it can start before that transaction commits. A job in ``after=`` that does not
        exist raises :class:`WorkflowError` and queues nothing.
        """
        from ..models import Workflow as WorkflowRow  # app loading: django_durq imports this module

        if self.row is not None:
            raise WorkflowError(f"workflow {self.name!r} is already queued")
        alias = get_settings().database
        # One span for the workflow (named by its first job's type), its context stored with every job.
        first = self.steps[0].definition if self.steps else None
        name, queue = (first.name, first.options.queue or first.queue or DEFAULT_QUEUE) if first else (self.name, DEFAULT_QUEUE)
        with tracing.enqueuing(name, queue) as traced, transaction.atomic(using=alias):
            row = WorkflowRow.objects.using(alias).create(name=self.name, created_ms=now_ms(), on_failure=self.on_failure)
            _enqueue_steps(self.steps, row.pk, alias, traced.columns)
            traced.ids += [step.job.pk for step in self.steps if step.job is not None]
        self.row = row
        return row


def _check_on_failure(value: object) -> None:
    if value not in ON_FAILURE:
        raise ValueError(f"on_failure is {value!r}; it must be one of {', '.join(ON_FAILURE)}")


def _enqueue_steps(steps: Sequence[Step], workflow_id: int, alias: str, columns: dict[str, str]) -> None:
    from ..models import Dependency, Job  # app loading: django_durq imports this module

    dialect = dialect_for(connections[alias])
    external = sorted({item for step in steps for item in step.after if isinstance(item, int)})
    found = _lock_external(external, alias)
    missing = [job_id for job_id in external if job_id not in found]
    if missing:
        raise WorkflowError(f"after= names job(s) {missing} that do not exist: a dependency must match a job")
    waited_on = Counter(id(item) for step in steps for item in step.after if isinstance(item, Step))
    edges: list[tuple[Step, Step | int]] = []
    due_queues: set[str] = set()
    now = now_ms()
    for step in steps:
        values = _values(step.definition, step.args, step.kwargs) | columns
        pending = [item for item in step.after if isinstance(item, Step) or found[item].status not in ENDED]
        ended_badly = [item for item in step.after if isinstance(item, int) and found[item].status in ("dead", "cancelled")]
        failed = ended_badly[0] if ended_badly else None
        values |= {
            "workflow_id": workflow_id,
            "deps_left": len(pending),
            "dependents": waited_on[id(step)] or None,
            "on_failure": step.on_failure if step.after else None,
        }
        if pending:
            values["status"] = "blocked"  # its own due time is kept: it runs at that time at the earliest
        if failed is not None and step.on_failure == "cancel":
            values |= {"status": "cancelled", "finished_ms": now, "cancelled_by": failed}
        job_id = _insert_member(dialect, values, alias)
        step.job = _jobs(values, [(job_id, values["arguments"])], alias)[0]
        if not pending and values["status"] == "waiting":
            due_queues.add(values["queue"])
        edges += [(step, item) for item in step.after]
    Dependency.objects.using(alias).bulk_create(
        [
            Dependency(
                job_id=step.job.pk,  # type: ignore[union-attr]
                depends_on_id=item.job.pk if isinstance(item, Step) else item,  # type: ignore[union-attr]
                settled=not isinstance(item, Step) and found[item].status in ENDED,
            )
            for step, item in edges
        ]
    )
    # Jobs queued before that now have dependents are kept when they finish, for their results.
    counts = Counter(item for _, item in edges if isinstance(item, int))
    for job_id, count in counts.items():
        Job.objects.using(alias).filter(pk=job_id).update(dependents=(found[job_id].dependents or 0) + count)
    if due_queues:
        wakeup.wake_on_commit(alias, sorted(due_queues))


def _insert_member(dialect: Dialect, values: dict[str, Any], alias: str) -> int:
    """Insert one job of a workflow (woken later, once, if due at once); a held dedupe key refuses the workflow.

    A job of a workflow is never deduplicated away: its dependents would wait for a job that is
    not theirs. To wait for a job already queued, name it in ``after=``.
    """
    counters.enqueued(alias, [(values["queue"], values["name"])])  # the workflow's transaction is open: counted at its commit
    if values["unique_key"] is None:
        return dialect.insert_job(values, notify=False)
    try:
        with transaction.atomic(using=alias):
            return dialect.insert_job(values, notify=False)
    except IntegrityError:
        raise WorkflowError(
            f"dedupe key {values['unique_key']!r} is held by an active job: a workflow's jobs are not deduplicated;"
            " name that job in after= to wait for it"
        ) from None


@dataclass
class _Found:
    status: str
    dependents: int | None


def _lock_external(ids: list[int], alias: str) -> dict[int, _Found]:
    """The jobs named by id in ``after=``, locked until the workflow commits: none can end unseen meanwhile."""
    from ..models import Job  # app loading: django_durq imports this module

    if not ids:
        return {}
    rows = Job.objects.using(alias).select_for_update().filter(pk__in=ids).values_list("pk", "status", "dependents")
    return {pk: _Found(status, dependents) for pk, status, dependents in rows}
