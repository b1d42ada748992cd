"""Django @task functions used by tests/tasks/test_backend.py; discovered like any app's tasks.py."""

import asyncio
import os
import time

from django_durq.clock import now_ms
from django_durq.tasks.backend import durq_options

from .models import Effect

try:  # Django >= 6.0
    from django.tasks import task
    from django.tasks.signals import task_finished, task_started
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import task
    from django_tasks.signals import task_finished, task_started


@task
def add(a, b):
    return a + b


@task
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@durq_options(max_attempts=2)
@task
def fail(message="boom"):
    raise ValueError(message)


@durq_options(max_attempts=4)
@task(queue_name="fast", priority=7)
def fast_add(a, b):
    return a + b


@task(takes_context=True)
def flaky(context, succeed_on=2):
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt


@task
async def async_add(a, b):
    await asyncio.sleep(0)
    return a + b


@task(takes_context=True)
def record(context, tag):
    Effect.objects.create(
        job_id=int(context.task_result.id.split("-")[0]), token=context.attempt, pid=os.getpid(), started_ms=now_ms(), tag=tag
    )
    return tag


@task(takes_context=True)
def inspect_context(context):
    stored = context.task_result.task.get_backend().get_result(context.task_result.id)
    return {
        "context": type(context).__name__,
        "id": context.task_result.id,
        "attempt": context.attempt,
        "status": context.task_result.status,
        "stored_status": stored.status,
        "worker_ids": context.task_result.worker_ids,
        "heartbeat": context.heartbeat(),
        "should_stop": context.should_stop(),
        "is_last_attempt": context.is_last_attempt(),
        "progress": context.progress(1, 2),
    }


@task(takes_context=True)
async def async_context(context, value):
    return {"heartbeat": await context.aheartbeat(), "attempt": context.attempt, "value": value}


@durq_options(max_attempts=1)
@task
def returns_a_set():
    return {1, 2}


@task
def wait_for_file(path, cap_s=60.0):
    deadline = time.monotonic() + cap_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)
    return "released"


def _one_shot():
    raise RuntimeError("no second chance")


try:  # Django 6.1 (and the backport) pass extra @task keyword arguments to the backend's task_class
    one_shot = task(max_attempts=1)(_one_shot)
except TypeError:  # Django 6.0
    one_shot = None


# A worker started with DURQ_TEST_RECORD_TASK_SIGNALS=1 writes one Effect per task signal, so a
# test can see which signals the worker process sent, with which status.
if os.environ.get("DURQ_TEST_RECORD_TASK_SIGNALS"):

    def _record(name):
        def receiver(sender, task_result, **kwargs):
            Effect.objects.create(
                job_id=int(task_result.id.split("-")[0]),
                token=len(task_result.worker_ids),
                pid=os.getpid(),
                started_ms=now_ms(),
                tag=f"{name}:{task_result.status!s}",
            )

        return receiver

    def _record_exc_info(sender, task_result, **kwargs):
        import sys

        kind = sys.exc_info()[0]
        Effect.objects.create(
            job_id=int(task_result.id.split("-")[0]),
            token=0,
            pid=os.getpid(),
            started_ms=now_ms(),
            tag=f"finished-exc:{kind.__name__ if kind is not None else None}",
        )

    task_started.connect(_record("started"), weak=False)
    task_finished.connect(_record("finished"), weak=False)
    task_finished.connect(_record_exc_info, weak=False)
