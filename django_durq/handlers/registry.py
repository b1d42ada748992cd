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
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from ..clock import seconds_to_ms
from ..conf import DEFAULT_QUEUE
from ..exceptions import UnknownJobType
from .arguments import HandlerArguments, qualified_name
from .backoff import Backoff
from .limits import Limit
from .options import JobOptions, OnDuplicate, check_handler_options

if TYPE_CHECKING:
    from ..models import Job
    from .context import JobContext

P = ParamSpec("P")
R = TypeVar("R")

# Where a process finds its handlers: a job whose handler was not imported is unknown to it.
WHERE_HANDLERS_LIVE = (
    "handlers are registered when their module is imported: put them in an installed app's jobs.py, "
    'or list their module in DURQ["MODULES"]'
)


def unknown_job_message(name: str) -> str:
    """What a worker records for a job whose name has no handler in its process."""
    return f"unknown job type {name!r}: no handler is registered under this name in this worker; {WHERE_HANDLERS_LIVE}"


class JobDefinition(Generic[P, R]):
    """A registered handler; call ``enqueue()`` on it to queue work."""

    def __init__(
        self,
        func: Callable[Concatenate[JobContext, P], R],
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
        limit: Limit | None = None,
        expires: timedelta | float | None = None,
    ) -> None:
        check_handler_options(name, queue, priority, max_attempts, lease, timeout, backoff, cron, expires)
        if limit is not None and not isinstance(limit, Limit):
            raise TypeError(f"limit must be a django_durq.Limit, not {type(limit).__name__}")
        self.func = func
        self.arguments = HandlerArguments.of(func)
        self.is_async = inspect.iscoroutinefunction(func)
        self.name = name
        self.queue = queue
        self.priority = priority
        self.max_attempts = max_attempts
        self.lease_ms = seconds_to_ms(lease) if lease is not None else None
        self.timeout_ms = seconds_to_ms(timeout) if timeout is not None else None
        self.expires_ms = seconds_to_ms(expires) if expires is not None else None  # counted from each enqueue
        self.backoff = backoff
        self.cron = cron
        self.options = options or JobOptions()
        self.limit = limit
        self.__doc__ = func.__doc__
        self.__name__ = getattr(func, "__name__", name)
        self.__module__ = getattr(func, "__module__", "")
        self.__wrapped__ = func

    def __repr__(self) -> str:
        return f"<job {self.name}>"

    def __call__(self, ctx: JobContext, /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the handler directly (a test, or synchronous use); nothing is queued."""
        return self.func(ctx, *args, **kwargs)

    def check_arguments(self, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> None:
        """Raise ``TypeError`` naming the handler and the argument when the handler could not take these."""
        if self.arguments is not None:
            self.arguments.check(self.name, args, kwargs)

    def unfit_arguments(self, args: list[Any], kwargs: dict[str, Any]) -> str | None:
        """Why a job's stored arguments do not fit this handler's signature; None when they do.

        A job queued for another version of the handler (its signature changed since) could never
        run: the worker checks the arguments before it calls the handler, so that the job becomes a
        dead letter saying so instead of failing every attempt with a ``TypeError``.
        """
        arguments = self.arguments
        if arguments is None:
            return None
        reason = arguments.refusal(args, kwargs)
        if not reason:
            return None
        return (
            f"its stored arguments do not fit the handler {qualified_name(arguments.func)}{arguments.signature} "
            f"(after the JobContext): {reason.removeprefix('got an ')}; the job was queued for another version of the "
            "handler, and a job whose arguments change needs a new name (see the rolling deploys guide)"
        )

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
        on_duplicate: OnDuplicate | None = None,
        expires: timedelta | float | datetime | None = None,
    ) -> JobDefinition[P, R]:
        """A copy of this definition whose next ``enqueue()`` uses these options; a bad option raises here.

        ``expires`` (a duration from the enqueue, or an aware datetime) drops the job if no worker
        has started it by then: it ends ``cancelled`` and never runs (docs/jobs.md, "Expiry").

        ``on_duplicate`` says what an enqueue whose ``unique`` key is held by a *waiting* job
        does: ``"keep"`` (the default) leaves that job as it is, ``"replace"`` gives it this
        enqueue's arguments, priority and due time, ``"reschedule"`` only its due time. A job
        already running is never changed; the enqueue returns it, as with ``"keep"``.
        """
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
                "on_duplicate": on_duplicate,
                "expires": expires,
            }.items()
            if value is not None
        }
        # A due time given here replaces one given to an earlier using(), whichever kind it was.
        if run_at is not None:
            changes["run_in"] = None
        if run_in is not None:
            changes["run_at"] = None
        options = dataclasses.replace(self.options, **changes)
        clone: JobDefinition[P, R] = object.__new__(JobDefinition)
        clone.__dict__.update(self.__dict__)
        clone.options = options
        return clone

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Queue one run; returns the ``Job`` (an existing one when its dedupe key was taken)."""
        return _enqueue["one"](self, list(args), kwargs)

    def enqueue_many(self, items: Iterable[dict[str, Any]]) -> list[Job]:
        """Queue one run per keyword dict in one INSERT.

        With ``using(unique=...)`` every item shares that one key, so the first is queued and the
        others return it (or, with ``on_duplicate``, change it in turn); to dedupe items
        separately, enqueue each with its own key.
        """
        return _enqueue["many"](self, list(items))


# The functions behind ``JobDefinition.enqueue()`` and ``enqueue_many()``: the registry is vocabulary
# and cannot import the operations layer, so ``enqueue/`` hands them in as it loads (and
# ``django_durq/__init__.py`` imports it, so they are in before any handler can be registered).
_enqueue: dict[str, Callable[..., Any]] = {}


def hand_in_enqueue(one: Callable[..., Any], many: Callable[..., Any]) -> None:
    _enqueue.update(one=one, many=many)


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
            raise UnknownJobType(f"no job is registered under the name {name!r}{hint}; {WHERE_HANDLERS_LIVE}")
        return definition

    def all(self) -> list[JobDefinition]:
        return sorted(self._definitions.values(), key=lambda d: d.name)

    def queues(self) -> set[str]:
        return {d.queue or DEFAULT_QUEUE for d in self._definitions.values()}


def _origin(func: Callable[..., Any]) -> tuple[str, str]:
    return (getattr(func, "__module__", ""), getattr(func, "__qualname__", ""))


registry = Registry()


@overload
def job(func: Callable[Concatenate[JobContext, P], R], /) -> JobDefinition[P, R]: ...


@overload
def job(
    *,
    name: str | None = None,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    lease: timedelta | float | None = None,
    timeout: timedelta | float | None = None,
    backoff: Backoff | None = None,
    cron: str | None = None,
    limit: Limit | None = None,
    expires: timedelta | float | None = None,
) -> Callable[[Callable[Concatenate[JobContext, P], R]], JobDefinition[P, R]]: ...


def job(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    lease: timedelta | float | None = None,
    timeout: timedelta | float | None = None,
    backoff: Backoff | None = None,
    cron: str | None = None,
    limit: Limit | None = None,
    expires: timedelta | float | None = None,
) -> Any:
    """Register a handler. The handler receives a ``JobContext`` first, then the job's arguments.

    ``name`` defaults to the dotted path ``module.function``; set it so that renaming the
    function does not orphan jobs already queued. ``lease`` and ``timeout`` are timedeltas or
    seconds. ``limit`` (a :class:`~django_durq.handlers.limits.Limit`) caps how many of its jobs run at
    once or start per period, across every worker. ``expires`` (a duration) drops each of its jobs
    that no worker started that long after its enqueue. A bad option, or a handler that cannot
    take the context first, raises here.
    """

    def register(function: Callable[..., Any]) -> JobDefinition[..., Any]:
        definition: JobDefinition[..., Any] = JobDefinition(
            function,
            name=name if name is not None else f"{function.__module__}.{function.__qualname__}",
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            lease=lease,
            timeout=timeout,
            backoff=backoff,
            cron=cron,
            limit=limit,
            expires=expires,
        )
        registry.add(definition)
        return definition

    if func is not None:
        return register(func)
    return register
