"""django-durq: a durable job queue that lives in your Django database.

Public API: ``job`` (decorator), ``enqueue``, ``JobContext``, ``Retry``, ``Abort``,
``InvalidPayload``, ``UnknownJobType``, ``exclusivity``. Importing this package loads no model.
"""

from typing import Any

from .context import JobContext
from .exceptions import Abort, DurqError, InvalidPayload, LeaseLost, Retry, UnknownJobType
from .registry import JobDefinition, job

__version__ = "0.1.0"

__all__ = [
    "Abort",
    "DurqError",
    "InvalidPayload",
    "JobContext",
    "JobDefinition",
    "LeaseLost",
    "Retry",
    "UnknownJobType",
    "enqueue",
    "exclusivity",
    "job",
]


def enqueue(name: str, *args: Any, **kwargs: Any) -> Any:
    """Queue the job registered as ``name`` (``UnknownJobType`` if none is)."""
    from .enqueue import enqueue as enqueue_by_name

    return enqueue_by_name(name, *args, **kwargs)


def exclusivity(alias: str | None = None) -> str:
    """Which claimers the queue's database keeps apart, in plain words."""
    from .db import exclusivity as database_exclusivity

    return database_exclusivity(alias)
