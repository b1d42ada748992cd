"""Operating the queue: dead letters and recent jobs, retry, purge, cancel, pause and resume, stats, limits, workflows.

The admin actions, the ``durq`` management command and the monitoring views are thin callers of
these functions. Everything takes ``now_ms`` where time matters, uses the ORM only, and works in
batches of ids so that no statement holds locks on a large part of the table. One module per
concern: :mod:`.reading`, :mod:`.stats`, :mod:`.acting`, :mod:`.pausing`, :mod:`.limits`, :mod:`.workflows`,
:mod:`.formatting`, :mod:`.orphans`, :mod:`.totals`; their public names are all here.
"""

from .acting import RETRYABLE, CancelResult, RetryResult, Selection, cancel, purge, retry, retry_failed
from .formatting import format_age, local_time
from .limits import KeyAtLimit, LimitUsage, limit_usage
from .orphans import Orphan, ended_workers, orphaned
from .pausing import QueueSwitch, pause, paused_queues, queue_switches, resume
from .reading import ENDED, LIVE_HEARTBEATS, failed, jobs_by_id, live_workers, queue_names, recent, worker_queues
from .stats import Bucket, QueueStats, due_jobs, health, stats, throughput, unserved
from .totals import Histogram, Totals, totals
from .workflows import (
    Edge,
    NoSuchWorkflow,
    WorkflowDetail,
    WorkflowSummary,
    cancel_workflow,
    retry_workflow,
    workflow,
    workflow_state,
    workflows,
)

__all__ = [
    "ENDED",
    "LIVE_HEARTBEATS",
    "RETRYABLE",
    "Bucket",
    "CancelResult",
    "Edge",
    "Histogram",
    "KeyAtLimit",
    "LimitUsage",
    "NoSuchWorkflow",
    "Orphan",
    "QueueStats",
    "QueueSwitch",
    "RetryResult",
    "Selection",
    "Totals",
    "WorkflowDetail",
    "WorkflowSummary",
    "cancel",
    "cancel_workflow",
    "due_jobs",
    "ended_workers",
    "failed",
    "format_age",
    "health",
    "jobs_by_id",
    "limit_usage",
    "live_workers",
    "local_time",
    "orphaned",
    "pause",
    "paused_queues",
    "purge",
    "queue_names",
    "queue_switches",
    "recent",
    "resume",
    "retry",
    "retry_failed",
    "retry_workflow",
    "stats",
    "throughput",
    "totals",
    "unserved",
    "worker_queues",
    "workflow",
    "workflow_state",
    "workflows",
]
