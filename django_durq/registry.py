"""The ``@job`` decorator and the name -> handler registry.

A handler is found only by looking its name up here; a name stored in the database is never
imported as a dotted path, so a row cannot make a worker run arbitrary code.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .backoff import Backoff
from .clock import seconds_to_ms
from .exceptions import UnknownJobType

if TYPE_CHECKING:
    from .models import Job


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """Per-enqueue options; ``None`` means "the definition's (or the settings') default"."""

    queue: str | None = None
    priority: int | None = None
    unique: str | None = None
    run_at: datetime | None = None
    run_in: timedelta | float | None = None
    max_attempts: int | None = None
    lease: timedelta | float | None = None
    timeout: timedelta | float | None = None


class JobDefinition:
    """A registered handler; call ``enqueue()`` on it to queue work."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        name: str,
        queue: str | None,
        priority: int,
        max_attempts: int | None,
        lease: timedelta | float | None,
        timeout: timedelta | float | None,
        backoff: Backoff | None,
        cron: str | None,
        options: JobOptions | None = None,
    ) -> None:
        self.func = func
        self.is_async = inspect.iscoroutinefunction(func)
        self.name = name
        self.queue = queue
        self.priority = priority
        self.max_attempts = max_attempts
        self.lease_ms = seconds_to_ms(lease) if lease is not None else None
        self.timeout_ms = seconds_to_ms(timeout) if timeout is not None else None
        self.backoff = backoff
        self.cron = cron
        self.options = options or JobOptions()
        self.__doc__ = func.__doc__
        self.__name__ = getattr(func, "__name__", name)
        self.__module__ = getattr(func, "__module__", "")
        self.__wrapped__ = func

    def __repr__(self) -> str:
        return f"<job {self.name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the handler directly (a test, or synchronous use); nothing is queued."""
        return self.func(*args, **kwargs)

    def using(
        self,
        *,
        queue: str | None = None,
        priority: int | None = None,
        unique: str | None = None,
        run_at: datetime | None = None,
        run_in: timedelta | float | None = None,
        max_attempts: int | None = None,
        lease: timedelta | float | None = None,
        timeout: timedelta | float | None = None,
    ) -> JobDefinition:
        """A copy of this definition whose next ``enqueue()`` uses these options."""
        if run_at is not None and run_in is not None:
            raise ValueError("pass run_at or run_in, not both")
        changes: dict[str, Any] = {
            key: value
            for key, value in {
                "queue": queue,
                "priority": priority,
                "unique": unique,
                "run_at": run_at,
                "run_in": run_in,
                "max_attempts": max_attempts,
                "lease": lease,
                "timeout": timeout,
            }.items()
            if value is not None
        }
        clone = object.__new__(JobDefinition)
        clone.__dict__.update(self.__dict__)
        clone.options = dataclasses.replace(self.options, **changes)
        return clone

    def enqueue(self, *args: Any, **kwargs: Any) -> Job:
        """Queue one run; returns the ``Job`` (an existing one when its dedupe key was taken)."""
        from .enqueue import enqueue_one

        return enqueue_one(self, list(args), kwargs)

    def enqueue_many(self, items: Iterable[dict[str, Any]]) -> list[Job]:
        """Queue one run per keyword dict in one INSERT.

        With ``using(unique=...)`` every item shares that one key, so the first is queued and the
        others return it; to dedupe items separately, enqueue each with its own key.
        """
        from .enqueue import enqueue_many

        return enqueue_many(self, list(items))


class Registry:
    def __init__(self) -> None:
        self._definitions: dict[str, JobDefinition] = {}
        self._lock = threading.Lock()

    def add(self, definition: JobDefinition) -> None:
        with self._lock:
            existing = self._definitions.get(definition.name)
            # Re-importing a module re-registers the same function under the same name: allowed.
            if (
                existing is not None
                and existing.func is not definition.func
                and _origin(existing.func) != _origin(definition.func)
            ):
                raise ValueError(f"job name {definition.name!r} is already used by {existing.func!r}")
            self._definitions[definition.name] = definition

    def remove(self, name: str) -> None:
        with self._lock:
            self._definitions.pop(name, None)

    def get(self, name: str) -> JobDefinition | None:
        return self._definitions.get(name)

    def require(self, name: str) -> JobDefinition:
        definition = self._definitions.get(name)
        if definition is None:
            close = difflib.get_close_matches(name, list(self._definitions), n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise UnknownJobType(f"no job is registered under the name {name!r}{hint}")
        return definition

    def all(self) -> list[JobDefinition]:
        return sorted(self._definitions.values(), key=lambda d: d.name)

    def queues(self) -> set[str]:
        from .conf import DEFAULT_QUEUE

        return {d.queue or DEFAULT_QUEUE for d in self._definitions.values()}


def _origin(func: Callable[..., Any]) -> tuple[str, str]:
    return (getattr(func, "__module__", ""), getattr(func, "__qualname__", ""))


registry = Registry()


def job(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    lease: timedelta | float | None = None,
    timeout: timedelta | float | None = None,
    backoff: Backoff | None = None,
    cron: str | None = None,
) -> Any:
    """Register a handler. The handler receives a ``JobContext`` first, then the job's arguments.

    ``name`` defaults to the dotted path ``module.function``; set it so that renaming the
    function does not orphan jobs already queued. ``lease`` and ``timeout`` are timedeltas or
    seconds.
    """

    def register(function: Callable[..., Any]) -> JobDefinition:
        definition = JobDefinition(
            function,
            name=name or f"{function.__module__}.{function.__qualname__}",
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            lease=lease,
            timeout=timeout,
            backoff=backoff,
            cron=cron,
        )
        registry.add(definition)
        return definition

    if func is not None:
        return register(func)
    return register
