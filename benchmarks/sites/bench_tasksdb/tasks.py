from benchsite.tick import tick
from django.tasks import task


@task
def noop(i=0):
    tick(i)
