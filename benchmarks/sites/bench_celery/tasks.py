from celery import shared_task

from benchsite.tick import tick


@shared_task(name="bench.noop")
def noop(i=0):
    tick(i)
