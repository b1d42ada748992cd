"""Putting jobs in the queue: validate at the boundary, insert in the caller's transaction, wake on commit.

Everything that can be refused (an unknown name, a bad option, arguments the handler cannot
take or that are not JSON, a payload over the cap) is refused before any SQL runs, so a refused
enqueue leaves a caller's open transaction usable. A dedupe key that is already taken by an
active job returns that job (``job.deduplicated`` is True) instead of raising, changed first
when ``on_duplicate`` asks and it is waiting (see duplicates.py), and a race for the key never
reaches the caller as an error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, OperationalError, connections, transaction
from django.db.models import DEFERRED

from ..clock import datetime_to_ms, ms_to_datetime, now_ms, seconds_to_ms
from ..conf import DEFAULT_QUEUE, get_settings
from ..db import counters, dialect_for, wakeup
from ..exceptions import InvalidPayload
from ..execution import tracing
from ..handlers.options import KEEP, OnDuplicate
from ..handlers.payload import encode_arguments
from ..handlers.registry import JobDefinition, hand_in_enqueue, registry
from . import duplicates

if TYPE_CHECKING:
    from ..models import Job

# Models are imported inside the functions: ``import django_durq`` must not load them.


def enqueue(name: str, *args: Any, **kwargs: Any) -> Job:
    """Queue the job registered as ``name``; raises ``UnknownJobType`` for a name with no handler."""
    return registry.require(name).enqueue(*args, **kwargs)


def enqueue_one(
    definition: JobDefinition[..., Any], args: list[Any], kwargs: dict[str, Any], columns: dict[str, Any] | None = None
) -> Job:
    """Queue one job; ``columns`` sets nullable columns an enqueue otherwise leaves NULL."""
    registry.require(definition.name)
    definition.check_arguments(args, kwargs)
    values = _values(definition, args, kwargs) | (columns or {})
    alias = get_settings().database
    with tracing.enqueuing(values["name"], values["queue"]) as traced:
        values |= traced.columns
        if values["unique_key"] is None:
            job = _inserted(values, alias)
        else:
            job = _insert_unique(values, alias, definition.options.on_duplicate or KEEP)
        traced.ids.append(job.pk)
    if job.deduplicated:
        return job
    transaction.on_commit(lambda: wakeup.after_commit(alias, [job.queue], jobs=1), using=alias)
    return job


def enqueue_many(definition: JobDefinition[..., Any], items: list[dict[str, Any]]) -> list[Job]:
    registry.require(definition.name)
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidPayload(
                f"items[{index}] is {type(item).__name__}; enqueue_many takes keyword dicts", path=f"items[{index}]"
            )
        try:
            definition.check_arguments((), item)
        except TypeError as error:
            raise TypeError(f"items[{index}]: {error}") from None
    if definition.options.unique is not None:
        return [enqueue_one(definition, [], dict(item)) for item in items]
    if not items:
        return []
    from ..models import Job  # app loading: django_durq imports this module

    alias = get_settings().database
    dialect = dialect_for(connections[alias])
    # A limit keyed on the arguments gives each row its own key: rows are built one by one.
    keyed = definition.limit is not None and definition.limit.key is not None
    queue = definition.options.queue or definition.queue or DEFAULT_QUEUE
    with tracing.enqueuing(definition.name, queue) as traced:  # one span for the batch, its context stored with each job
        if keyed or not dialect.returns_bulk_insert_ids:
            rows = [Job(**(_values(definition, [], dict(item)) | traced.columns)) for item in items]
            with counters.one_transaction(alias):
                created = Job.objects.using(alias).bulk_create(rows)
                counters.enqueued(alias, [(job.queue, job.name) for job in created])
            traced.ids += [job.pk for job in created]
            wakeup.wake_on_commit(alias, sorted({job.queue for job in created}), jobs=len(created))
            return created
        # Every item shares the definition's options: build one row, vary only the arguments, and
        # insert with one statement, skipping the ORM's per-object compilation.
        values = _values(definition, [], {}) | traced.columns
        cap = get_settings().max_payload_bytes
        arguments = [encode_arguments([], item, cap) for item in items]
        with counters.one_transaction(alias):
            ids = dialect.insert_jobs({column: value for column, value in values.items() if column != "arguments"}, arguments)
            counters.enqueued(alias, [(values["queue"], values["name"])] * len(ids))
        traced.ids += ids
    created = _jobs(values, zip(ids, arguments, strict=True), alias)
    wakeup.wake_on_commit(alias, [values["queue"]], jobs=len(created))
    return created


# ``JobDefinition.enqueue()`` and ``enqueue_many()`` call these (the registry cannot import them).
hand_in_enqueue(enqueue_one, enqueue_many)


def on_commit_of(using: str, enqueue_call: Callable[[], Any]) -> None:
    """Enqueue when the transaction on ``using`` commits (for a queue that lives in another database).

    When ``DURQ["DATABASE"]`` differs from the database your data is written to, an enqueue is
    not part of your transaction; this runs it after that transaction commits, and not at all
    when it rolls back.
    """
    transaction.on_commit(enqueue_call, using=using)


def _values(definition: JobDefinition[..., Any], args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The new job's row: every column an enqueue writes; the others are NULL or computed.

    The options were validated where they were given (``@job``, ``using()``); only what needs
    the settings is checked here.
    """
    from ..models import Status  # app loading: django_durq imports this module

    settings = get_settings()
    options = definition.options
    created = now_ms()
    if options.run_at is not None:
        run_at = datetime_to_ms(options.run_at)
    elif options.run_in is not None:
        run_at = created + seconds_to_ms(options.run_in)
    else:
        run_at = created
    queue = options.queue or definition.queue or DEFAULT_QUEUE
    lease_ms = seconds_to_ms(options.lease) if options.lease is not None else definition.lease_ms or settings.lease_ms
    if options.timeout is not None:
        timeout_ms: int | None = seconds_to_ms(options.timeout)
    else:
        timeout_ms = definition.timeout_ms or settings.timeout_ms
    max_attempts = options.max_attempts or definition.max_attempts or settings.max_attempts
    priority = options.priority if options.priority is not None else definition.priority
    limit = definition.limit.columns(definition.name, args, kwargs) if definition.limit is not None else {}
    expires = _expires_ms(definition, created, run_at)
    if expires is not None:  # only a job with an expiry names the column: every other INSERT stays as it was
        limit = limit | {"expires_ms": expires}
    return limit | {
        "name": definition.name,
        "queue": queue,
        "priority": priority,
        "status": Status.WAITING.value,
        "arguments": encode_arguments(args, kwargs, settings.max_payload_bytes),
        "attempts": 0,
        "max_attempts": max_attempts,
        "run_at_ms": run_at,
        "created_ms": created,
        "lease_ms": lease_ms,
        "timeout_ms": timeout_ms,
        "unique_key": options.unique,
        "claim_token": 0,
        "claimed_by": "",
        "stop_requested": False,
        "errors": "[]",
    }


def _expires_ms(definition: JobDefinition[..., Any], created_ms: int, run_at_ms: int) -> int | None:
    """When the job is dropped if no worker has started it; ``ValueError`` if it could never start."""
    expires = definition.options.expires
    if isinstance(expires, datetime):
        expires_ms: int | None = datetime_to_ms(expires)
    elif expires is not None:
        expires_ms = created_ms + seconds_to_ms(expires)
    elif definition.expires_ms is not None:
        expires_ms = created_ms + definition.expires_ms
    else:
        return None
    if expires_ms is not None and expires_ms <= run_at_ms:
        raise ValueError(f"expires {_iso(expires_ms)} is not after the job's due time {_iso(run_at_ms)}: it could never start")
    return expires_ms


def _iso(ms: int) -> str:
    moment = ms_to_datetime(ms)
    return moment.isoformat(timespec="milliseconds") if moment is not None else str(ms)


def _jobs(values: dict[str, Any], inserted: Iterable[tuple[int, str]], alias: str) -> list[Job]:
    """The ``Job`` objects for rows just inserted: ``values`` with each (id, arguments) pair.

    Built positionally, as Django builds rows it reads: keyword construction runs every field's
    default and costs more than the INSERT itself on SQLite. Columns an enqueue leaves alone are
    NULL; ``unique_active`` (computed by the database) is deferred and read on first access.
    """
    from ..models import Job  # app loading: django_durq imports this module

    attnames = _job_attnames()
    row = [values.get(attname, DEFERRED if attname == "unique_active" else None) for attname in attnames]
    id_at, arguments_at = attnames.index("id"), attnames.index("arguments")
    jobs = []
    for job_id, arguments in inserted:
        row[id_at], row[arguments_at] = job_id, arguments
        job = Job(*row)  # type: ignore[misc]  # the stubs know only keyword construction
        job._state.adding = False
        job._state.db = alias
        jobs.append(job)
    return jobs


@cache
def _job_attnames() -> list[str]:
    from ..models import Job  # app loading: django_durq imports this module

    return [field.attname for field in Job._meta.concrete_fields]


def _insert_unique(values: dict[str, Any], alias: str, on_duplicate: OnDuplicate) -> Job:
    connection = connections[alias]
    dialect = dialect_for(connection)
    key = values["unique_key"]
    tries = 10
    for attempt in range(1, tries + 1):
        try:
            if on_duplicate == KEEP:
                job = _insert_or_find(values, alias)
            else:
                job = duplicates.insert_or_change(values, alias, on_duplicate, lambda: _inserted(values, alias))
            if job is not None:
                return job
            # The holder of the key finished between our insert and our look-up: try again.
        except OperationalError as error:
            # Retried only when the savepoint undid the insert alone; a database that rolled
            # back the caller's whole transaction (an InnoDB deadlock) leaves nothing to retry in.
            if not dialect.is_lock_error(error) or connection.needs_rollback or attempt == tries:
                raise
    raise IntegrityError(f"could not enqueue with unique key {key!r}: it keeps changing hands")


def _insert_or_find(values: dict[str, Any], alias: str) -> Job | None:
    """Insert the job, or return the active job holding its key; ``None`` when the key came free in between."""
    # The savepoint keeps a caller's transaction usable when the key turns out to be taken
    # (PostgreSQL would otherwise abort the whole transaction on the IntegrityError), and lets a
    # lock error in the race for the key be retried.
    try:
        with transaction.atomic(using=alias), dialect_for(connections[alias]).dedupe_turn(values["unique_key"]):
            return _inserted(values, alias)
    except IntegrityError:
        return duplicates.holder(values["unique_key"], alias)


def _inserted(values: dict[str, Any], alias: str) -> Job:
    return _jobs(values, [(_insert(values, alias), values["arguments"])], alias)[0]


def _insert(values: dict[str, Any], alias: str) -> int:
    """Insert one row (and, on PostgreSQL, its wake-up NOTIFY) and count it; returns its id."""
    dialect = dialect_for(connections[alias])
    with counters.one_transaction(alias):
        job_id = dialect.insert_job(values, notify=dialect.supports_notify)
        counters.enqueued(alias, [(values["queue"], values["name"])])
    return job_id
