from benchsite.tick import tick
from celery import shared_task


@shared_task(name="bench.noop")
def noop(i=0):
    tick(i)
